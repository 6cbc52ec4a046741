"""Model families by checkpoint: the one place that maps a checkpoint to the package that runs it.

The family is read from the checkpoint's ``config.json`` (``model_type``), or, for layouts that ship
no config (Chatterbox Turbo), from the files that mark them (:attr:`ModelFamily.markers`). A family is
a module defining ``FAMILY`` (:class:`~voxcast.models.family.ModelFamily`); its descriptor is light
and its model code is imported only when a checkpoint of that family is loaded, so the engine never
imports a concrete model.

Families outside voxcast (a plug-in, a test's toy family) are added with :func:`register`, or, for a
whole process (a server, a worker), by naming their modules in ``VOXCAST_FAMILIES``
(comma-separated; ``EngineConfig.from_env`` registers them).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxcast.errors import CheckpointError
from voxcast.models.family import ModelFamily, Setting
from voxcast.models.hub import resolve_checkpoint

if TYPE_CHECKING:
    from voxcast.models.base import LoadOptions, TTSModel

__all__ = [
    "FAMILIES",
    "FAMILIES_ENV",
    "check_settings",
    "families",
    "family",
    "family_of",
    "load_model",
    "register",
    "register_from_env",
    "settings_from_env",
]

FAMILIES: dict[str, str] = {
    "qwen3_tts": "voxcast.models.qwen3_tts.family",
    "chatterbox_turbo": "voxcast.models.chatterbox_turbo.family",
}
"""``config.json`` ``model_type`` -> the module whose ``FAMILY`` describes that family."""

FAMILIES_ENV = "VOXCAST_FAMILIES"
"""Modules of more families to register (comma-separated), for processes started with it set."""


def register(module: str) -> ModelFamily:
    """Add the family that module ``module`` defines (its ``FAMILY``); registering it again is a no-op.

    Raises:
        ValueError: the module cannot be imported or defines no ``FAMILY``, or its name is taken by
            another module.
    """
    try:
        found = getattr(importlib.import_module(module), "FAMILY", None)
    except ImportError as e:
        raise ValueError(f"{FAMILIES_ENV}: model family module {module!r} cannot be imported ({e})") from e
    if not isinstance(found, ModelFamily):
        raise ValueError(f"{FAMILIES_ENV}: module {module!r} defines no FAMILY (a ModelFamily)")
    known = FAMILIES.get(found.name)
    if known is not None and known != module:
        raise ValueError(f"{FAMILIES_ENV}: model family {found.name!r} is already served by {known}")
    FAMILIES[found.name] = module
    return found


def register_from_env(env: Mapping[str, str]) -> tuple[str, ...]:
    """Register the families whose modules ``env`` names in ``VOXCAST_FAMILIES``; returns the modules.

    Raises:
        ValueError: as :func:`register`.
    """
    modules = tuple(m.strip() for m in env.get(FAMILIES_ENV, "").split(",") if m.strip())
    for module in modules:
        register(module)
    return modules


def family(name: str) -> ModelFamily:
    """The registered family ``name`` (its descriptor; no model code is imported)."""
    found: ModelFamily = importlib.import_module(FAMILIES[name]).FAMILY
    return found


def families() -> list[ModelFamily]:
    """Every registered family."""
    return [family(name) for name in FAMILIES]


def _settings() -> dict[str, Setting]:
    return {s.name: s for f in families() for s in f.settings}


def settings_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The registered families' settings set in ``env`` (by setting name), checked.

    Raises:
        ValueError: a malformed value, naming its variable.
    """
    found = {}
    for s in _settings().values():
        raw = env.get(s.env, "").strip()
        if raw:
            found[s.name] = s.check(raw)
    return found


def check_settings(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` family settings (by name) checked.

    Raises:
        ValueError: a name no registered family declares, or a value its family refuses.
    """
    known = _settings()
    out = {}
    for name, value in given.items():
        if name not in known:
            raise ValueError(f"settings: {name!r} is no model family's setting (known: {', '.join(known)})")
        out[name] = known[name].check(value)
    return out


def family_of(root: Path) -> str:
    """The family of the checkpoint directory ``root``.

    Raises:
        CheckpointError: no readable ``config.json``, or a model type no family serves.
    """
    config = root / "config.json"
    if not config.is_file():
        for f in families():
            if any((root / marker).is_file() for marker in f.markers):
                return f.name
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
    """Load a checkpoint directory or hub id with the family its ``config.json`` names; the family
    gets its own settings of ``options.settings``, checked, with its defaults filled.

    Raises:
        CheckpointError: not found, unknown family, or files the family cannot load.
        ValueError: a setting the family refuses (naming its variable).
    """
    root = resolve_checkpoint(name_or_path)
    fam = family(family_of(root))
    own = tuple(fam.resolve(dict(options.settings)).items())
    model: TTSModel = fam.load(root, dataclasses.replace(options, settings=own))
    return model
