"""Graph-safe sampling for many streams at once (``VOXCAST_BATCH_GRAPHS``, :mod:`.batch_frames`).

The exact sampler (:mod:`..sampling`) draws with one ``torch.Generator`` per stream through
``torch.multinomial``, one row at a time in Python: its draws equal the official implementation's,
but a batch of B streams costs 16 B sampler calls a frame and nothing of it can be captured in a
CUDA graph. Here every row's settings live in tensors (``[R]`` each) and a frame's draws of all rows
are a fixed sequence of tensor operations, with no host sync and no per-row Python:

- **draws**: counter-based. Draw ``n`` of a row in ``domain`` (0: the talker's code 0, 1: the code
  predictor's codes) is a hash of ``(seed, domain, n, lane)`` (Wellons' ``lowbias32`` mixer on 32-bit
  words held in int64 tensors, products split so that nothing overflows), turned into uniform
  ``u in (0, 1)`` with 24 bits and exponential noise ``-log(u)``; the code is
  ``argmax(probs / noise)`` (an exact draw from ``probs``; gpt-fast samples the same way). A row's
  draws depend on its seed and counters only, never on which rows share its batch or their order.
- **warpers**: temperature, top-k (the k-th largest of a descending sort, per row) and top-p
  (transformers' ascending cumulative softmax) with per-row values; ``top_k == 0`` keeps every code,
  ``top_p == 1`` drops only codes already at ``-inf``.
- **talker rules**: repetition penalty over the codes this row drew, end-of-speech blocked for the
  first :data:`~..sampling.MIN_NEW_TOKENS` draws, the control tail suppressed (as :class:`~..sampling.TalkerSampler`).
- **greedy** rows take the argmax of the same scores, so greedy codes equal the exact sampler's.

The random draws therefore differ from the official sampler's (the promise is instead: the same
seed gives the same codes whatever else is batched, up to the float rounding of batched matmuls).
"""

from __future__ import annotations

import torch
from torch import Tensor

from voxcast.models.qwen3_tts.sampling import MIN_NEW_TOKENS, SUPPRESSED_TAIL, SamplerSettings

__all__ = ["RowSampling", "exponential_noise", "pick"]

_M32 = 0xFFFFFFFF
#: Domains of the counter-based draws (mixed into the key).
TALKER, CODES = 0x9E3779B9, 0x85EBCA6B


def _mul32(x: Tensor, c: int) -> Tensor:
    # (x * c) mod 2^32 for x in [0, 2^32) held in int64: 16-bit halves keep every product < 2^49
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & _M32


