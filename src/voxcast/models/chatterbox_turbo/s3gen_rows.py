"""Rows of several streams in one flow call: each padded to the longest, masked so it computes what it
would alone.

A streamed flow window is short (a voice prompt's cached rows plus some 20-60 new tokens), so on a GPU
its cost is kernel launches, not arithmetic; several streams' windows in one batched call share the
launches (:mod:`.s3gen_batch`). Their lengths differ, and with the prompt cache on so do their voices'
prompts. :class:`PaddedRows` lays the rows out so that every module computes each row's values exactly
as it does for that row alone, up to float rounding of other matrix shapes:

- new rows are padded on the right (to the longest window): the causal convolutions look left only;
  the encoder's look-ahead convolution sees zeros past a row's end (:meth:`PaddedRows.zero_padding`),
  as it does alone;
- cached prompts (``prompts``) are padded on the left (to the longest prompt), so a row's last prompt
  key sits right before its first new row: the relative positions the encoder's attention reads are
  differences of layout positions, the same as alone; a causal convolution's cached left context is
  the prompt's last frames whatever its length;
- every attention masks the padding's keys (:meth:`PaddedRows.key_mask`); no row is all padding, so
  no softmax row is empty.

Without prompt caches (``prompts`` None: the exact windows, each row ``[its prompt | its window]``) it
is the padding alone. Padding rows compute garbage that nothing real reads.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache

__all__ = ["PaddedRows"]


class _Stacked:
    """Several voices' recorded prompt caches as one batch: each tensor ``[U, ...]``, keys and values
    left-padded to the longest prompt."""

    def __init__(self, voices: tuple[PromptCache, ...]) -> None:
        longest = max(c.prompt_tokens for c in voices)
        recorded = [c.tensors() for c in voices]
        self.store = {}
        for key, first in recorded[0].items():
            parts = [r[key] for r in recorded]
            if key[2] in ("k", "v"):  # [1, h, scale * P, d]: left-pad to the longest prompt
                scale = first.shape[2] // voices[0].prompt_tokens  # 1 a token, 2 a frame
                pads = [scale * (longest - c.prompt_tokens) for c in voices]
                parts = [F.pad(t, (0, 0, pad, 0)) for t, pad in zip(parts, pads, strict=True)]
            self.store[key] = torch.cat(parts) if len(parts) > 1 else parts[0]


@functools.lru_cache(maxsize=2)
def _stacked(voices: tuple[PromptCache, ...]) -> _Stacked:
    """The stack of a set of voices' caches (ordered by ``id``), kept for the next calls of the same
    voices, whatever their rows (a stack copies every voice's cache: up to ~245 MB each at full size,
    hence two sets)."""
    return _Stacked(voices)


class PaddedRows(PromptCache):
    """Several streams' rows in one flow call (see the module docstring); read-only, like a frozen
    :class:`PromptCache`.

    Args:
        lengths: each row's tokens (its new tokens; with ``prompts`` None its prompt's and new ones).
        prompts: each row's recorded prompt cache (a voice's; rows may share one), or None.
        device: where the masks live (the model's).
    """

    def __init__(
        self, lengths: Sequence[int], prompts: Sequence[PromptCache] | None, device: torch.device
    ) -> None:
        sizes = [c.prompt_tokens for c in prompts] if prompts is not None else [0] * len(lengths)
        super().__init__(max(sizes))
        self.recording = False
        self._stack: _Stacked | None = None
        #: the voice (of the stack) each row reads; None: row i reads voice i, or all read one voice
        self._index: Tensor | None = None
        if prompts is not None:
            voices = tuple(sorted(set(prompts), key=id))
            self._stack = _stacked(voices)
            if len(voices) > 1 and list(prompts) != list(voices):
                rows = torch.tensor([voices.index(c) for c in prompts])
                self._index = rows.to(device, non_blocking=True)
        longest = max(lengths)
        self._tokens = self.prompt_tokens + longest  # layout columns a token: [prompts | new rows]
        self._valid: Tensor | None = None
        if any(n != longest for n in lengths) or any(p != self.prompt_tokens for p in sizes):
            cols = torch.arange(self._tokens)[None, :]
            first = torch.tensor([self.prompt_tokens - p for p in sizes])[:, None]
            end = torch.tensor([self.prompt_tokens + n for n in lengths])[:, None]
            self._valid = ((cols >= first) & (cols < end)).to(device, non_blocking=True)  # [B, P + T]
        self._masks: dict[int, Tensor] = {}

    def at(self, step: int) -> PaddedRows:
        view = PaddedRows.__new__(PaddedRows)
        view.__dict__.update(self.__dict__)
        view.step = step
        return view

    @property
    def continues(self) -> bool:
        return self._stack is not None

    def remember(self, module: nn.Module, tensor: Tensor, what: str = "") -> None:
        raise RuntimeError("padded rows read prompt caches; they record none")

    def recall(self, module: nn.Module, batch: int, what: str = "") -> Tensor:
        assert self._stack is not None
        t = self._stack.store[(self.step, module, what)]
        if self._index is not None:
            return t.index_select(0, self._index)
        return t if t.shape[0] == batch else t.expand(batch, *t.shape[1:])

    def left_context(self, module: nn.Module, x: Tensor, frames: int) -> Tensor:
        if self._stack is None:
            return F.pad(x, (frames, 0))
        return super().left_context(module, x, frames)

    def keys_values(self, module: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self._stack is None:
            return k, v
        return super().keys_values(module, k, v)

    def key_mask(self, keys: int) -> Tensor | None:
        """``[B, 1, 1, keys]``: a row's prompt and new columns (``keys`` is one or two layout columns
        a token: the encoder before or after its upsampling, the estimator's frames); None when no row
        is padded."""
        if self._valid is None:
            return None
        mask = self._masks.get(keys)
        if mask is None:
            scale, rest = divmod(keys, self._tokens)
            if rest or not scale:
                raise ValueError(f"{keys} keys do not fit {self._tokens} columns a scale")
            mask = self._valid.repeat_interleave(scale, dim=1)[:, None, None, :]
            self._masks[keys] = mask
        return mask

    def zero_padding(self, x: Tensor) -> Tensor:
        """``x [B, C, T]`` (new rows, a column a token) with each row's columns past its end zeroed."""
        if self._valid is None:
            return x
        return torch.where(self._valid[:, None, self.prompt_tokens :], x, 0.0)
