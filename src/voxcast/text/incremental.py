"""Text that arrives piece by piece (an LLM's tokens, a pipe): complete sentences as soon as they are known.

A sentence is complete once text after it has started (the splitter then puts it apart from what
follows); what is left stays buffered until more text arrives or :meth:`SentenceBuffer.flush`. Used by
the WebSocket and ``voxcast synth --stdin``.
"""

from __future__ import annotations

from voxcast.text.split import split_sentences

__all__ = ["SentenceBuffer"]


class SentenceBuffer:
    """Accumulates deltas (split anywhere) and hands out complete sentences in order."""

    def __init__(self) -> None:
        self.text = ""

    def push(self, delta: str) -> list[str]:
        """Add ``delta``; the sentences it completed (possibly none)."""
        self.text += delta
        pieces = split_sentences(self.text)
        if len(pieces) < 2:
            return []
        start = self.text.rfind(pieces[-1])
        if start < 0:  # the splitter rewrote the last piece: keep everything until a flush
            return []
        self.text = self.text[start:]
        return pieces[:-1]

    def flush(self) -> list[str]:
        """Everything buffered, as sentences, whole or not; the buffer is then empty."""
        pieces, self.text = split_sentences(self.text), ""
        return pieces

    def clear(self) -> None:
        self.text = ""

    def __len__(self) -> int:
        return len(self.text)
