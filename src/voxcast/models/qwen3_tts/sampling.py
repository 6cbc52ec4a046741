"""Code sampling, equal to the official generation (transformers' logits processors, same order and ops).

Talker (code 0 of each frame), in this order:
1. repetition penalty over every code 0 sampled so far (``s < 0 ? s * p : s / p``);
2. end-of-speech blocked for the first ``MIN_NEW_TOKENS`` samples;
3. codes ``vocab - 1024 .. vocab - 1`` suppressed except end-of-speech (2048..3071 but 2150);
4. when sampling: temperature, top-k, top-p, softmax, one ``torch.multinomial`` draw.
Greedy mode takes the argmax after steps 1-3, as transformers does with ``do_sample=False``.

Code predictor (codes 1..15): temperature, top-k, top-p and a draw (or the argmax); nothing else.

Draws come from one ``torch.Generator`` per stream, consumed in the official order (1 talker draw,
then 15 code-predictor draws per frame), so a seed reproduces the official output under
``torch.manual_seed(seed)``. Nothing here reads a tensor back to the host.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch
from torch import Tensor

from voxcast.models.base import SamplingParams

__all__ = [
    "MIN_NEW_TOKENS",
    "SUPPRESSED_TAIL",
    "CodeSampler",
    "SamplerSettings",
    "TalkerSampler",
    "make_generator",
    "warp",
]

#: End-of-speech is blocked for this many first code-0 samples (official ``min_new_tokens=2``).
MIN_NEW_TOKENS = 2

#: The last this-many codec ids (control and speaker ids) are never sampled, except end-of-speech.
SUPPRESSED_TAIL = 1024


@dataclass(frozen=True)
class SamplerSettings:
    """One stream's sampling settings (the same for the talker and the code predictor)."""

    greedy: bool = False
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05

    @classmethod
    def from_params(cls, p: SamplingParams) -> SamplerSettings:
        """From the request schema's :class:`~voxcast.engine.request.SamplingParams`."""
        return cls(p.greedy, p.temperature, p.top_k, p.top_p, p.repetition_penalty)


def make_generator(seed: int | None, device: torch.device | str) -> tuple[torch.Generator, int]:
    """A generator on ``device`` seeded with ``seed`` (or a fresh random seed); returns it and its seed."""
    if seed is None:
        seed = secrets.randbits(63)  # fits SamplingParams.seed, so a run can be replayed
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen, seed


def warp(scores: Tensor, s: SamplerSettings) -> Tensor:
    """Temperature, top-k and top-p on float32 ``scores [B, V]`` (transformers' warpers, in order)."""
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k:
        k = min(s.top_k, scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if s.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1 - s.top_p)
        drop[..., -1:] = False  # keep at least one
        scores = scores.masked_fill(drop.scatter(1, order, drop), -float("inf"))
    return scores


def _choose(scores: Tensor, s: SamplerSettings, gen: torch.Generator) -> Tensor:
    if s.greedy:
        return torch.argmax(scores, dim=-1)
    probs = torch.softmax(warp(scores, s), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=gen).squeeze(1)


class TalkerSampler:
    """Picks code 0 of each frame; remembers the codes it produced for the repetition penalty."""

    def __init__(
        self,
        vocab_size: int,
        eos_id: int,
        settings: SamplerSettings,
        gen: torch.Generator,
        *,
        batch: int = 1,
        device: torch.device | str = "cpu",
    ) -> None:
        self.settings = settings
        self.gen = gen
        self.samples = 0
        ids = torch.arange(vocab_size, device=device)
        self._eos = ids == eos_id  # [V]
        self._suppress = (ids >= vocab_size - SUPPRESSED_TAIL) & ~self._eos  # [V]
        self._seen = torch.zeros(batch, vocab_size, dtype=torch.bool, device=device)  # [B, V]

    def scores(self, logits: Tensor) -> Tensor:
        """Penalised and masked float32 scores ``[B, V]`` (steps 1-3) for ``logits [B, V]``."""
        p = self.settings.repetition_penalty
        if p != 1.0:
            penalised = torch.where(logits < 0, logits * p, logits / p)
            logits = torch.where(self._seen, penalised, logits)
        if self.samples < MIN_NEW_TOKENS:
            logits = torch.where(self._eos, -float("inf"), logits)
        return torch.where(self._suppress, -float("inf"), logits)

    def __call__(self, logits: Tensor) -> Tensor:
        """Pick code 0 (``[B]``) from float32 ``logits [B, V]``."""
        code = _choose(self.scores(logits), self.settings, self.gen)
        self._seen.scatter_(1, code[:, None], True)
        self.samples += 1
        return code


class CodeSampler:
    """Picks codes 1..15 for the code predictor (no penalty, no suppression)."""

    def __init__(self, settings: SamplerSettings, gen: torch.Generator) -> None:
        self.settings = settings
        self.gen = gen

    def __call__(self, logits: Tensor) -> Tensor:
        """Pick one code (``[B]``) from float32 ``logits [B, V]``."""
        return _choose(logits, self.settings, self.gen)
