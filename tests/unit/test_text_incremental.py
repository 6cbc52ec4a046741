"""SentenceBuffer: deltas split anywhere give the sentences of the whole text, each as soon as the
text after it has started."""

from __future__ import annotations

import random

import pytest

from voxcast.text.incremental import SentenceBuffer
from voxcast.text.split import split_sentences

TEXT = (
    "Dr. Smith arrived at 3 p.m. today. The U.S.A. team scored 3.5 points! 你好。今天很好。 Was it fine? Yes."
)


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_give_the_sentences_of_the_whole_text(seed: int) -> None:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), rng.randint(1, 30)))
    buffer, out = SentenceBuffer(), []
    for a, b in zip([0, *cuts], [*cuts, len(TEXT)], strict=True):
        out += buffer.push(TEXT[a:b])
    out += buffer.flush()
    assert out == split_sentences(TEXT)
    assert len(buffer) == 0


def test_a_sentence_comes_out_once_the_next_one_starts() -> None:
    buffer = SentenceBuffer()
    assert buffer.push("Hello there.") == []  # "there." might still be "there.com"
    assert buffer.push(" How") == ["Hello there."]
    assert buffer.push(" are you?") == []
    assert buffer.flush() == ["How are you?"]
    assert buffer.push("Dr.") == [] and buffer.push(" Smith") == []  # an abbreviation ends nothing
    buffer.clear()
    assert buffer.flush() == []
