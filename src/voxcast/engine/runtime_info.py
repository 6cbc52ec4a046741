"""What the engine chose for the machine it runs on, as one record (logged once, after warm-up).

The engine adapts at load and warm-up: bfloat16 only where native (:mod:`.precision`), batched rows
and the audio decoder's short GEMMs on oneDNN where that measured faster, the decode thread where
the calibration found it faster. An operator reading a worker's log, or a benchmark's JSON, needs
those choices and the measurements behind them next to the figures they explain.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["runtime_choices"]


def runtime_choices(engine: Any) -> dict[str, Any]:
    """The engine's hardware-dependent choices (JSON-able; absent parts are None)."""
    model = engine.model
    decoder = getattr(model, "codec_decoder", None)
    precision = engine.precision
    return {
        "device": str(getattr(model, "device", "?")),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "precision": precision.as_dict() if precision is not None else None,
        "quant": getattr(model, "quant", None),
        "int8_kernel": getattr(model, "int8_kernel", None),
        "int8_kernel_variant": getattr(model, "int8_variant", None),
        "int8_kernel_timing": getattr(model, "int8_kernel_timing", None),
        "fused_ops": getattr(model, "fused_ops", None),
        "onednn_rows": getattr(model, "onednn_rows", None),
        "rows_kernel": getattr(model, "rows_kernel", None),
        "row_parts": getattr(model, "row_parts", None),
        "row_kernel": getattr(model, "row_kernel", None),
        "f32_rows": getattr(model, "f32_rows", None),
        "codec_small_gemm": getattr(decoder, "small_gemm", None),
        "decode_thread": engine.decode_threaded,
        "decode_calibration": engine.decode_calibration,
        "heap_trim": engine.heap_trim,
    }
