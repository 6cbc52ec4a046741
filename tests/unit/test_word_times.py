"""Word timestamps: the words of a text (voxcast.text.words) and their times in a clip
(voxcast.audio.word_times), on synthetic clips whose every word's time is known."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from voxcast.audio.pcm import float_to_int16
from voxcast.audio.word_times import MIN_PAUSE_MS, estimate_word_times
from voxcast.text.words import CLAUSE, NONE, SENTENCE, split_words

SR = 24000
TEXT = (
    "Thanks for calling Acme support. Your order number 4471 shipped on Tuesday, and it should arrive "
    "within three business days. If you need anything else, press one; otherwise, stay on the line."
)


def _clip(text: str, rate=lambda i: 1.0, gap_s: float = 0.03, pause_s=None):
    """A clip speaking ``text``: a voiced burst per word (65 ms a unit of weight, times ``rate(i)``),
    ``gap_s`` of silence between words (shorter than a pause) and ``pause_s[i]`` after word ``i``
    (default: 0.4 s after a sentence end, 0.2 s after a comma). Returns it and each word's true span (ms)."""
    rng = np.random.default_rng(0)
    words = split_words(text)
    parts, spans, t = [np.zeros(int(SR * 0.25), np.float32)], [], 0.25
    for i, w in enumerate(words):
        d = w.weight * 0.065 * rate(i)
        tt = np.arange(int(SR * d)) / SR
        envelope = np.clip(np.minimum(tt, d - tt) / 0.01, 0, 1) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * tt))
        parts.append((0.3 * envelope * np.sin(2 * np.pi * (120 + 80 * rng.random()) * tt)).astype(np.float32))
        spans.append((t * 1000, (t + d) * 1000))
        t += d
        gap = {SENTENCE: 0.4, CLAUSE: 0.2}.get(w.pause, gap_s)
        if pause_s is not None and i in pause_s:
            gap = pause_s[i]
        if i == len(words) - 1:
            gap = 0.3
        parts.append(np.zeros(int(SR * gap), np.float32))
        t += gap
    return np.concatenate(parts), spans


def _errors(est, spans):
    return [max(abs(e.start_ms - s), abs(e.end_ms - f)) for e, (s, f) in zip(est, spans, strict=True)]


def test_words_keep_their_place_in_the_text() -> None:
    words = split_words("  Hello,  world. Pay $20 — now!")
    assert [w.text for w in words] == ["Hello,", "world.", "Pay", "$20 —", "now!"]
    text = "  Hello,  world. Pay $20 — now!"
    assert all(text[w.start : w.end] == w.text for w in words)
    assert [w.pause for w in words] == [CLAUSE, SENTENCE, NONE, CLAUSE, SENTENCE]
    assert words[3].weight > words[2].weight  # "$20" is read "twenty dollars"


def test_scripts_without_spaces_give_a_word_per_syllable() -> None:
    words = split_words("今日は晴れ。GPU「加速」")
    assert [w.text for w in words] == ["今", "日", "は", "晴", "れ。", "GPU", "「加", "速」"]
    assert words[4].pause == SENTENCE
    assert split_words("... ?!") == [] and split_words("") == []
    assert [w.pause for w in split_words('He said "stop." " Then')] == [NONE, NONE, SENTENCE, NONE]


def test_a_number_weighs_what_it_takes_to_read() -> None:
    """``4471`` is "four thousand four hundred seventy-one", not four times "four": a number weighs
    as read, and a long code digit by digit (each digit a short word)."""
    weights = {w.text: w.weight for w in split_words("7 42 471 4471 58213 Tuesday $20 m²")}
    assert weights["m²"] == 1 + 4  # a superscript digit is read on its own ("m squared")
    assert weights["7"] == 4 and weights["42"] == 8  # "seven", "forty-two"
    assert weights["471"] > weights["Tuesday"] * 2  # "four hundred seventy-one"
    assert weights["4471"] > weights["471"] > weights["42"]
    assert weights["58213"] == 5 * weights["7"]  # "five eight two one three"
    assert weights["$20"] == weights["42"] + 5  # the symbol read out, then the number


