"""The engine's configuration, under its old name: :mod:`voxcast.engine.config` holds it.

Kept so that ``from voxcast.config import EngineConfig`` (scripts, tests, users' code) goes on working;
new code imports ``voxcast.EngineConfig`` or :mod:`voxcast.engine.config`.
"""

from voxcast.engine.config import (
    DEFAULT_CHUNK_FRAMES,
    DEFAULT_FIRST_CHUNK_FRAMES,
    DEFAULT_MAX_FRAMES_CAP,
    DEFAULT_MODEL,
    DEFAULT_PIECE_CHARS,
    FRAMES_PER_CHAR,
    MIN_FRAMES,
    EngineConfig,
    max_frames_for_text,
)

__all__ = [
    "DEFAULT_CHUNK_FRAMES",
    "DEFAULT_FIRST_CHUNK_FRAMES",
    "DEFAULT_MAX_FRAMES_CAP",
    "DEFAULT_MODEL",
    "DEFAULT_PIECE_CHARS",
    "FRAMES_PER_CHAR",
    "MIN_FRAMES",
    "EngineConfig",
    "max_frames_for_text",
]
