"""The voice prompt's part of S3Gen's flow, computed once per voice instead of in every streamed window.

Every flow call runs over ``[voice prompt | new tokens]``: the encoder's and the estimator's attention
see every row, so the prompt's rows (up to 250 tokens, 500 frames: most of a streamed window) depend on
the new tokens, and a stream recomputes them in every window (docs/chatterbox-turbo.md).
A :class:`PromptCache` records the prompt's rows computed **as if the prompt were alone** (its keys and
values at every attention layer and Euler step, the frames each causal convolution needs as left
context); a window then computes only its new rows, which attend to the cached keys and values and
continue the cached convolutions. The new rows' computation is exact given the prompt's rows; what
changes is that the prompt's rows no longer see the new tokens (their attention, and the encoder's
3-token look-ahead at the prompt's end). The cost of a window becomes that of its new rows, and the
difference from the exact window is measured in docs/chatterbox-turbo.md (SNR against the one-pass
decode with the same noise).

The modules take an optional cache: recording (a pass over the prompt alone) or reading (a pass over
new rows). A cache is read-only once recorded, so one voice's cache serves any number of streams and
threads. Batches of new rows read a batch-1 cache (expanded); rows of several streams (other voices,
other lengths) read :class:`~.s3gen_rows.PaddedRows`, a subclass that also masks their padding (the
hooks :attr:`PromptCache.continues`, :meth:`PromptCache.key_mask` and :meth:`PromptCache.zero_padding`
are no-ops here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["PromptCache"]


class PromptCache:
    """What a voice prompt contributes to every layer of the flow (see the module docstring).

    Args:
        prompt_tokens: the prompt's length in speech tokens (the new rows' position offset).
    """

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.recording = True
        self.step = 0  # the Euler step this view reads or records (the estimator's state differs per step)
        self._store: dict[tuple[int, nn.Module, str], Tensor] = {}

    def at(self, step: int) -> PromptCache:
        """A view of the same cache at Euler step ``step`` (views are per call, so threads that read
        one cache at once never share a step)."""
        view = PromptCache.__new__(PromptCache)
        view.prompt_tokens, view.recording, view.step, view._store = (
            self.prompt_tokens,
            self.recording,
            step,
            self._store,
        )
        return view

    def freeze(self) -> PromptCache:
        """End recording: from now on the cache is read (and never written)."""
        self.recording = False
        return self

    @property
    def continues(self) -> bool:
        """Whether the rows continue a recorded prompt (reading it): False while recording."""
        return not self.recording

    def key_mask(self, keys: int) -> Tensor | None:
        """Which of an attention's ``keys`` keys each row attends to (``[B, 1, 1, keys]`` bool); None:
        all of them (one stream's rows are never padded)."""
        return None

    def zero_padding(self, x: Tensor) -> Tensor:
        """``x [B, C, T]`` (one column a token) with the padding columns zeroed: ``x`` itself here."""
        return x

    def tensors(self) -> dict[tuple[int, nn.Module, str], Tensor]:
        """What was recorded, by (Euler step, module, what): ``"k"`` / ``"v"`` an attention's keys or
        values ``[1, h, rows, d]``; ``""`` a convolution's left context ``[1, C, frames]``."""
        return dict(self._store)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._store.values())

    def remember(self, module: nn.Module, tensor: Tensor, what: str = "") -> None:
        self._store[(self.step, module, what)] = tensor

    def recall(self, module: nn.Module, batch: int, what: str = "") -> Tensor:
        t = self._store[(self.step, module, what)]
        return t if t.shape[0] == batch else t.expand(batch, *t.shape[1:])

    def left_context(self, module: nn.Module, x: Tensor, frames: int) -> Tensor:
        """``x [B, C, T]`` with ``frames`` frames of left context for a causal convolution: zeros while
        recording (the prompt starts the sequence; its last ``frames`` are remembered), the prompt's
        last frames while reading."""
        if self.recording:
            self.remember(module, F.pad(x, (frames, 0))[..., -frames:])
            return F.pad(x, (frames, 0))
        return torch.cat((self.recall(module, x.shape[0]), x), dim=-1)

    def keys_values(self, module: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """An attention's keys and values ``[B, h, T, d]``: the prompt's alone while recording (and
        remembered), the prompt's then the new rows' while reading."""
        if self.recording:
            self.remember(module, k, "k")
            self.remember(module, v, "v")
            return k, v
        b = k.shape[0]
        return (
            torch.cat((self.recall(module, b, "k"), k), dim=2),
            torch.cat((self.recall(module, b, "v"), v), dim=2),
        )
