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
from safetensors.torch import load_file, save_file
from transformers import MimiConfig, MimiModel

from .codec_decoder import CodecDecoder, CodecDecoderConfig
from .seanet_gemm import GemmSeanet, supports

__all__ = [
    "CodecEncoder",
    "build_mimi_encoder",
    "load_codec_encoder",
    "speech_tokenizer_config",
    "write_random_speech_tokenizer",
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
        """Run the convolution stack's ELUs on voxcast's C++ operation (:mod:`.seanet_gemm`; not
        bitwise PyTorch's); returns whether they do (only with the GEMM stack, where the library
        loads)."""
        from . import int8_kernel

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

# The real speech tokenizer's sub-configs (facts from its published config.json).
_FULL_DECODER: dict[str, Any] = {
    "attention_bias": False, "attention_dropout": 0.0, "latent_dim": 1024, "codebook_dim": 512,
    "codebook_size": 2048, "decoder_dim": 1536, "hidden_act": "silu", "hidden_size": 512,
    "intermediate_size": 1024, "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000,
    "head_dim": 64, "num_attention_heads": 16, "num_hidden_layers": 8, "num_key_value_heads": 16,
    "num_quantizers": 16, "num_semantic_quantizers": 1, "rms_norm_eps": 1e-05, "rope_theta": 10000,
    "semantic_codebook_size": 4096, "sliding_window": 72, "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2], "vector_quantization_hidden_dimension": 512,
}  # fmt: skip
_FULL_ENCODER: dict[str, Any] = {
    "_frame_rate": 12.5, "attention_bias": False, "attention_dropout": 0.0, "audio_channels": 1,
    "codebook_dim": 256, "codebook_size": 2048, "compress": 2, "dilation_growth_rate": 2,
    "dtype": "float32", "head_dim": 64, "hidden_act": "gelu", "hidden_size": 512,
    "initializer_range": 0.02, "intermediate_size": 2048, "kernel_size": 7, "last_kernel_size": 3,
    "layer_scale_initial_scale": 0.01, "max_position_embeddings": 8000, "norm_eps": 1e-05,
    "normalize": False, "num_attention_heads": 8, "num_filters": 64, "num_hidden_layers": 8,
    "num_key_value_heads": 8, "num_quantizers": 32, "num_residual_layers": 1,
    "num_semantic_quantizers": 1, "pad_mode": "constant", "residual_kernel_size": 3,
    "rope_theta": 10000.0, "sampling_rate": 24000, "sliding_window": 250, "trim_right_ratio": 1.0,
    "upsample_groups": 512, "upsampling_ratios": [8, 6, 5, 4], "use_cache": False,
    "use_causal_conv": True, "use_conv_shortcut": False, "use_streaming": False,
    "vector_quantization_hidden_dimension": 256,
}  # fmt: skip
# Tiny sizes keep every rate (frame maths, window 72, 2048-entry codebooks, 16/32 quantizers).
_TINY_DECODER = {
    "latent_dim": 32, "codebook_dim": 32, "decoder_dim": 64, "hidden_size": 32, "head_dim": 8,
    "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
    "num_hidden_layers": 2, "vector_quantization_hidden_dimension": 32,
}  # fmt: skip
_TINY_ENCODER = {
    "codebook_dim": 16, "hidden_size": 32, "head_dim": 16, "intermediate_size": 64,
    "num_attention_heads": 2, "num_key_value_heads": 2, "num_filters": 4, "num_hidden_layers": 1,
    "upsample_groups": 32, "vector_quantization_hidden_dimension": 16,
}  # fmt: skip
_FEATURE_EXTRACTOR = {
    "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
    "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE,
}  # fmt: skip


def speech_tokenizer_config(size: str = "full") -> dict[str, Any]:
    """The speech tokenizer ``config.json`` content in the official layout ("tiny" or "full")."""
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    dec, enc = dict(_FULL_DECODER), dict(_FULL_ENCODER)
    if size == "tiny":
        dec.update(_TINY_DECODER)
        enc.update(_TINY_ENCODER)
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": VALID_QUANTIZERS,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": SAMPLES_PER_FRAME,
        "encode_downsample_rate": SAMPLES_PER_FRAME,
        "decoder_config": dec,
        "encoder_config": enc,
        "transformers_version": "4.57.3",
    }


def _random_weights(cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    decoder = CodecDecoder(CodecDecoderConfig.from_dict(cfg["decoder_config"]))
    mimi = build_mimi_encoder(cfg["encoder_config"])
    out: dict[str, torch.Tensor] = {}
    for prefix, module in (("decoder.", decoder), ("encoder.", mimi)):
        for name, t in module.state_dict().items():
            if name.endswith("embedding_sum") or name.endswith("embed_sum"):
                t = torch.randn(t.shape)  # a zero codebook makes every code alike
            out[prefix + name] = t.detach().clone().contiguous()
    return out


def write_random_speech_tokenizer(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight speech tokenizer folder in the official layout.

    Writes ``config.json``, ``model.safetensors`` (``decoder.*`` and ``encoder.*`` keys as the
    official file; codebooks N(0, 1)) and ``preprocessor_config.json``, loadable by the official
    ``Qwen3TTSTokenizer.from_pretrained`` and by :func:`load_codec_encoder` /
    :func:`~voxcast.models.qwen3_tts.codec_decoder.load_codec_decoder`.

    Args:
        out_dir: folder to create (typically ``<checkpoint>/speech_tokenizer``).
        size: "tiny" (a few MB, for tests) or "full" (real sizes, for benchmarks).
        seed: RNG seed; the same seed gives the same weights. The global RNG is left untouched.

    Returns:
        ``out_dir``.
    """
    cfg = speech_tokenizer_config(size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        weights = _random_weights(cfg)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out_dir / "preprocessor_config.json").write_text(json.dumps(_FEATURE_EXTRACTOR, indent=2) + "\n")
    logger.info("random %s speech tokenizer written to %s (seed %d)", size, out_dir, seed)
    return out_dir
