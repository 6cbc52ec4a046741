"""Random parts of a Qwen3-TTS checkpoint in the official layout: the speech tokenizer folder and the
speaker encoder's weights (test and benchmark checkpoints; never imported by production code)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from voxcast.models.qwen3_tts.codec_decoder import CodecDecoder, CodecDecoderConfig
from voxcast.models.qwen3_tts.codec_encoder import (
    SAMPLE_RATE,
    SAMPLES_PER_FRAME,
    VALID_QUANTIZERS,
    build_mimi_encoder,
)
from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig

__all__ = [
    "random_speaker_encoder_state",
    "speech_tokenizer_config",
    "tiny_speaker_encoder_config",
    "write_random_speech_tokenizer",
]

logger = logging.getLogger(__name__)

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


def tiny_speaker_encoder_config(enc_dim: int) -> dict[str, Any]:
    """A small ``speaker_encoder_config`` (for test checkpoints) giving x-vectors of size ``enc_dim``."""
    return {
        "mel_dim": 128,
        "enc_dim": enc_dim,
        "enc_channels": [16, 16, 16, 16, 48],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 8,
        "enc_res2net_scale": 8,
        "enc_se_channels": 8,
        "sample_rate": 24000,
    }


def random_speaker_encoder_state(config: dict[str, Any], seed: int = 0) -> dict[str, Tensor]:
    """Random weights keyed ``speaker_encoder.*`` as in the main ``model.safetensors``.

    Args:
        config: a ``speaker_encoder_config`` dict (e.g. :func:`tiny_speaker_encoder_config`).
        seed: RNG seed (the global RNG is left untouched).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SpeakerEncoder(SpeakerEncoderConfig.from_dict(config))
    return {f"speaker_encoder.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
