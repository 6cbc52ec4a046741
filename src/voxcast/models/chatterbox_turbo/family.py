"""Chatterbox Turbo as a model family of :mod:`voxcast.models.registry`: its loader, its streaming
settings (``VOXCAST_TURBO_*``) and its test checkpoints. Imports the model only when a checkpoint
is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from voxcast.models.family import ModelFamily, Setting, TestCheckpoints, int_in, on_off_auto

if TYPE_CHECKING:
    from voxcast.models.base import LoadOptions, TTSModel

__all__ = ["FAMILY", "load"]


def load(root: Path, options: LoadOptions) -> TTSModel:
    """Load the Chatterbox Turbo checkpoint in ``root`` with ``options``."""
    from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo

    model: TTSModel = ChatterboxTurbo.from_pretrained(root, options)
    return model


SETTINGS = (
    Setting("turbo_first_tokens", "VOXCAST_TURBO_FIRST_TOKENS", int_in(1, 500),
            doc="tokens in the first S3Gen chunk (default 8)"),
    Setting("turbo_chunk_tokens", "VOXCAST_TURBO_CHUNK_TOKENS", int_in(1, 1000),
            doc="later chunks double from the first up to this (default 32)"),
    Setting("turbo_left_tokens", "VOXCAST_TURBO_LEFT_TOKENS", int_in(0, 1000),
            doc="tokens of left context in each flow window (default 16)"),
    Setting("turbo_right_tokens", "VOXCAST_TURBO_RIGHT_TOKENS", int_in(0, 100),
            doc="look-ahead tokens in each flow window (default 4)"),
    Setting("turbo_prompt_tokens", "VOXCAST_TURBO_PROMPT_TOKENS", int_in(0, 1000),
            doc="keep only the last N tokens of a voice's S3Gen prompt (default 0: all)"),
    Setting("turbo_prompt_cache", "VOXCAST_TURBO_PROMPT_CACHE", on_off_auto,
            doc="compute a voice's S3Gen prompt once per voice, only new rows per window (default on)"),
    Setting("turbo_batch_windows", "VOXCAST_TURBO_BATCH_WINDOWS", on_off_auto,
            doc="the decode stage runs the S3Gen flow windows of every stream with one ready in one batched "
                "call (default auto = on on CUDA, off on a CPU)"),
    Setting("turbo_static_decode", "VOXCAST_TURBO_STATIC_DECODE", on_off_auto,
            doc="T3 decodes with a static key/value cache, batched, a CUDA graph per batch bucket on CUDA "
                "(default auto = off until measured on a GPU)"),
)  # fmt: skip

FAMILY = ModelFamily(
    name="chatterbox_turbo",
    load=load,
    settings=SETTINGS,
    markers=("t3_turbo_v1.safetensors",),
    test_checkpoints=TestCheckpoints(
        kinds=("chatterbox_turbo",),
        sizes=("tiny", "full"),
        builder="voxcast.testing.chatterbox_turbo_layout:make_test_checkpoint",
        sources=("voxcast.testing.chatterbox_turbo", "voxcast.testing.chatterbox_turbo_layout"),
    ),
)
