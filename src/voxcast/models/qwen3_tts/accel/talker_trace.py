"""The talker's decode step, recorded once and replayed without Python (CPU): one row, and batched rows.

A decode step runs the talker's 28 layers for one new position; on a CPU with int8 weights about a
third of its time was Python dispatching ~40 small operations per layer (0.6B int8, 2 cores: 37 ms
per step eager, 25 ms replayed). Unlike the code predictor's steps (:mod:`voxcast.models.qwen3_tts.accel.cp_trace`), the talker's
position changes every frame, so the position goes into the recording as a 0-dim tensor: the tracer
records slices whose bounds are tensors as dynamic slices, so writing the new keys/values at
``start`` and attending over ``[0, start + 1)`` stay correct for every position, and the caches are
inputs (their tensors are replaced when they grow). Everything else in a step has fixed shapes. The
replay runs the same ATen operations on the same inputs in the same order as the eager step, so the
outputs are bitwise equal (tested at every position across cache growth), which keeps official
parity.

Batched rows (continuous batching: B streams, each with its own cache and position) are recorded per
batch-size bucket (2, 4, 8, ...: :func:`voxcast.models.qwen3_tts.accel.cp_trace.bucket`), each row's position its own 0-dim tensor.
A batch between buckets is filled with zero rows on a one-position scratch cache; a zero row stays zero
through every layer (RMSNorm of zeros is zero, the projections have no bias), so it neither changes
the real rows' int8 activation scales nor costs more than a row of the matmuls. The real rows then
equal the eager batched step at the bucket's size bitwise (tested), and the eager step at their own
size up to float rounding, as any two batch sizes do.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from voxcast.models.qwen3_tts.accel.cp_trace import bucket
from voxcast.models.qwen3_tts.kv_cache import KVCache

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.talker import Talker

__all__ = ["TracedTalkerStep", "use_traced_step"]

logger = logging.getLogger(__name__)

#: Positions the recording is run at when made (TorchScript profiles the first runs, then optimises).
_WARM_POSITIONS = (1, 2, 3)


class _Step(nn.Module):
    def __init__(self, talker: Talker) -> None:
        super().__init__()
        self.talker = talker

    def forward(
        self, embeds: Tensor, cos: Tensor, sin: Tensor, start: Tensor, ks: list[Tensor], vs: list[Tensor]
    ) -> tuple[Tensor, Tensor]:
        cache = [KVCache.wrap(k, v) for k, v in zip(ks, vs, strict=True)]
        return self.talker.run_layers(embeds, cos, sin, cache, start)  # type: ignore[arg-type]


class _Rows(nn.Module):
    """Batched rows: the caches come flat, row-major (row r's layer i at ``r * layers + i``)."""

    def __init__(self, talker: Talker) -> None:
        super().__init__()
        self.talker = talker

    def forward(
        self,
        embeds: Tensor,
        cos: Tensor,
        sin: Tensor,
        starts: list[Tensor],
        ks: list[Tensor],
        vs: list[Tensor],
    ) -> tuple[Tensor, Tensor]:
        n = len(self.talker.model.layers)
        caches = [[KVCache.wrap(ks[r * n + i], vs[r * n + i]) for i in range(n)] for r in range(len(starts))]
        return self.talker.run_rows(embeds, cos, sin, caches, starts)  # type: ignore[arg-type]


def _record(module: nn.Module, inputs: Callable[[int], tuple[object, ...]]) -> Callable[..., Any]:
    """Trace ``module``'s forward on ``inputs(start)`` and run the recording at every warm position.

    Traced as a function where it can be: the weights enter the graph as constants (the same
    tensors), and TorchScript does not convert the talker's module tree, which made recording the
    one-row step 7x slower (0.6B int8, 2 cores: 1.15-1.26 s against 0.15-0.19 s, outputs bitwise
    equal). fbgemm's packed int8 weights (rows voxcast's kernel does not take) cannot be graph
    constants: such a step is traced as the module.
    TorchScript profiles a recording's first runs and then optimises it; those runs happen here,
    on scratch caches, rather than in a request.
    """

    def forward(*args: Any) -> Any:
        return module(*args)

    with warnings.catch_warnings():  # tracer notes on tensor-valued slice bounds and conditions
        warnings.simplefilter("ignore")
        try:
            step = torch.jit.trace(forward, inputs(_WARM_POSITIONS[0]), check_trace=False)
        except RuntimeError:  # fbgemm's packed weights: not a graph constant
            step = torch.jit.trace(module, inputs(_WARM_POSITIONS[0]), check_trace=False)
        for start in _WARM_POSITIONS:
            step(*inputs(start))
    return step


class TracedTalkerStep:
    """The recorded decode steps of one talker: one row, and batched rows by bucket (recorded by
    :meth:`prepare` / :meth:`prepare_rows` or on first use)."""

    def __init__(self, talker: Talker) -> None:
        self.talker = talker
        self._step: Callable[..., Any] | None = None
        self._rows: dict[int, Callable[..., Any]] = {}
        self._scratch: list[list[KVCache]] = []  # one-position caches of the filler rows

    @property
    def ready(self) -> bool:
        """Whether the one-row step is recorded."""
        return self._step is not None

    @property
    def row_buckets(self) -> list[int]:
        """Batch sizes whose batched step is recorded."""
        return sorted(self._rows)

    def _like(self, batch: int) -> Tensor:
        w = self.talker.codec_head.weight
        return torch.zeros(batch, 1, self.talker.cfg.hidden_size, dtype=w.dtype, device=w.device)

    @torch.inference_mode()
    def prepare(self) -> None:
        """Record the one-row step (no-op when recorded) and run it a few times, on a scratch cache."""
        if self._step is not None:
            return
        t0 = time.perf_counter()
        talker = self.talker
        cache = talker.new_cache(len(_WARM_POSITIONS) + 2)
        embeds = self._like(1)

        def inputs(start: int) -> tuple[object, ...]:
            cos, sin = talker.rope_at(start, embeds)
            ks, vs = [c.k for c in cache], [c.v for c in cache]
            return embeds, cos, sin, torch.tensor(start, device=embeds.device), ks, vs

        self._step = _record(_Step(talker), inputs)
        logger.info("recorded the talker's decode step in %.2f s", time.perf_counter() - t0)

    @torch.inference_mode()
    def prepare_rows(self, batch: int) -> None:
        """Record the batched step for ``batch`` rows (a bucket size, >= 2; no-op when recorded)."""
        if batch in self._rows:
            return
        t0 = time.perf_counter()
        talker = self.talker
        caches = [talker.new_cache(len(_WARM_POSITIONS) + 2) for _ in range(batch)]
        embeds = self._like(batch)
        self._rows[batch] = _record(
            _Rows(talker), lambda start: self._row_inputs(embeds, caches, [start] * batch)
        )
        logger.info("recorded the talker's step for %d rows in %.2f s", batch, time.perf_counter() - t0)

    def prepare_upto(self, max_batch: int) -> None:
        """Record the one-row step and the batched step of every bucket up to ``max_batch`` rows."""
        self.prepare()
        size = 2
        while size // 2 < max_batch:
            self.prepare_rows(size)
            size *= 2

    def _row_inputs(
        self, embeds: Tensor, caches: list[list[KVCache]], starts: list[int]
    ) -> tuple[object, ...]:
        cos, sin = self.talker.rope_rows(starts, embeds)
        device = embeds.device
        ks = [c.k for row in caches for c in row]
        vs = [c.v for row in caches for c in row]
        return embeds, cos, sin, [torch.tensor(s, device=device) for s in starts], ks, vs

    def step(self, embeds: Tensor, cache: list[KVCache], start: int) -> tuple[Tensor, Tensor]:
        """The talker step for one row at ``start``: ``(hidden [1, 1, H], logits [1, 1, vocab])``."""
        if self._step is None:
            self.prepare()
        assert self._step is not None
        for layer_cache in cache:  # growth happens here, outside the recording
            layer_cache.reserve(start + 1)
        cos, sin = self.talker.rope_at(start, embeds)
        pos = torch.tensor(start, device=embeds.device)
        out: tuple[Tensor, Tensor] = self._step(
            embeds, cos, sin, pos, [c.k for c in cache], [c.v for c in cache]
        )
        return out

    def rows(self, embeds: Tensor, caches: list[list[KVCache]], starts: list[int]) -> tuple[Tensor, Tensor]:
        """The batched step (:meth:`Talker.forward_rows`) from the recording of ``bucket(B)`` rows."""
        batch = embeds.shape[0]
        size = bucket(batch)
        if size not in self._rows:
            self.prepare_rows(size)
        for row, start in zip(caches, starts, strict=True):  # growth outside the recording
            for layer_cache in row:
                layer_cache.reserve(start + 1)
        fill = size - batch
        if fill:
            while len(self._scratch) < fill:
                self._scratch.append(self.talker.new_cache(1))
            embeds = torch.cat((embeds, embeds.new_zeros(fill, *embeds.shape[1:])))
            caches = caches + self._scratch[:fill]
            starts = starts + [0] * fill
        hidden, logits = self._rows[size](*self._row_inputs(embeds, caches, starts))
        return (hidden[:batch], logits[:batch]) if fill else (hidden, logits)


def use_traced_step(talker: Talker, enabled: bool = True) -> None:
    """Replay ``talker``'s decode step (one row and batched rows) from recordings (bitwise the same as
    the eager step at the same batch size); ``enabled=False`` goes back to the eager step."""
    talker.traced = TracedTalkerStep(talker) if enabled else None
