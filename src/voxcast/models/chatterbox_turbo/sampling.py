"""Turbo's token sampler: temperature, then top-k, then top-p, then the repetition penalty (the
official order, ``T3.inference_turbo``), each computed as ``transformers``' logits processor computes
it, then one multinomial draw from the stream's own generator (seeded: the draws the official code
makes from PyTorch's global generator seeded the same)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["TurboSampling", "process_logits", "sample"]


@dataclass(frozen=True)
class TurboSampling:
    """Turbo's sampling settings (the official defaults); ``greedy`` takes the most likely token."""

    temperature: float = 0.8
    top_k: int = 1000
    top_p: float = 0.95
    repetition_penalty: float = 1.2
    greedy: bool = False


def process_logits(logits: Tensor, previous: Tensor, s: TurboSampling) -> Tensor:
    """``logits [B, V]`` after the processors, given the tokens so far ``previous [B, T]`` (the official
    loop passes the start token before the first draw)."""
    scores = logits
    if s.temperature > 0 and s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k > 0:
        k = min(s.top_k, scores.shape[-1])
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))
    if s.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - s.top_p)
        remove[..., -1:] = 0
        scores = scores.masked_fill(remove.scatter(1, sorted_idx, remove), -float("inf"))
    if s.repetition_penalty != 1.0:
        seen = torch.gather(scores, 1, previous)
        seen = torch.where(seen < 0, seen * s.repetition_penalty, seen / s.repetition_penalty)
        scores = scores.scatter(1, previous, seen)
    return scores


def sample(logits: Tensor, previous: Tensor, s: TurboSampling, generator: torch.Generator | None) -> Tensor:
    """The next token ``[B, 1]``."""
    if s.greedy:
        return logits.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(process_logits(logits, previous, s), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
