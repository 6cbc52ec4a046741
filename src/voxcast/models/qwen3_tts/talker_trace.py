"""The talker's one-row decode step, recorded once and replayed without Python (CPU).

A decode step runs the talker's 28 layers for one new position; on a CPU with int8 weights about a
third of its time was Python dispatching ~40 small operations per layer (0.6B int8, 2 cores: 37 ms
per step eager, 25 ms replayed). Unlike the code predictor's steps (:mod:`.cp_trace`), the talker's
position changes every frame, so the position goes into the recording as a 0-dim tensor: the tracer
records slices whose bounds are tensors as dynamic slices, so writing the new keys/values at
``start`` and attending over ``[0, start + 1)`` stay correct for every position, and the caches are
inputs (their tensors are replaced when they grow). Everything else in a step has fixed shapes. The
replay runs the same ATen operations on the same inputs in the same order as the eager step, so the
outputs are bitwise equal (tested at every position across cache growth), which keeps official
parity. Only one row (B = 1, the single-stream case) is recorded; batched rows run eagerly.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from voxcast.models.qwen3_tts.kv_cache import KVCache

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.talker import Talker

__all__ = ["TracedTalkerStep"]

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


class TracedTalkerStep:
    """The recorded one-row decode step of one talker (recorded by :meth:`prepare` or on first use)."""

    def __init__(self, talker: Talker) -> None:
        self.talker = talker
        self._step: torch.jit.ScriptModule | None = None

    @property
    def ready(self) -> bool:
        """Whether the step is recorded."""
        return self._step is not None

    @torch.inference_mode()
    def prepare(self) -> None:
        """Record the step (no-op when recorded) and run it a few times, on a scratch cache."""
        if self._step is not None:
            return
        t0 = time.perf_counter()
        talker = self.talker
        w = talker.codec_head.weight
        cache = talker.new_cache(len(_WARM_POSITIONS) + 2)
        embeds = torch.zeros(1, 1, talker.cfg.hidden_size, dtype=w.dtype, device=w.device)

        def inputs(start: int) -> tuple[object, ...]:
            cos, sin = talker.rope_at(start, embeds)
            ks, vs = [c.k for c in cache], [c.v for c in cache]
            return embeds, cos, sin, torch.tensor(start, device=w.device), ks, vs

        with warnings.catch_warnings():  # tracer notes on tensor-valued slice bounds and conditions
            warnings.simplefilter("ignore")
            step = torch.jit.trace(_Step(talker), inputs(_WARM_POSITIONS[0]), check_trace=False)
        for start in _WARM_POSITIONS:
            step(*inputs(start))
        self._step = step
        logger.info("recorded the talker's decode step in %.2f s", time.perf_counter() - t0)

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
