"""What the engine chose for the machine it runs on, as one record (logged once, after warm-up).

The engine adapts at load and warm-up: bfloat16 only where native (:mod:`.precision`), batched rows
and the audio decoder's short GEMMs on oneDNN where PyTorch has it, the decode thread where the
calibration found it faster (a timing only ever picks among choices that give the same audio). An
operator reading a worker's log, or a benchmark's JSON, needs
those choices and the measurements behind them next to the figures they explain.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from voxcast.engine.precision import Precision
from voxcast.models.base import TTSModel

__all__ = ["RuntimeFacts", "runtime_choices"]


class RuntimeFacts(Protocol):
    """What :func:`runtime_choices` reads of an engine (:class:`~voxcast.engine.engine.Engine`)."""

    precision: Precision | None
    decode_calibration: dict[str, Any] | None
    warmup_parts: dict[str, float]
    heap_trim: dict[str, float] | None

    @property
    def model(self) -> TTSModel: ...

    @property
    def decode_threaded(self) -> bool: ...


def runtime_choices(engine: RuntimeFacts) -> dict[str, Any]:
    """The engine's hardware-dependent choices (JSON-able; absent parts are None)."""
    precision = engine.precision
    return {
        **engine.model.runtime_report(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "precision": precision.as_dict() if precision is not None else None,
        "decode_thread": engine.decode_threaded,
        "decode_calibration": engine.decode_calibration,
        "warmup_parts_ms": engine.warmup_parts,
        "heap_trim": engine.heap_trim,
    }
