"""Voice registry: reference audio -> content-hashed voice id -> persisted, LRU-cached voice prompt."""

from voxcast.lru import ByteLRU
from voxcast.voices.registry import (
    DEFAULT_CACHE_BYTES,
    Registration,
    SerializableVoicePrompt,
    VoiceInfo,
    VoiceRegistry,
)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "ByteLRU",
    "Registration",
    "SerializableVoicePrompt",
    "VoiceInfo",
    "VoiceRegistry",
]
