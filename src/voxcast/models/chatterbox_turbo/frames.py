"""Turbo's frame generator for the engine: one T3 speech token per step (25 a second).

The prefill (the text and the start token after the voice's cached conditioning prefix) draws the first
token; each step returns the next as a ``[1]`` tensor, None after the stop token or the frame limit.
T3's own limit (upstream's 1000 tokens, 40 s) also applies.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from voxcast.models.chatterbox_turbo.gpt2 import KVCache
from voxcast.models.chatterbox_turbo.sampling import TurboSampling
from voxcast.models.chatterbox_turbo.t3 import T3, TokenStream, next_many
from voxcast.models.chatterbox_turbo.t3_static import StaticT3
from voxcast.models.chatterbox_turbo.voice import TurboVoice

__all__ = ["MAX_TOKENS", "TurboFrames", "TurboPrompt", "step_many"]

#: Upstream's ``max_gen_len``.
MAX_TOKENS = 1000


@dataclass
class TurboPrompt:
    """One request's T3 input: its text's ids (after ``punc_norm``) and the voice."""

    text_ids: Tensor
    voice: TurboVoice
    prefix: KVCache | None = field(default=None, repr=False)
    conditioning: Tensor | None = field(default=None, repr=False)
    prefix_hit: bool = False
    #: T3 positions left after the prompt (its learned positions end at 8196)
    room: int = MAX_TOKENS


class TurboFrames:
    """A :class:`~voxcast.models.base.FrameGenerator` over T3's tokens."""

    waiting = False

    def __init__(
        self, t3: T3, prompt: TurboPrompt, sampling: TurboSampling, max_frames: int, seed: int | None
    ) -> None:
        self.t3, self.prompt, self.sampling = t3, prompt, sampling
        self.max_frames = max_frames
        self._seed = seed if seed is not None else random.getrandbits(63)
        self._stream: TokenStream | None = None
        self._first: int | None = None
        self._frames = 0
        self._finish: str | None = None
        self._prefill_s = 0.0
        self._prefilled = False
        self._t3_s = 0.0

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def finish_reason(self) -> str | None:
        return self._finish

    @property
    def prefill_s(self) -> float:
        return self._prefill_s

    def prefill(self) -> None:
        self.prefill_part(None)

    def prefill_part(self, max_positions: int | None) -> bool:
        """Run at most ``max_positions`` more prompt positions (all with None); True once complete
        (the first token drawn). In several parts the prefill equals the one-pass one up to float
        rounding."""
        if self._prefilled:
            return True
        t0 = time.perf_counter()
        if self._stream is None:
            p = self.prompt
            self._stream = self.t3.stream(
                p.text_ids,
                prefix=p.prefix,
                conditioning=p.conditioning if p.prefix is None else None,
                sampling=self.sampling,
                seed=self._seed,
                max_tokens=min(MAX_TOKENS, p.room),
            )
        if max_positions is None or self._stream.prefill_part(max_positions):
            self._first = self._stream.next()
            self._prefilled = True
        self._prefill_s += time.perf_counter() - t0
        return self._prefilled

    @property
    def batchable(self) -> bool:
        """Its next step is one T3 position (it can share a batched step: :func:`step_many`)."""
        s = self._stream
        return (
            s is not None and self._prefilled and s.steady and self._first is None and self._finish is None
            and self._frames < self.max_frames
        )  # fmt: skip

    def step(self) -> Tensor | None:
        if self._finish is not None:
            return None
        if not self._prefilled:
            self.prefill()
        assert self._stream is not None
        if self._frames >= self.max_frames:
            self._finish = "max_frames"
            self._release()
            return None
        t0 = time.perf_counter()
        token: int | None
        if self._first is not None:
            token, self._first = self._first, None
        else:
            token = self._stream.next() if not self._stream.done else None
        self._t3_s += time.perf_counter() - t0
        return self._emit(token)

    def _emit(self, token: int | None) -> Tensor | None:
        assert self._stream is not None
        if token is None:
            self._finish = "eos" if self._stream.tokens and self._stream_stopped() else "max_frames"
            self._release()
            return None
        self._frames += 1
        return torch.tensor([token], dtype=torch.long)

    def _release(self) -> None:
        """Give back the stream's static decode slot, if it holds one."""
        s = self._stream
        if s is not None and s.static is not None:
            s.static.release(s)

    def _stream_stopped(self) -> bool:
        assert self._stream is not None
        return int(self._stream.tokens[-1][0, 0]) == self.t3.cfg.stop_speech

    def stage_ms(self) -> dict[str, float]:
        """T3's time, reported as the timing record's ``talker_ms`` (the autoregressive model's)."""
        return {"talker_ms": self._t3_s * 1000}

    def prefix_report(self) -> tuple[bool, int] | None:
        p = self.prompt
        if p.prefix is None:
            return None
        return (p.prefix_hit, p.prefix.length)


def step_many(
    t3: T3, generators: list[TurboFrames], batch: bool = True, static: StaticT3 | None = None
) -> list[Tensor | None]:
    """One token for each generator: those in the middle of their speech share one batched T3 step
    (``batch``), the others (a first token waiting, a limit reached) step alone. With ``static``, the
    steady ones that have or get a slot there share its fixed-shape step (:mod:`.t3_static`)."""
    out: list[Tensor | None] = [None] * len(generators)
    rows = [i for i, g in enumerate(generators) if g.batchable] if batch else []
    if static is not None and rows:
        slotted = [i for i in rows if _admit(static, generators[i])]
        if slotted:
            t0 = time.perf_counter()
            tokens = static.step([_stream_of(generators[i]) for i in slotted])
            share = (time.perf_counter() - t0) / len(slotted)
            for i, token in zip(slotted, tokens, strict=True):
                generators[i]._t3_s += share
                out[i] = generators[i]._emit(token)
        rows = [i for i in rows if i not in set(slotted)]
        if len(rows) <= 1:  # a lone stream left over steps alone below
            rows = []
        done = set(slotted)
    else:
        done = set()
    if len(rows) > 1:
        t0 = time.perf_counter()
        tokens = next_many(t3, [s for s in (generators[i]._stream for i in rows) if s is not None])
        share = (time.perf_counter() - t0) / len(rows)
        for i, token in zip(rows, tokens, strict=True):
            generators[i]._t3_s += share
            out[i] = generators[i]._emit(token)
    batched = (set(rows) if len(rows) > 1 else set()) | done
    for i, g in enumerate(generators):
        if i not in batched:
            out[i] = g.step()
    return out


def _stream_of(g: TurboFrames) -> TokenStream:
    assert g._stream is not None
    return g._stream


def _admit(static: StaticT3, g: TurboFrames) -> bool:
    """Whether ``g``'s stream decodes in ``static`` (a slot it holds or takes now)."""
    return static.admit(_stream_of(g)) is not None
