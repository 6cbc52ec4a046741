"""The 12 Hz speech-tokenizer encoder: 24 kHz reference audio -> reference codes [N, 16].

The official tokenizer's encoder is transformers' :class:`~transformers.MimiModel` with its decoder
half removed (32 quantizers, the first 16 used). This module builds the same model from the
``encoder_config`` of the speech tokenizer's ``config.json``, loads the ``encoder.*`` weights and
encodes exactly as the official wrapper does for one 24 kHz mono clip: the Encodec feature
extractor adds nothing for a single unpadded clip (values as float, shape [1, 1, L]); Mimi encodes;
the codes are cut to ``ceil(L / 1920)`` frames.

Residual quantisation is sequential, so asking Mimi for 16 quantizers gives exactly the first 16
of the 32 the official code computes (and skips half the work).

Mimi's convolution stack (SEANet) is replaced by :class:`~.seanet_gemm.GemmSeanet`, the same
function as matrix products on a time-major layout (0.63x its time on a 2-core AVX2 CPU, codes
equal); its transformer, downsampling and quantizer are transformers' own.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import MimiConfig, MimiModel

from voxcast.kernels.seanet_gemm import GemmSeanet, supports

__all__ = [
    "CodecEncoder",
    "build_mimi_encoder",
    "load_codec_encoder",
]

logger = logging.getLogger(__name__)

#: Input samples per output frame at 24 kHz (12.5 Hz frames).
SAMPLES_PER_FRAME = 1920
#: Sample rate the encoder expects.
SAMPLE_RATE = 24000
#: Quantizers of the 32 that Qwen3-TTS uses (``encoder_valid_num_quantizers``).
VALID_QUANTIZERS = 16


def build_mimi_encoder(encoder_config: dict[str, Any]) -> MimiModel:
    """A randomly initialised Mimi model without its decoder half (as the official tokenizer).

    Args:
        encoder_config: the ``encoder_config`` dict of the speech tokenizer's ``config.json``.
    """
    model = MimiModel(MimiConfig(**encoder_config))
    for name in ("upsample", "decoder_transformer", "decoder"):
        setattr(model, name, None)
    return model


class CodecEncoder:
    """Encodes 24 kHz mono float32 audio into codec codes (LongTensor [ceil(L/1920), 16]).

    Args:
        mimi: the encoder-only Mimi model (:func:`build_mimi_encoder`) with its weights.
        valid_quantizers: quantizers to encode with (the first of Mimi's).
        gemm_seanet: replace ``mimi.encoder`` (in place) by :class:`~.seanet_gemm.GemmSeanet`
            where it computes that stack (Qwen3-TTS's does); False keeps transformers' module.
    """

    def __init__(
        self, mimi: MimiModel, valid_quantizers: int = VALID_QUANTIZERS, *, gemm_seanet: bool = True
    ):
        if gemm_seanet and supports(mimi.encoder):
            mimi.encoder = GemmSeanet(mimi.encoder)  # type: ignore[assignment]
        self.mimi = mimi.eval()
        self.valid_quantizers = valid_quantizers

    @property
    def device(self) -> torch.device:
        return next(self.mimi.parameters()).device

    def use_fast_elu(self, on: bool) -> bool:
        """Run the convolution stack's ELUs on voxcast's C++ operation (:mod:`voxcast.kernels.seanet_gemm`; not
        bitwise PyTorch's); returns whether they do (only with the GEMM stack, where the library
        loads)."""
        from voxcast.kernels import native as int8_kernel

        seanet = self.mimi.encoder
        if not isinstance(seanet, GemmSeanet):
            return False
        seanet.fast_elu = bool(on) and int8_kernel.load()
        return seanet.fast_elu

    @property
    def dtype(self) -> torch.dtype:
        return next(self.mimi.parameters()).dtype

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """Encode one clip.

        Args:
            audio: float32 mono waveform at 24 kHz, shape [L], L > 0.

        Returns:
            LongTensor [ceil(L / 1920), 16] on the CPU.

        Raises:
            ValueError: the audio is not a non-empty 1-D array.
        """
        wav = np.asarray(audio, dtype=np.float32)
        if wav.ndim != 1 or wav.shape[0] == 0:
            raise ValueError(f"audio must be a non-empty 1-D array, got shape {wav.shape}")
        x = torch.from_numpy(wav).to(device=self.device, dtype=self.dtype)[None, None]  # [1, 1, L]
        out = self.mimi.encode(x, num_quantizers=self.valid_quantizers, return_dict=True)
        codes = out.audio_codes[0]  # [Q, frames]
        n = math.ceil(wav.shape[0] / SAMPLES_PER_FRAME)
        return codes[:, :n].transpose(0, 1).to(device="cpu", dtype=torch.long).contiguous()


def load_codec_encoder(
    speech_tokenizer_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CodecEncoder:
    """Load the encoder from an official ``speech_tokenizer`` folder.

    Raises:
        FileNotFoundError: a file is missing.
        RuntimeError: the weights do not match the config (strict load).
    """
    d = Path(speech_tokenizer_dir)
    cfg = json.loads((d / "config.json").read_text())
    mimi = build_mimi_encoder(cfg["encoder_config"])
    tensors = load_file(str(d / "model.safetensors"))
    state = {k[len("encoder.") :]: v for k, v in tensors.items() if k.startswith("encoder.")}
    mimi.load_state_dict(state, strict=True)
    logger.info("codec encoder loaded from %s (%d tensors)", d, len(state))
    valid = int(cfg.get("encoder_valid_num_quantizers", VALID_QUANTIZERS))
    return CodecEncoder(mimi.to(device=device, dtype=dtype), valid)  # type: ignore[call-arg]


# --------------------------------------------------------------------------- random checkpoints
