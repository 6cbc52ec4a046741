"""Qwen3-TTS as a model family of :mod:`voxcast.models.registry`: its loader, its CPU kernel
settings (``VOXCAST_INT8_KERNEL``, ``VOXCAST_FUSED_OPS``, ``VOXCAST_F32_ROWS``,
``VOXCAST_BATCH_GRAPHS``) and its test
checkpoints. Imports the model only when a checkpoint is loaded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from voxcast.models.family import ModelFamily, Setting, TestCheckpoints, on_off_auto

if TYPE_CHECKING:
    from voxcast.models.base import LoadOptions, TTSModel

__all__ = ["FAMILY", "load"]


def load(root: Path, options: LoadOptions) -> TTSModel:
    """Load the Qwen3-TTS checkpoint in ``root`` with ``options``."""
    from voxcast.models.qwen3_tts.model import Qwen3TTS

    return Qwen3TTS.from_pretrained(
        str(root),
        device=options.device,
        dtype=options.dtype,
        codec_dtype=options.codec_dtype,
        quant=options.quant,
        prefix_cache=options.prefix_cache,
        compile=options.compile,
        trace_steps=options.trace_steps,
        int8_kernel=options.setting("int8_kernel"),
        fused_ops=options.setting("fused_ops"),
        f32_rows=options.setting("f32_rows"),
        batch_graphs=bool(options.setting("batch_graphs")),
    )


SETTINGS = (
    Setting(
        "int8_kernel",
        "VOXCAST_INT8_KERNEL",
        on_off_auto,
        doc="with int8 weights, decode rows on voxcast's own kernel: auto or on (where it builds) or "
        "off (fbgemm; other audio)",
    ),
    Setting(
        "fused_ops",
        "VOXCAST_FUSED_OPS",
        on_off_auto,
        doc="float32 RMSNorms, q/k norm + rotary embeddings, decode-step attention and the voice "
        "build's encoders as C++ operations: auto (with int8 weights, where the library builds), on "
        "(float32 weights too; not bit-exact) or off; off with compile",
    ),
    Setting(
        "f32_rows",
        "VOXCAST_F32_ROWS",
        on_off_auto,
        doc="float32 weights on the CPU: decode rows on voxcast's kernels (bitwise F.linear, checked "
        "at load): auto (where the BLAS's bits match; the code predictor's packed copies where they "
        "also measure faster), on (where they match) or off",
    ),
    Setting(
        "batch_graphs",
        "VOXCAST_BATCH_GRAPHS",
        on_off_auto,
        doc="each frame of a batch as one static-shape function over slots of one batched key/value "
        "cache, captured as a CUDA graph per batch bucket on CUDA (eager on a CPU), sampling with "
        "counter-based draws (same seed, same audio whatever else is batched; not the official "
        "sampler's draws): on or off (auto = off until measured on a GPU)",
    ),
)

FAMILY = ModelFamily(
    name="qwen3_tts",
    load=load,
    settings=SETTINGS,
    test_checkpoints=TestCheckpoints(
        kinds=("base", "custom_voice", "voice_design"),
        sizes=("tiny", "tiny-1.7b", "0.6b", "1.7b"),
        builder="voxcast.testing.qwen3_tts:make_test_model",
        sources=(
            "voxcast.testing.qwen3_tts",
            "voxcast.testing.qwen3_tts_parts",
            "voxcast.models.qwen3_tts.checkpoint",
            "voxcast.models.qwen3_tts.codec_encoder",
            "voxcast.models.qwen3_tts.codec_decoder",
            "voxcast.models.qwen3_tts.speaker_encoder",
        ),
    ),
)
