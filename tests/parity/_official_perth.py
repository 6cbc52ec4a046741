"""The official ``PerthImplicitWatermarker`` of resemble-perth 1.0.1, for the parity tests.

``perth`` cannot import in voxcast's stack: ``perth_net/__init__`` needs ``pkg_resources`` (gone from
setuptools 81 on) and ``audio_processor`` needs ``torchaudio.transforms``, whose package loads a binary
that does not run beside a CPU torch 2.13. For the time of the import a ``pkg_resources`` stand-in
answers ``resource_filename`` with the package's own folder, and ``torchaudio.transforms`` is a module
holding torchaudio's own ``Spectrogram`` and ``InverseSpectrogram`` classes and the ``spectrogram`` /
``inverse_spectrogram`` functions they call, compiled from the installed torchaudio's source files
(pure Python over ``torch.stft``); ``TimeStretch``, built but never called by the watermarker, is a
module with its buffer. Everything else (librosa's resampling, the nets, the normalisation) is the
official code as installed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import math
import sys
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.parity._modules import swapped_modules

__all__ = ["official_watermarker"]

_TRANSFORMS = ("Spectrogram", "InverseSpectrogram")
_FUNCTIONS = ("spectrogram", "inverse_spectrogram", "_get_spec_norms")


def _source_defs(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> bool:
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    if {n.name for n in body} != set(names):
        return False
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return True


class _TimeStretch(nn.Module):
    def __init__(self, n_freq: int, hop_length: int) -> None:
        super().__init__()
        phase_advance = torch.linspace(0, math.pi * hop_length, n_freq)[..., None]
        self.register_buffer("phase_advance", phase_advance)


def _torchaudio_transforms() -> types.ModuleType | None:
    spec = importlib.machinery.PathFinder.find_spec("torchaudio")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    from typing import Optional, Union

    functional: dict[str, Any] = {
        "torch": torch,
        "Tensor": torch.Tensor,
        "Optional": Optional,
        "Union": Union,
        "Tuple": tuple,
        "warnings": warnings,
    }
    if not _source_defs(root / "functional" / "functional.py", _FUNCTIONS, functional):
        return None
    transforms: dict[str, Any] = {
        "torch": torch,
        "Tensor": torch.Tensor,
        "Optional": Optional,
        "Union": Union,
        "Callable": Callable,
        "warnings": warnings,
        "F": types.SimpleNamespace(**{k: functional[k] for k in _FUNCTIONS}),
    }
    if not _source_defs(root / "transforms" / "_transforms.py", _TRANSFORMS, transforms):
        return None
    mod = types.ModuleType("torchaudio.transforms")
    for name in _TRANSFORMS:
        setattr(mod, name, transforms[name])
    mod.TimeStretch = _TimeStretch  # type: ignore[attr-defined]
    return mod


def _import_perth() -> Any:
    """``perth.perth_net.perth_net_implicit.perth_watermarker``, or None when resemble-perth,
    librosa or torchaudio's sources are not installed."""
    name = "perth.perth_net.perth_net_implicit.perth_watermarker"
    if name in sys.modules:
        return sys.modules[name]
    if importlib.util.find_spec("perth") is None or importlib.util.find_spec("librosa") is None:
        return None
    transforms = _torchaudio_transforms()
    if transforms is None:
        return None
    pkg_resources = types.ModuleType("pkg_resources")

    def resource_filename(package: str, resource: str) -> str:
        found = importlib.util.find_spec(package)
        assert found is not None and found.submodule_search_locations
        return str(Path(next(iter(found.submodule_search_locations))) / resource)

    pkg_resources.resource_filename = resource_filename  # type: ignore[attr-defined]
    torchaudio = types.ModuleType("torchaudio")
    torchaudio.transforms = transforms  # type: ignore[attr-defined]
    stand_ins = {
        "pkg_resources": pkg_resources,
        "torchaudio": torchaudio,
        "torchaudio.transforms": transforms,
    }
    for k in ("perth", *[m for m in sys.modules if m.startswith("perth.")]):
        sys.modules.pop(k, None)  # a perth imported without the stand-ins lacks the watermarker
    with swapped_modules(stand_ins):
        return importlib.import_module(name)


def official_watermarker() -> Any:
    """The official ``PerthImplicitWatermarker()`` with its packaged weights, or None (skip)."""
    mod = _import_perth()
    if mod is None:
        return None
    import contextlib

    with contextlib.redirect_stdout(None), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mod.PerthImplicitWatermarker(device="cpu")
