"""Rendered-audio cache: deterministic requests keyed by content, filled create-once, read as a stream."""

from voxcast.cache.audio import CONTENT_TYPES, AudioCache, CachedAudio, CachedStream

__all__ = ["CONTENT_TYPES", "AudioCache", "CachedAudio", "CachedStream"]
