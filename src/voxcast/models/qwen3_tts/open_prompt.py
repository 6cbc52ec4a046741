"""A streaming-text prompt whose text arrives in pieces (an LLM's tokens): exactly the prompt of the
whole text, fed as far as it is known.

In the streaming-text layouts (see :mod:`.prompt`) the talker reads one text token per frame after
the prefill. A token is final once the text after it has started a new pre-tokenizer piece
(:meth:`~.tokenizer.TextTokenizer.stable_prefix`), so :meth:`OpenPrompt.update` takes the text so
far, keeps its final tokens, and :meth:`OpenPrompt.text_row` hands decode step ``s`` its text input,
or None while that token is not final yet: the stream then waits (no frame step) instead of guessing.
The prefill is fixed once its text positions are: the first token for a named speaker, an
x-vector clone or VoiceDesign; for an ICL clone, enough target tokens to fill the positions aligned
with the reference frames (``len(ref codes) + 1`` minus the reference text's tokens).

Text rows are computed in the same aligned blocks as the whole-text prompt
(:meth:`~.prompt.PromptBuilder.text_rows`), so every position gets the bitwise value the whole
text would give it: with the same seed the frames equal those of the whole text synthesized at
once, whatever the pieces were.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from voxcast.errors import InvalidRequest
from voxcast.models.qwen3_tts.prompt import TEXT_BLOCK, OpenHead, PromptBuilder

__all__ = ["OpenPrompt"]

log = logging.getLogger(__name__)


class OpenPrompt:
    """A prompt that grows with its text (see the module docstring). Driven from one thread.

    Attributes:
        closed: the whole text is known.
        tokens: the final tokens of the target text so far.
        diverged: times a later text did not extend the tokens already fed (never expected: the
            pre-tokenizer guarantee of :meth:`~.tokenizer.TextTokenizer.stable_prefix`).
    """

    def __init__(self, builder: PromptBuilder, head: OpenHead) -> None:
        self._builder = builder
        self._h = head
        self.mode = head.mode
        self.voice = head.voice
        self.pad = head.pad
        self.prefix_len = head.prefix_len
        self.prefix_key = head.prefix_key
        self.tokens: list[int] = []
        self.closed = False
        self.diverged = 0
        self._embeds: Tensor | None = None
        self._blocks: dict[int, tuple[int, Tensor]] = {}  # block -> (ids it was computed with, rows)

    # -- text ----------------------------------------------------------------------------------
    def update(self, text: str, closed: bool) -> None:
        """The whole text so far (normalised like a request's text); ``closed``: it is complete.

        Raises:
            InvalidRequest: the complete text has no tokens (field "text").
        """
        if self.closed:
            return
        tokenizer = self._builder.tokenizer
        known = text if closed else tokenizer.stable_prefix(text)
        ids = self._builder.text_ids(known) if known.strip() else []
        n = len(self.tokens)
        if ids[:n] != self.tokens:
            self.diverged += 1
            log.warning("incremental text tokens diverged from the tokens already fed; keeping those")
            ids = self.tokens + ids[n:]
        if len(ids) >= n:
            self.tokens = ids
        self.closed = closed
        if closed and not self.tokens:
            raise InvalidRequest("text produced no tokens", field="text")

    @property
    def text_tokens(self) -> int:
        return len(self.tokens)

    @property
    def ready(self) -> bool:
        """Whether the prefill is determined (its text positions are final)."""
        if self.closed:
            return True
        if self._h.icl:
            return len(self._h.lead) + len(self.tokens) >= self._h.codec.shape[1]
        return bool(self.tokens)

    # -- the prompt ------------------------------------------------------------------------------
    @property
    def embeds(self) -> Tensor:
        """``[1, L, H]`` the prefill (only once :attr:`ready`)."""
        if self._embeds is None:
            if not self.ready:
                raise RuntimeError("the prefill is not determined yet: more text is needed")
            self._embeds = self._prefill()
        return self._embeds

    @property
    def length(self) -> int:
        return int(self._h.head.shape[1] + self._h.codec.shape[1])

    @torch.inference_mode()
    def _prefill(self) -> Tensor:
        h = self._h
        n_codec = int(h.codec.shape[1])
        if not h.icl:  # T(text[0]) + C(bos), as the whole-text prompt computes it (one row)
            first = torch.tensor([self.tokens[:1]], dtype=torch.long, device=h.head.device)
            return torch.cat((h.head, self._builder.talker.text_embed(first) + h.codec), dim=1)
        rows = [self._row(i) for i in range(min(n_codec, self._seq_len()))]
        if len(rows) < n_codec:  # closed, and text + eod shorter than the reference frames
            rows.append(h.eos)
            rows += [h.pad] * (n_codec - len(rows))
        return torch.cat((h.head, torch.cat(rows[:n_codec], dim=1) + h.codec), dim=1)

    def text_row(self, step: int) -> Tensor | None:
        """``[1, 1, H]`` the text input of decode step ``step``; None while that token is not final."""
        h = self._h
        i = (int(h.codec.shape[1]) + step) if h.icl else step  # index into the fed sequence
        n = self._seq_len()
        if i < n:
            return self._row(i)
        if not self.closed:
            return None
        if i == n:
            return h.eos
        return h.pad

    def _seq(self) -> list[int]:
        """The token sequence fed on the text track, block-aligned from its start: an ICL clone's
        reference text + the target text; otherwise the target text after its first token (that
        one is in the prefill)."""
        return self._h.lead + self.tokens if self._h.icl else self.tokens[1:]

    def _seq_len(self) -> int:
        return len(self._h.lead) + len(self.tokens) if self._h.icl else max(0, len(self.tokens) - 1)

    @torch.inference_mode()
    def _row(self, i: int) -> Tensor:
        b, r = divmod(i, TEXT_BLOCK)
        hit = self._blocks.get(b)
        if hit is None or hit[0] <= r:
            seq = self._seq()[b * TEXT_BLOCK : (b + 1) * TEXT_BLOCK]
            ids = torch.zeros((1, TEXT_BLOCK), dtype=torch.long, device=self._h.head.device)
            ids[0, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            hit = (len(seq), self._builder.text_block(ids))
            self._blocks[b] = hit
        return hit[1][:, r : r + 1]
