"""The code predictor's intra-frame forwards, recorded once and replayed without Python (CPU).

Per frame the code predictor runs 15 small forwards (positions 0-1, then 2, ..., 15 of a 16-slot
cache); on a CPU about a third of their time is spent dispatching ~350 small operations each from
Python. :func:`torch.jit.trace` records each step's operations once per batch size (positions are
the same every frame, so each step's graph is fixed) and replays them from C++. The recorded graph
runs the same ATen operations on the same inputs in the same order, so outputs are bitwise equal to
the eager forward (tested), which keeps the official-parity guarantees; int8 (dynamically quantized)
Linears are recorded as well.

Each step is traced as a function where it can be: the weights enter its graph as constants (the
same tensors, not copies), and TorchScript does not convert the code predictor's module tree, which
made recording take 3x longer (0.6B int8, 2 cores: 1.07 s for the batch-1 steps as one traced module
against 0.35 s as functions, outputs bitwise equal). fbgemm's packed int8 weights (the rows that
voxcast's kernel does not take) cannot be graph constants: those steps are traced as methods of one
module (:func:`torch.jit.trace_module`, which converts the module tree once for all 15).

The cache tensors are inputs of the recorded steps (they are written in place), so one recording
serves every frame of every stream of that batch size; the code predictor's shared per-batch-size
caches (:meth:`CodePredictor.shared_cache`) are passed in. Batch sizes are rounded up to powers of
two (zero rows fill the batch; a row's values then equal the unpadded batch's up to float rounding,
as any two batch sizes do). Recording takes about a second per batch size on the full-size model
(traced, then run a few times), so the engine's warm-up records every size up to ``max_active``
(:meth:`TracedSteps.prepare_upto`);
otherwise a size is recorded on first use. Measured (``scripts/bench_decode.py --size 0.6b``):
code predictor 1.1x faster per frame in float32, 1.4x with int8 weights.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from voxcast.models.qwen3_tts.kv_cache import KVCache

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.code_predictor import CodePredictor

__all__ = ["TracedSteps", "bucket", "use_traced_steps"]

logger = logging.getLogger(__name__)

#: Runs of each new recording at record time (TorchScript's profiling executor optimises after 2).
_WARM_RUNS = 3


class _Steps(nn.Module):
    """The intra-frame forwards as methods ``step0`` .. ``step14`` of one module (the fallback)."""

    def __init__(self, cp: CodePredictor, starts: list[int]) -> None:
        super().__init__()
        self.cp = cp
        for i, start in enumerate(starts):
            setattr(self, f"step{i}", _step_at(cp, start))


def _step_at(cp: CodePredictor, start: int) -> Callable[[Tensor, list[Tensor], list[Tensor]], Tensor]:
    """The intra-frame forward at ``start`` as a function of the embeddings and the per-layer caches."""

    def step(embeds: Tensor, ks: list[Tensor], vs: list[Tensor]) -> Tensor:
        cache = [KVCache.wrap(k, v) for k, v in zip(ks, vs, strict=True)]
        return cp._forward(embeds, cache, start)

    return step


class TracedSteps:
    """Recorded intra-frame forwards of one code predictor, by batch size."""

    def __init__(self, cp: CodePredictor) -> None:
        self.cp = cp
        self._steps: dict[int, list[Callable[..., Tensor]]] = {}

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
        starts = self.starts()
        examples = [
            (torch.zeros(batch, length, hidden, dtype=w.dtype, device=w.device), ks, vs)
            for _, length in starts
        ]
        with warnings.catch_warnings():  # tracer notes on Python values baked into the graph
            warnings.simplefilter("ignore")
            try:
                steps = [
                    torch.jit.trace(_step_at(cp, start), example, check_trace=False)
                    for (start, _), example in zip(starts, examples, strict=True)
                ]
            except RuntimeError:  # fbgemm's packed weights: not a graph constant, trace the module
                module = _Steps(cp, [start for start, _ in starts])
                names = {f"step{i}": example for i, example in enumerate(examples)}
                traced = torch.jit.trace_module(module, names, check_trace=False)
                steps = [getattr(traced, name) for name in names]
        # TorchScript profiles a recording's first runs and then optimises it (hundreds of ms per
        # step): pay that here, not in the first frame that uses this batch size.
        for step, example in zip(steps, examples, strict=True):
            for _ in range(_WARM_RUNS):
                step(*example)
        self._steps[batch] = steps
        logger.info("recorded code-predictor steps for batch %d in %.2f s", batch, time.perf_counter() - t0)

    def prepare_upto(self, max_batch: int) -> None:
        """Record every batch-size bucket up to ``max_batch`` rows (1, 2, 4, ...)."""
        size = 1
        while True:
            self.prepare(size)
            if size >= max_batch:
                return
            size *= 2

    def step(self, embeds: Tensor, index: int) -> Tensor:
        """Run intra-frame forward ``index`` (0..14) for ``embeds [B, L, H]``.

        B rows run in the recording of the next power of two (zero rows fill it up, sliced off
        after), with the code predictor's shared cache of that size.
        """
        batch = embeds.shape[0]
        size = bucket(batch)
        if size not in self._steps:
            self.prepare(size)
        if size != batch:
            embeds = torch.cat((embeds, embeds.new_zeros(size - batch, *embeds.shape[1:])))
        cache = self.cp.shared_cache(size)
        out: Tensor = self._steps[size][index](embeds, [c.k for c in cache], [c.v for c in cache])
        return out if size == batch else out[:batch]


def bucket(batch: int) -> int:
    """The recorded batch size serving ``batch`` rows: the next power of two."""
    return 1 << max(0, batch - 1).bit_length()


def use_traced_steps(predictor: CodePredictor, enabled: bool = True) -> None:
    """Replay ``predictor``'s intra-frame forwards from recordings (bitwise the same outputs);
    ``enabled=False`` goes back to the eager forwards."""
    predictor.traced = TracedSteps(predictor) if enabled else None
