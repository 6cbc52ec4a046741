"""The official CAMPPlus of chatterbox-tts 0.1.7 and ``torchaudio.compliance.kaldi``, for parity tests.

``chatterbox/models/s3gen/xvector.py`` imports ``torchaudio.compliance.kaldi``. PyPI's torchaudio
(installed ``--no-deps``) is a CUDA build whose ``.so`` cannot load beside a CPU torch, so
``import torchaudio`` fails; its ``compliance/kaldi.py`` is pure Python (it reads ``torchaudio`` only
for ``mfcc``'s DCT). It is loaded by file path while stub ``torchaudio`` and ``torchaudio.compliance``
modules stand in ``sys.modules``; the previous entries (absent, or another helper's stubs) come back
after, so nothing else sees the stubs. A torchaudio that does import is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import torch

from tests.parity._modules import swapped_modules
from tests.parity._official_chatterbox import import_chatterbox

__all__ = ["import_official_xvector", "official_campplus", "official_kaldi"]

_KALDI: list[types.ModuleType] = []


def _stub(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return mod


def _load_kaldi() -> types.ModuleType | None:
    before = set(sys.modules)
    try:
        real = importlib.import_module("torchaudio.compliance.kaldi")
        if hasattr(real, "fbank"):
            return real
    except Exception:  # the CUDA-only build raises OSError, leaving some submodules imported
        for name in set(sys.modules) - before:
            if name.startswith("torchaudio"):
                del sys.modules[name]
    # PathFinder searches sys.path, past any stub another helper left in sys.modules
    spec = importlib.machinery.PathFinder.find_spec("torchaudio")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "compliance" / "kaldi.py"
    file_spec = importlib.util.spec_from_file_location("torchaudio.compliance.kaldi", path)
    if not path.is_file() or file_spec is None or file_spec.loader is None:
        return None
    kaldi = importlib.util.module_from_spec(file_spec)
    with swapped_modules({"torchaudio": _stub("torchaudio")}):
        file_spec.loader.exec_module(kaldi)
    return kaldi


def official_kaldi() -> types.ModuleType | None:
    """torchaudio's ``compliance.kaldi`` module; None when torchaudio is not installed."""
    if not _KALDI:
        kaldi = _load_kaldi()
        if kaldi is None:
            return None
        _KALDI.append(kaldi)
    return _KALDI[0]


def import_official_xvector() -> types.ModuleType | None:
    """``chatterbox.models.s3gen.xvector``; None when chatterbox-tts or torchaudio is not installed."""
    if "chatterbox.models.s3gen.xvector" in sys.modules:
        return sys.modules["chatterbox.models.s3gen.xvector"]
    kaldi = official_kaldi()
    if kaldi is None or import_chatterbox("models") is None:
        return None
    ta, compliance = _stub("torchaudio"), _stub("torchaudio.compliance")
    ta.compliance = compliance  # type: ignore[attr-defined]
    compliance.kaldi = kaldi  # type: ignore[attr-defined]
    with swapped_modules(
        {"torchaudio": ta, "torchaudio.compliance": compliance, "torchaudio.compliance.kaldi": kaldi}
    ):
        return import_chatterbox("models.s3gen.xvector")


def official_campplus(state: dict[str, torch.Tensor] | None = None, prefix: str = "speaker_encoder.") -> Any:
    """The official ``CAMPPlus`` as ``S3Gen`` builds it, loaded strictly from the tensors under
    ``prefix`` (random upstream initialisation without a state); None when chatterbox-tts or
    torchaudio is not installed."""
    xvector = import_official_xvector()
    if xvector is None:
        return None
    model = xvector.CAMPPlus(memory_efficient=False)
    if state is not None:
        model.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
    return model.eval()