def test_every_word_is_timed_when_the_rate_is_even() -> None:
    pcm, spans = _clip(TEXT)
    est = estimate_word_times(TEXT, pcm, SR)
    assert [e.word for e in est] == [w.text for w in split_words(TEXT)]
    assert max(_errors(est, spans)) < 60  # the 30 ms gaps between words are shared out among them


def test_words_next_to_a_pause_are_exact_when_the_rate_changes() -> None:
    """The first clause is spoken 1.6x as slowly as the rest: proportion alone would misplace every
    word after it; the pauses at the punctuation put the words around them back in place."""
    pcm, spans = _clip(TEXT, rate=lambda i: 1.6 if i < 5 else 0.8)
    est = estimate_word_times(TEXT, pcm, SR)
    words = split_words(TEXT)
    for i, w in enumerate(words[:-1]):
        if w.pause != NONE:  # the word before the pause ends, and the one after starts, at its edges
            assert abs(est[i].end_ms - spans[i][1]) <= 20, (i, w.text)
            assert abs(est[i + 1].start_ms - spans[i + 1][0]) <= 20, (i + 1, words[i + 1].text)
    assert abs(est[0].start_ms - spans[0][0]) <= 10 and abs(est[-1].end_ms - spans[-1][1]) <= 10


def test_a_pause_without_punctuation_is_placed_at_the_nearest_boundary() -> None:
    """A speaker's pause between "three" and "business" (no comma there) still anchors both words."""
    words = split_words(TEXT)
    i = [w.text for w in words].index("three")
    pcm, spans = _clip(TEXT, pause_s={i: 0.25})
    est = estimate_word_times(TEXT, pcm, SR)
    assert abs(est[i].end_ms - spans[i][1]) <= 20 and abs(est[i + 1].start_ms - spans[i + 1][0]) <= 20


def test_times_are_ordered_and_inside_the_clip_whatever_the_audio() -> None:
    rng = np.random.default_rng(1)
    clips = {
        "noise with pauses": np.concatenate(
            [rng.normal(0, 0.1, SR // 3) if k % 2 == 0 else np.zeros(SR // 4) for k in range(9)]
        ).astype(np.float32),
        "one long burst": rng.normal(0, 0.1, SR * 2).astype(np.float32),
        "silence": np.zeros(SR, np.float32),
        "empty": np.zeros(0, np.float32),
    }
    for name, pcm in clips.items():
        est = estimate_word_times(TEXT, pcm, SR)
        assert len(est) == len(split_words(TEXT)), name
        clip_ms = 1000 * len(pcm) / SR
        for a, b in itertools.pairwise(est):
            assert a.start_ms <= a.end_ms <= b.start_ms, name
        assert est[0].start_ms >= 0 and est[-1].end_ms <= clip_ms + 1e-6, name
    silent = estimate_word_times("one two", np.zeros(SR, np.float32), SR)
    assert [(e.start_ms, e.end_ms) for e in silent] == [(0.0, 500.0), (500.0, 1000.0)]


def test_int16_audio_and_other_rates_give_the_same_times() -> None:
    pcm, _ = _clip(TEXT)
    ref = estimate_word_times(TEXT, pcm, SR)
    as_int = estimate_word_times(TEXT, float_to_int16(pcm), SR)
    at_8k = estimate_word_times(TEXT, pcm[::3], 8000)
    for a, b, c in zip(ref, as_int, at_8k, strict=True):
        assert abs(a.start_ms - b.start_ms) <= 10 and abs(a.start_ms - c.start_ms) <= 20
    assert ref[0].to_dict().keys() == {"word", "start_ms", "end_ms", "start_char", "end_char"}


@pytest.mark.parametrize("pause_ms", [MIN_PAUSE_MS - 30, MIN_PAUSE_MS + 30])
def test_only_silences_as_long_as_a_pause_anchor_words(pause_ms: float) -> None:
    """A comma's silence shorter than a pause is speech time; as long as one, it anchors the words."""
    text = "alpha beta gamma, delta"
    pcm, spans = _clip(text, rate=lambda i: 2.0 if i == 0 else 1.0, pause_s={2: pause_ms / 1000})
    est = estimate_word_times(text, pcm, SR)
    anchored = abs(est[3].start_ms - spans[3][0]) <= 20
    assert anchored == (pause_ms >= MIN_PAUSE_MS)
