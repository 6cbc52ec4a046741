"""Model families by checkpoint: the one place that maps a checkpoint to the package that runs it.

The family is read from the checkpoint's ``config.json`` (``model_type``), or, for layouts that ship
no config (Chatterbox Turbo), from the files that mark them; the package is imported only when a
checkpoint of that family is loaded, so the engine never imports a concrete model.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from voxcast.errors import CheckpointError
from voxcast.models.base import LoadOptions, TTSModel
from voxcast.models.hub import resolve_checkpoint

__all__ = ["FAMILIES", "family_of", "load_model"]

FAMILIES: dict[str, str] = {
    "qwen3_tts": "voxcast.models.qwen3_tts.family",
    "chatterbox_turbo": "voxcast.models.chatterbox_turbo.family",
}
"""``config.json`` ``model_type`` -> the module whose ``load(root, options)`` loads that family."""

MARKERS: dict[str, str] = {"t3_turbo_v1.safetensors": "chatterbox_turbo"}
"""A file of a layout that ships no ``config.json`` -> its family."""


def family_of(root: Path) -> str:
    """The family of the checkpoint directory ``root``.

    Raises:
        CheckpointError: no readable ``config.json``, or a model type no family serves.
    """
    config = root / "config.json"
    if not config.is_file():
        for marker, family in MARKERS.items():
            if (root / marker).is_file():
                return family
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{root}: no readable config.json ({e})") from e
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{root}: model_type {model_type!r} is not served by voxcast (known: {', '.join(FAMILIES)})"
        )
    return str(model_type)


def load_model(name_or_path: str, options: LoadOptions) -> TTSModel:
    """Load a checkpoint directory or hub id with the family its ``config.json`` names.

    Raises:
        CheckpointError: not found, unknown family, or files the family cannot load.
    """
    root = resolve_checkpoint(name_or_path)
    module = importlib.import_module(FAMILIES[family_of(root)])
    model: TTSModel = module.load(root, options)
    return model