def _mix(x: Tensor) -> Tensor:
    """Wellons' ``lowbias32`` (https://nullprogram.com/blog/2018/07/31/) on int64-held words."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def exponential_noise(seed: Tensor, counter: Tensor, domain: int, lanes: Tensor) -> Tensor:
    """Exp(1) noise ``[B, V]`` float32 of draw ``counter [B]`` of each row's ``seed [B]`` (int64).

    ``lanes``: ``arange(V)`` (int64, on the device). Pure function of its inputs.
    """
    key = _mix(((seed >> 32) & _M32) ^ domain)
    key = _mix(key ^ (counter & _M32))
    key = _mix(key ^ (seed & _M32))  # [B]
    h = _mix(key[:, None] ^ lanes[None, :])
    h = _mix(h ^ 0x68E31DA4)  # [B, V]
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # (0, 1), never 0 or 1
    return -torch.log(u)


def pick(
    scores: Tensor,
    noise: Tensor,
    greedy: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
) -> Tensor:
    """Per-row codes ``[B]`` from float32 ``scores [B, V]`` and ``noise [B, V]`` (Exp(1)).

    ``greedy [B]`` bool, ``temperature [B]``, ``top_k [B]`` int64 (0: off), ``top_p [B]``.
    """
    v = scores.shape[-1]
    best = scores.argmax(-1)
    s = scores / temperature[:, None]
    k = torch.where(top_k > 0, top_k, v).clamp(1, v)
    kth = torch.sort(s, dim=-1, descending=True)[0].gather(1, (k - 1)[:, None])  # [B, 1]
    s = s.masked_fill(s < kth, -float("inf"))
    sorted_s, order = torch.sort(s, dim=-1)
    drop = sorted_s.softmax(-1).cumsum(-1) <= (1 - top_p)[:, None]
    drop[:, -1] = False  # keep at least one
    s = s.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    drawn = (s.softmax(-1) / noise).argmax(-1)
    return torch.where(greedy, best, drawn)


class RowSampling:
    """Sampling state of ``rows`` stream slots, all in tensors (``[R]`` or ``[R, V]``).

    Args:
        rows: slots.
        vocab_size, eos_id: the talker's vocabulary and end-of-speech id.
        code_vocab: the code predictor's vocabulary.
        device: where the tensors live.
    """

    def __init__(
        self, rows: int, vocab_size: int, eos_id: int, code_vocab: int, device: torch.device
    ) -> None:
        ids = torch.arange(vocab_size, device=device)
        self.eos = ids == eos_id  # [V]
        self.suppress = (ids >= vocab_size - SUPPRESSED_TAIL) & ~self.eos  # [V]
        self.lanes = ids
        self.code_lanes = torch.arange(code_vocab, device=device)
        long, flag = torch.long, torch.bool
        self.greedy = torch.zeros(rows, dtype=flag, device=device)
        self.temperature = torch.ones(rows, device=device)
        self.top_k = torch.zeros(rows, dtype=long, device=device)
        self.top_p = torch.ones(rows, device=device)
        self.penalty = torch.ones(rows, device=device)
        self.seed = torch.zeros(rows, dtype=long, device=device)
        self.samples = torch.zeros(rows, dtype=long, device=device)  # talker draws so far
        self.frames = torch.zeros(rows, dtype=long, device=device)  # code-predictor frames so far
        self.seen = torch.zeros(rows, vocab_size, dtype=flag, device=device)  # [R, V]

    def row_tensors(self) -> list[Tensor]:
        """Every per-row tensor (dim 0 = slot), for moving a row between slots."""
        return [
            self.greedy,
            self.temperature,
            self.top_k,
            self.top_p,
            self.penalty,
            self.seed,
            self.samples,
            self.frames,
            self.seen,
        ]

    def set_row(self, i: int, s: SamplerSettings, seed: int, seen: Tensor, samples: int) -> None:
        """Slot ``i`` takes a stream: its settings, seed, codes drawn so far (``seen [V]``) and count."""
        self.greedy[i] = s.greedy
        self.temperature[i] = max(s.temperature, 1e-5)
        self.top_k[i] = s.top_k
        self.top_p[i] = s.top_p
        self.penalty[i] = s.repetition_penalty
        self.seed[i] = seed & ((1 << 63) - 1)
        self.samples[i] = samples
        self.frames[i] = 0
        self.seen[i] = seen

    def talker_pick(self, logits: Tensor, step: Tensor) -> Tensor:
        """Code 0 ``[B]`` of rows ``[0, B)`` from float32 ``logits [B, V]``; rows with ``step [B]``
        False keep their state (their pick is discarded)."""
        b = logits.shape[0]
        p, seen, samples = self.penalty[:b, None], self.seen[:b], self.samples[:b]
        scores = torch.where(seen, torch.where(logits < 0, logits * p, logits / p), logits)
        scores = torch.where(self.eos & (samples < MIN_NEW_TOKENS)[:, None], -float("inf"), scores)
        scores = torch.where(self.suppress, -float("inf"), scores)
        noise = exponential_noise(self.seed[:b], samples, TALKER, self.lanes)
        code = self._pick(scores, noise, b)
        seen.scatter_(1, code[:, None], seen.gather(1, code[:, None]) | step[:, None])
        samples.add_(step.long())
        return code

    def code_pick(self, logits: Tensor, group: int) -> Tensor:
        """Code ``group + 1`` ``[B]`` of rows ``[0, B)`` from the code predictor's float32 ``logits``."""
        b = logits.shape[0]
        counter = self.frames[:b] * 15 + group
        noise = exponential_noise(self.seed[:b], counter, CODES, self.code_lanes)
        return self._pick(logits, noise, b)

    def end_frame(self, live: Tensor) -> None:
        """Count a code-predictor frame for the ``live [B]`` rows."""
        self.frames[: live.shape[0]].add_(live.long())

    def _pick(self, scores: Tensor, noise: Tensor, b: int) -> Tensor:
        return pick(scores, noise, self.greedy[:b], self.temperature[:b], self.top_k[:b], self.top_p[:b])
