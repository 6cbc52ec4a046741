"""The official ``ChatterboxTurboTTS.generate`` (chatterbox-tts 0.1.7), for the end-to-end parity test.

``chatterbox/tts_turbo.py`` imports the whole pipeline. Its parts load through the other parity
helpers (each with the stand-ins it needs: the flow's ``omegaconf``, the tokenizer's ``onnx``, CAMPPlus's
pure-Python ``torchaudio.compliance.kaldi``); ``s3gen.py`` imports ``torchaudio`` itself, for a
resampler ``generate`` never calls when given conditionals, so a bare ``torchaudio`` module stands in
while it loads; ``perth`` (the watermark, off in the comparison: its ``apply_watermark`` is replaced by
the identity) is a stand-in too when it does not import.

Upstream hard-codes the full-size modules (``S3Gen(meanflow=True)``, GPT-2 medium): the test builds
the official object around the official modules at the tiny checkpoint's sizes instead of calling
``from_local`` (:func:`official_tts`).
"""

from __future__ import annotations

import contextlib
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.parity._official_chatterbox import import_chatterbox, official_hift, official_t3
from tests.parity._official_chatterbox_campplus import import_official_xvector
from tests.parity._official_chatterbox_flow import official_flow, official_flow_modules
from tests.parity._official_chatterbox_s3tok import import_official_s3tokenizer, stand_ins

__all__ = ["import_official_tts", "official_generate", "official_tts"]


def import_official_tts() -> types.ModuleType | None:
    """``chatterbox.tts_turbo``; None when a part of the pipeline cannot load (the test skips)."""
    if "chatterbox.tts_turbo" in sys.modules:
        return sys.modules["chatterbox.tts_turbo"]
    if (
        import_official_xvector() is None
        or import_official_s3tokenizer() is None
        or official_flow_modules() is None
    ):
        return None
    try:
        with stand_ins(("perth", "torchaudio")), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s3gen = import_chatterbox("models.s3gen.s3gen")
            const = import_chatterbox("models.s3gen.const")
            if s3gen is None or const is None:
                return None
            package = sys.modules["chatterbox.models.s3gen"]  # a bare namespace (see _official_chatterbox)
            package.S3Gen = s3gen.S3Token2Wav  # type: ignore[attr-defined]
            package.S3GEN_SR = const.S3GEN_SR  # type: ignore[attr-defined]
            return import_chatterbox("tts_turbo")
    except Exception:
        return None


def official_tts(
    folder: Path, t3_shape: tuple[int, int, int], flow_cfg: Any, hift_widths: tuple[int, int]
) -> Any:
    """The official ``ChatterboxTurboTTS`` for the checkpoint in ``folder`` at its (tiny) sizes, with
    its built-in voice (``Conditionals.load`` of ``conds.pt``) and the watermark off."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    tts_mod = import_official_tts()
    assert tts_mod is not None
    s3gen_mod = sys.modules["chatterbox.models.s3gen.s3gen"]
    state = load_file(str(folder / "s3gen_meanflow.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s3gen = s3gen_mod.S3Token2Wav(meanflow=True)  # upstream's full-size modules, then the tiny ones
    s3gen.flow = official_flow(state, flow_cfg)
    s3gen.mel2wav = official_hift(state, *hift_widths)
    s3gen.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tts = tts_mod.ChatterboxTurboTTS.__new__(tts_mod.ChatterboxTurboTTS)
    tts.sr, tts.t3, tts.s3gen, tts.ve, tts.tokenizer, tts.device = (
        24000,
        official_t3(folder, *t3_shape),
        s3gen,
        None,
        tokenizer,
        "cpu",
    )
    tts.conds = tts_mod.Conditionals.load(folder / "conds.pt")
    tts.watermarker = types.SimpleNamespace(apply_watermark=lambda wav, sample_rate: wav)
    return tts


def official_generate(tts: Any, text: str, seed: int) -> np.ndarray:
    """``generate(text)`` after ``torch.manual_seed(seed)`` (its defaults), as a float32 array."""
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(None), warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        return tts.generate(text)[0].numpy()
