"""Qwen3-TTS as a model family of :mod:`voxcast.models.registry`."""

from __future__ import annotations

from pathlib import Path

from voxcast.models.base import LoadOptions, TTSModel
from voxcast.models.qwen3_tts.model import Qwen3TTS

__all__ = ["load"]


def load(root: Path, options: LoadOptions) -> TTSModel:
    """Load the Qwen3-TTS checkpoint in ``root`` with ``options``."""
    return Qwen3TTS.from_pretrained(
        str(root),
        device=options.device,
        dtype=options.dtype,
        codec_dtype=options.codec_dtype,
        quant=options.quant,
        prefix_cache=options.prefix_cache,
        compile=options.compile,
        trace_steps=options.trace_steps,
        int8_kernel=options.kernel("int8_kernel"),
        fused_ops=options.kernel("fused_ops"),
        f32_rows=options.kernel("f32_rows"),
    )
