"""Chatterbox Turbo as a model family of :mod:`voxcast.models.registry`."""

from __future__ import annotations

from pathlib import Path

from voxcast.models.base import LoadOptions, TTSModel
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo

__all__ = ["load"]


def load(root: Path, options: LoadOptions) -> TTSModel:
    """Load the Chatterbox Turbo checkpoint in ``root`` with ``options``."""
    model: TTSModel = ChatterboxTurbo.from_pretrained(root, options)
    return model
