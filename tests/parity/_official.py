"""Run the official qwen-tts 0.1.1 pipeline on a checkpoint, for parity tests.

``import qwen_tts`` needs ``torchaudio`` (and, for its unused 25 Hz tokenizer, ``sox`` and
``onnxruntime``); on a CPU-only torch the PyPI torchaudio cannot load, so empty stub modules stand
in for whichever of these is missing. Nothing the 12 Hz models run touches them.

Helpers return the official wrapper's results plus what it computed on the way: the prefill
embeddings handed to ``talker.generate`` and the codes returned by ``model.generate``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["OfficialRun", "import_qwen_tts", "load_official", "official_voice_items", "run_official"]

_STUBBED = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "sox", "onnxruntime")


def _stub(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = mod
    return mod


def import_qwen_tts() -> types.ModuleType | None:
    """Import ``qwen_tts`` (stubbing unloadable optional imports); None when it is not installed."""
    if importlib.util.find_spec("qwen_tts") is None:
        return None
    for name in ("torchaudio", "sox", "onnxruntime"):
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # a CUDA-only torchaudio raises OSError, others ImportError
            _stub(name)
    ta = sys.modules["torchaudio"]
    if not hasattr(ta, "compliance"):
        comp = _stub("torchaudio.compliance")
        comp.kaldi = _stub("torchaudio.compliance.kaldi")  # type: ignore[attr-defined]
        ta.compliance = comp  # type: ignore[attr-defined]
    try:
        return importlib.import_module("qwen_tts")
    except Exception:
        return None


_LOADED: dict[tuple[str, str], Any] = {}


def load_official(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    """``Qwen3TTSModel.from_pretrained(path)`` on the CPU (cached per path and dtype)."""
    key = (str(path), str(dtype))
    if key not in _LOADED:
        qwen_tts = import_qwen_tts()
        assert qwen_tts is not None, "qwen_tts is not importable"
        _LOADED[key] = qwen_tts.Qwen3TTSModel.from_pretrained(str(path), dtype=dtype)
    return _LOADED[key]


@dataclass
class OfficialRun:
    """What one official generate call produced."""

    wavs: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 0
    #: ``[1, L, H]`` prefill handed to ``talker.generate``.
    prefill: torch.Tensor | None = None
    #: ``[1, T, H]`` trailing text hidden handed to ``talker.generate``.
    trailing: torch.Tensor | None = None
    #: ``[frames, 16]`` codes returned by ``model.generate``.
    codes: torch.Tensor | None = None


@contextlib.contextmanager
def _capture(wrapper: Any, run: OfficialRun) -> Iterator[None]:
    model = wrapper.model
    orig_talker_generate = model.talker.generate
    orig_generate = model.generate

    def talker_generate(*args: Any, **kwargs: Any) -> Any:
        run.prefill = kwargs["inputs_embeds"].detach().clone()
        run.trailing = kwargs["trailing_text_hidden"].detach().clone()
        return orig_talker_generate(*args, **kwargs)

    def generate(*args: Any, **kwargs: Any) -> Any:
        codes, hiddens = orig_generate(*args, **kwargs)
        run.codes = codes[0].detach().clone()
        return codes, hiddens

    model.talker.generate = talker_generate
    model.generate = generate
    try:
        yield
    finally:
        del model.talker.generate
        del model.generate


def official_voice_items(
    wrapper: Any, audio: np.ndarray, sr: int, ref_text: str | None, x_vector_only: bool
) -> list[Any]:
    """``create_voice_clone_prompt`` for one clip."""
    return list(
        wrapper.create_voice_clone_prompt(
            ref_audio=(audio, sr), ref_text=ref_text, x_vector_only_mode=x_vector_only
        )
    )


def run_official(
    wrapper: Any,
    text: str,
    *,
    seed: int = 0,
    greedy: bool = False,
    max_frames: int = 20,
    speaker: str | None = None,
    language: str = "Auto",
    instruct: str | None = None,
    voice_items: list[Any] | None = None,
    non_streaming_mode: bool | None = None,
    **sampling: Any,
) -> OfficialRun:
    """One official generation (mode chosen by the model type), seeded with ``torch.manual_seed``."""
    run = OfficialRun()
    kw: dict[str, Any] = {"max_new_tokens": max_frames + 1, **sampling}
    if greedy:
        kw.update(do_sample=False, subtalker_dosample=False)
    if non_streaming_mode is not None:
        kw["non_streaming_mode"] = non_streaming_mode
    kind = wrapper.model.tts_model_type
    with _capture(wrapper, run), torch.inference_mode():
        torch.manual_seed(seed)
        if kind == "custom_voice":
            wavs, sr = wrapper.generate_custom_voice(
                text, speaker=speaker, language=language, instruct=instruct, **kw
            )
        elif kind == "voice_design":
            wavs, sr = wrapper.generate_voice_design(text, instruct=instruct, language=language, **kw)
        else:
            wavs, sr = wrapper.generate_voice_clone(
                text, language=language, voice_clone_prompt=voice_items, **kw
            )
    run.wavs, run.sample_rate = list(wavs), int(sr)
    return run
