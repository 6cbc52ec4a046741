"""The code predictor's intra-frame forwards, recorded once and replayed without Python (CPU).

Per frame the code predictor runs 15 small forwards (positions 0-1, then 2, ..., 15 of a 16-slot
cache); on a CPU about a third of their time is spent dispatching ~350 small operations each from
Python. :func:`torch.jit.trace` records each step's operations once per batch size (positions are
the same every frame, so each step's graph is fixed) and replays them from C++. The recorded graph
runs the same ATen operations on the same inputs in the same order, so outputs are bitwise equal to
the eager forward (tested), which keeps the official-parity guarantees; int8 (dynamically quantized)
Linears are recorded as well.

The cache tensors are inputs of the recorded steps (they are written in place), so one recording
serves every frame of every stream of that batch size; the code predictor's shared per-batch-size
caches (:meth:`CodePredictor.shared_cache`) are passed in. Recording costs ~0.1-0.3 s per step on
the full-size model, so batch sizes are recorded ahead of use (:meth:`TracedSteps.prepare`, called
by the engine's warm-up for 1..``max_active``) or on first use.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from voxcast.models.qwen3_tts.talker import KVCache

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.code_predictor import CodePredictor

__all__ = ["TracedSteps"]

logger = logging.getLogger(__name__)


class _Step(nn.Module):
    """One intra-frame forward at fixed positions, with the per-layer caches as inputs."""

    def __init__(self, cp: CodePredictor, start: int) -> None:
        super().__init__()
        self.cp = cp
        self.start = start

    def forward(self, embeds: Tensor, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
        cache = [KVCache.wrap(k, v) for k, v in zip(ks, vs, strict=True)]
        return self.cp._forward(embeds, cache, self.start)


class TracedSteps:
    """Recorded intra-frame forwards of one code predictor, by batch size."""

    def __init__(self, cp: CodePredictor) -> None:
        self.cp = cp
        self._steps: dict[int, list[torch.jit.ScriptModule]] = {}

    def starts(self) -> list[tuple[int, int]]:
        """``(start, length)`` of each intra-frame forward: ``(0, 2), (2, 1), ..., (15, 1)``."""
        return [(0, 2)] + [(g + 1, 1) for g in range(1, self.cp.num_codes)]

    @torch.inference_mode()
    def prepare(self, batch: int) -> None:
        """Record the 15 forwards for ``batch`` rows (no-op when already recorded)."""
        if batch in self._steps:
            return
        t0 = time.perf_counter()
        cp = self.cp
        cache = cp.shared_cache(batch)
        w = cp.model.norm.weight
        first = cp.model.codec_embedding[0]
        assert isinstance(first, nn.Embedding)
        hidden = first.embedding_dim
        ks, vs = [c.k for c in cache], [c.v for c in cache]
        steps = []
        for start, length in self.starts():
            example = torch.zeros(batch, length, hidden, dtype=w.dtype, device=w.device)
            with warnings.catch_warnings():  # tracer notes on Python values baked into the graph
                warnings.simplefilter("ignore")
                steps.append(torch.jit.trace(_Step(cp, start), (example, ks, vs), check_trace=False))
        self._steps[batch] = steps
        logger.info("recorded code-predictor steps for batch %d in %.2f s", batch, time.perf_counter() - t0)

    def step(self, embeds: Tensor, cache: list[KVCache], index: int) -> Tensor:
        """Run intra-frame forward ``index`` (0..14) for ``embeds [B, L, H]`` with ``cache``."""
        batch = embeds.shape[0]
        if batch not in self._steps:
            self.prepare(batch)
        out: Tensor = self._steps[batch][index](embeds, [c.k for c in cache], [c.v for c in cache])
        return out
