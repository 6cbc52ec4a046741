"""voxcast: streaming neural text-to-speech serving.

The public surface is small: build an :class:`EngineConfig`, load an :class:`Engine`, and iterate
``engine.synthesize(request)``: nothing runs until you iterate.
"""

from voxcast.errors import (
    Cancelled,
    CheckpointError,
    EngineUnavailable,
    InvalidRequest,
    StorageError,
    VoiceNotFound,
    VoxcastError,
)

__all__ = [
    "Cancelled",
    "CheckpointError",
    "EngineUnavailable",
    "InvalidRequest",
    "StorageError",
    "VoiceNotFound",
    "VoxcastError",
]
__version__ = "0.1.0"
