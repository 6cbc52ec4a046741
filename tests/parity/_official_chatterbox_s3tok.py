"""The official chatterbox-tts 0.1.7 ``S3Tokenizer`` (a subclass of ``s3tokenizer.model_v2.S3TokenizerV2``
from the PyPI package ``s3tokenizer``, installed ``--no-deps``), for parity tests.

``s3tokenizer``'s package ``__init__`` imports ``onnx`` (read only to convert ``.onnx`` weights) and
``torchaudio`` (read only to load audio files); neither is needed to run the model. Where they do not
import, empty stand-ins are registered for the time of the import and removed after it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from tests.parity._official_chatterbox import import_chatterbox

__all__ = ["import_official_s3tokenizer", "official_s3_tokenizer", "stand_ins"]

_STUBBED = ("onnx", "torchaudio")


@contextlib.contextmanager
def stand_ins(names: tuple[str, ...]) -> Iterator[None]:
    """Bare modules for ``names`` that do not import (absent or broken), while the block runs."""
    added = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # absent, or torchaudio's CUDA build that fails under a CPU torch
            sys.modules[name] = types.ModuleType(name)
            added.append(name)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def import_official_s3tokenizer() -> types.ModuleType | None:
    """``chatterbox.models.s3tokenizer.s3tokenizer``; None when chatterbox-tts, ``s3tokenizer`` or
    librosa (its mel filters) is not installed."""
    if "chatterbox.models.s3tokenizer.s3tokenizer" in sys.modules:
        return sys.modules["chatterbox.models.s3tokenizer.s3tokenizer"]
    if importlib.util.find_spec("s3tokenizer") is None:
        return None
    with stand_ins(_STUBBED):
        return import_chatterbox("models.s3tokenizer.s3tokenizer")


def official_s3_tokenizer(state: Mapping[str, torch.Tensor], width: int, layers: int) -> Any:
    """The official ``S3Tokenizer`` at the given width (heads of 64) and depth, loaded strictly from a
    ``tokenizer.`` state.

    Upstream's ``__init__`` passes no config to ``S3TokenizerV2``, which then builds from its default
    ``ModelConfig()`` argument (1280 wide, 6 layers); that default is swapped for the time of the call,
    so the official ``__init__`` runs unchanged at a test size.
    """
    mod = import_official_s3tokenizer()
    assert mod is not None
    v2 = importlib.import_module("s3tokenizer.model_v2")
    init = v2.S3TokenizerV2.__init__
    saved = init.__defaults__
    init.__defaults__ = (v2.ModelConfig(n_audio_state=width, n_audio_head=width // 64, n_audio_layer=layers),)
    try:
        model = mod.S3Tokenizer("speech_tokenizer_v2_25hz")
    finally:
        init.__defaults__ = saved
    model.load_state_dict({k[len("tokenizer.") :]: v for k, v in state.items()}, strict=True)
    return model.eval()
