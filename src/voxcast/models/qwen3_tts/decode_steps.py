"""What the talker and the code predictor ask of a faster decode step (the protocols they hold).

:class:`~.talker.Talker` and :class:`~.code_predictor.CodePredictor` read like the reference: plain
torch, eager. A speed-up of :mod:`voxcast.models.qwen3_tts.accel` may take over their per-step
forwards by setting an attribute to an object with these methods; the model files know only these
protocols, never the accel classes (so the model does not depend on its speed-ups, even for types):

- ``Talker.static`` / ``CodePredictor.static``: :class:`StaticSteps`, compiled static-shape steps
  (``accel.graphs.StaticDecode``, ``VOXCAST_COMPILE``);
- ``Talker.traced``: :class:`RecordedTalkerStep` (``accel.talker_trace.TracedTalkerStep``);
- ``CodePredictor.traced``: :class:`RecordedPredictorSteps` (``accel.cp_trace.TracedSteps``).
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from voxcast.models.qwen3_tts.kv_cache import KVCache

__all__ = ["RecordedPredictorSteps", "RecordedTalkerStep", "StaticSteps"]


class StaticSteps(Protocol):
    """Static-shape decode steps shared by a talker and its code predictor."""

    def cache_length(self, length: int) -> int:
        """The talker cache length these steps use for ``length`` positions (allocated whole)."""
        ...

    def talker_step(self, embeds: Tensor, cache: list[KVCache], start: int) -> tuple[Tensor, Tensor]:
        """One decode position of one stream: ``(hidden [1, 1, H], logits [1, 1, vocab])``."""
        ...

    def batch_rows(self, rows: int) -> int:
        """The rows a code-predictor step runs for ``rows`` streams (its shared cache's batch)."""
        ...

    def cp_step(self, embeds: Tensor, cache: list[KVCache], step: int) -> Tensor:
        """Normed hidden states ``[B, L, hidden]`` of intra-frame step ``step`` (0..14)."""
        ...

    def prepare(self, max_batch: int) -> None:
        """Build the steps for every batch up to ``max_batch`` streams (at warm-up)."""
        ...


class RecordedTalkerStep(Protocol):
    """The talker's decode step, one row and batched rows, replayed from recordings."""

    def step(self, embeds: Tensor, cache: list[KVCache], start: int) -> tuple[Tensor, Tensor]:
        """As :meth:`Talker.forward` for one position of one stream."""
        ...

    def rows(self, embeds: Tensor, caches: list[list[KVCache]], starts: list[int]) -> tuple[Tensor, Tensor]:
        """As :meth:`Talker.forward_rows`."""
        ...

    def prepare_upto(self, max_batch: int) -> None:
        """Record every batch size up to ``max_batch`` rows (at warm-up)."""
        ...


class RecordedPredictorSteps(Protocol):
    """The code predictor's intra-frame forwards, replayed from recordings."""

    def step(self, embeds: Tensor, index: int) -> Tensor:
        """Intra-frame forward ``index`` (0..14) of ``embeds [B, L, H]`` -> normed hidden states."""
        ...

    def prepare_upto(self, max_batch: int) -> None:
        """Record every batch size up to ``max_batch`` rows (at warm-up)."""
        ...
