"""Text handling before synthesis: :func:`~voxcast.text.normalize.normalize_text` (also the cache-key
form of a text), :func:`~voxcast.text.split.split_sentences` and :func:`~voxcast.text.split.plan_chunks`
(long-text planning)."""

from voxcast.text.normalize import normalize_text
from voxcast.text.split import plan_chunks, split_sentences

__all__ = ["normalize_text", "plan_chunks", "split_sentences"]
