"""Word timestamps estimated from a clip and the text it speaks.

Neither model family aligns its output to its text (Qwen3-TTS and Chatterbox Turbo generate speech
tokens with no duration per word), so the times are an estimate, made from what the audio shows:

1. Where speech starts and ends, and the pauses inside it: runs of 10 ms frames more than
   :data:`PAUSE_THRESHOLD_DB` below the loudest frame, at least :data:`MIN_PAUSE_MS` long.
2. Which word boundary each pause belongs to: the most probable placement of all pauses at once
   (dynamic programming over the pauses in order). Each stretch of words between two placed pauses
   should take about as long as their weights (:mod:`voxcast.text.words`) predict at the clip's
   overall rate; punctuation that calls for a pause (a sentence end more than a comma) makes a
   pause there likelier; a pause that fits no boundary stays inside a word (a stop, a breath).
3. Between two placed pauses, the words share the time in proportion to their weights.

So a word next to a pause (the first and last words of sentences and clauses) is placed about as
exactly as the pause detection (one 10 ms frame); a word inside a long clause is off by however much
its own speaking rate differs from its neighbours' (on the order of 100 ms). On eSpeak NG's speech,
whose true word times are known, the start error is 55 ms at the median and 185 ms at the 90th
percentile (scripts/bench_word_times.py, docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from voxcast.audio.files import file_samples
from voxcast.audio.formats import AudioFormat
from voxcast.audio.pcm import to_float32
from voxcast.audio.trim import DEFAULT_FLOOR_DBFS, active_frames
from voxcast.text.words import CLAUSE, SENTENCE, Word, split_words

__all__ = ["MIN_PAUSE_MS", "PAUSE_THRESHOLD_DB", "WordTime", "estimate_word_times", "file_word_times"]

PAUSE_THRESHOLD_DB = -40.0
"""A frame this far below the loudest one is silent (quiet fricatives sit ~30 dB down)."""
MIN_PAUSE_MS = 120.0
"""Shortest silence that counts as a pause between words (stop closures last up to ~100 ms)."""
_FRAME_MS = 10.0
_PRIOR = {CLAUSE: 2.0, SENTENCE: 3.0}
"""How much likelier a pause is after a comma or a sentence end than after a bare word (log odds)."""
_SKIP_COST = 3.0
"""Log odds against a pause that falls inside a word (a stop, a breath): it then belongs to no boundary."""
_RATE_SPREAD = 0.35
"""Relative spread of one word's duration around what its weight predicts (a std)."""
_SEGMENT_SPREAD = 0.3
"""Relative spread of a whole stretch's rate around the clip's (sentences differ in pace)."""
_WORD_WEIGHT = 5.0
"""A typical word's weight: the unit of that spread."""
_MAX_SKIPPED = 8
"""Longest run of pauses placed nowhere between two placed ones (each costs :data:`_SKIP_COST`)."""
_WINDOW = 48
"""Boundaries considered for one pause: those nearest to where the overall rate puts it."""
_MAX_PAUSES = 200
"""At most this many pauses anchor words (the longest ones); shorter ones stay inside words."""


@dataclass(frozen=True, slots=True)
class WordTime:
    """When one word is heard, in milliseconds from the start of the clip.

    Attributes:
        word: the word as written (punctuation attached).
        start_ms: when it starts.
        end_ms: when it ends.
        start_char: index of its first character in the text.
        end_char: index one past its last character.
    """

    word: str
    start_ms: float
    end_ms: float
    start_char: int
    end_char: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "word": self.word,
            "start_ms": round(self.start_ms, 1),
            "end_ms": round(self.end_ms, 1),
            "start_char": self.start_char,
            "end_char": self.end_char,
        }


def _pauses(active: np.ndarray, min_frames: int) -> list[tuple[int, int]]:
    """Runs ``[start, end)`` of at least ``min_frames`` inactive frames between active ones."""
    gaps = np.diff(active) - 1
    return [(int(active[i]) + 1, int(active[i + 1])) for i in np.nonzero(gaps >= min_frames)[0]]


class _Aligner:
    """Which word boundary each pause belongs to: the most probable assignment (dynamic programming
    over the pauses, in order). Each stretch between two placed pauses costs how unlikely its words
    are to take that long at the clip's overall rate (a squared z-score); a pause placed after a
    comma or a sentence end earns its punctuation's log odds; a pause placed nowhere costs
    :data:`_SKIP_COST`."""

    def __init__(self, words: list[Word], speech_at: np.ndarray, speech_ms: float) -> None:
        self.cum = np.concatenate([[0.0], np.cumsum([w.weight for w in words])])
        self.n = len(words)
        self.at = speech_at  # [P] speech time (pauses excluded) before each pause
        self.rate = speech_ms / max(float(self.cum[-1]), 1e-9)  # ms per unit of weight
        self.end = speech_ms
        self.prior = np.array([0.0] + [_PRIOR.get(w.pause, 0.0) for w in words])  # [n + 1] by boundary

    def _segment(self, b0: np.ndarray, t0: np.ndarray, b1: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """Cost of words ``b0..b1`` taking ``t1 - t0`` ms (broadcast); inf where ``b1 <= b0``."""
        dw = self.cum[b1] - self.cum[b0]
        expected = self.rate * dw
        var = (_RATE_SPREAD * self.rate) ** 2 * np.maximum(dw, 1e-9) * _WORD_WEIGHT + (
            _SEGMENT_SPREAD * expected
        ) ** 2
        cost = 0.5 * (t1 - t0 - expected) ** 2 / var
        return np.where(b1 > b0, cost, np.inf)

    def _window(self, t: float) -> np.ndarray:
        """The boundaries ``1..n-1`` nearest to where the overall rate puts speech time ``t``."""
        centre = int(np.searchsorted(self.cum, t / self.rate))
        lo = max(1, min(centre - _WINDOW // 2, self.n - _WINDOW))
        return np.arange(lo, min(self.n, lo + _WINDOW))

    def place(self) -> list[tuple[int, int]]:
        """``(boundary, pause)`` pairs, boundaries increasing (``b``: between words ``b - 1`` and ``b``)."""
        pauses = len(self.at)
        cands = [self._window(float(t)) for t in self.at]
        best: list[np.ndarray] = []  # [P][K]: cost of the best path with pause j at cands[j][k]
        back: list[np.ndarray] = []  # [P][K, 2]: (previous pause or -1, its candidate index)
        for j in range(pauses):
            cost = self._segment(np.array([0]), np.array([0.0]), cands[j], self.at[j]) + _SKIP_COST * j
            prev = np.full((len(cands[j]), 2), -1)
            for i in range(max(0, j - _MAX_SKIPPED - 1), j):
                step = self._segment(cands[i][:, None], self.at[i], cands[j][None, :], self.at[j])
                total = best[i][:, None] + step + _SKIP_COST * (j - i - 1)
                k = np.argmin(total, axis=0)
                better = total[k, np.arange(len(cands[j]))] < cost
                cost = np.where(better, total[k, np.arange(len(cands[j]))], cost)
                prev[better] = np.stack([np.full(int(better.sum()), i), k[better]], axis=1)
            best.append(cost - self.prior[cands[j]])
            back.append(prev)
        return self._backtrack(cands, best, back)

    def _backtrack(
        self, cands: list[np.ndarray], best: list[np.ndarray], back: list[np.ndarray]
    ) -> list[tuple[int, int]]:
        pauses = len(self.at)
        end_b, end_t = np.array([self.n]), np.array([self.end])
        finish = [(_SKIP_COST * pauses, -1, -1)]  # no pause placed
        for j in range(pauses):
            total = (
                best[j] + self._segment(cands[j], self.at[j], end_b, end_t) + _SKIP_COST * (pauses - j - 1)
            )
            k = int(np.argmin(total))
            finish.append((float(total[k]), j, k))
        _, j, k = min(finish)
        out: list[tuple[int, int]] = []
        while j >= 0:
            out.append((int(cands[j][k]), j))
            j, k = (int(v) for v in back[j][k])
        return out[::-1]


def _spread(words: list[Word], first: int, last: int, t0: float, t1: float, out: list[WordTime]) -> None:
    """Words ``first..last - 1`` over ``[t0, t1]`` in proportion to their weights, appended to ``out``."""
    weights = np.array([w.weight for w in words[first:last]], dtype=np.float64)
    edges = t0 + (t1 - t0) * np.concatenate([[0.0], np.cumsum(weights)]) / max(float(weights.sum()), 1e-9)
    for k, w in enumerate(words[first:last]):
        out.append(WordTime(w.text, float(edges[k]), float(edges[k + 1]), w.start, w.end))


def estimate_word_times(text: str, pcm: np.ndarray, sample_rate: int) -> list[WordTime]:
    """Estimated start and end of every word of ``text`` in ``pcm`` (see the module docstring).

    Args:
        text: what the clip says (character offsets refer to it).
        pcm: mono samples (float32 in [-1, 1], or int16).
        sample_rate: samples per second.

    Returns:
        One :class:`WordTime` per word (:func:`voxcast.text.words.split_words`), in order, each
        within the clip and none overlapping the next; ``[]`` for a text without words. A silent
        clip gets its words spread over its whole length.
    """
    words = split_words(text)
    if not words:
        return []
    x = to_float32(pcm)
    active, frame = active_frames(x, sample_rate, PAUSE_THRESHOLD_DB, DEFAULT_FLOOR_DBFS, _FRAME_MS)
    ms = 1000.0 * frame / sample_rate  # one frame
    clip_ms = 1000.0 * len(x) / sample_rate
    out: list[WordTime] = []
    if len(active) == 0:
        _spread(words, 0, len(words), 0.0, clip_ms, out)
        return out
    speech = (int(active[0]) * ms, min(clip_ms, (int(active[-1]) + 1) * ms))
    pauses = [(s * ms, e * ms) for s, e in _pauses(active, round(MIN_PAUSE_MS / _FRAME_MS))]
    if len(pauses) > _MAX_PAUSES:
        pauses = sorted(sorted(pauses, key=lambda p: p[0] - p[1])[:_MAX_PAUSES])
    lengths = np.array([e - s for s, e in pauses])
    starts = np.array([s for s, _ in pauses]) - speech[0]
    speech_at = starts - np.concatenate([[0.0], np.cumsum(lengths)[:-1]]) if pauses else np.zeros(0)
    first, t0 = 0, speech[0]
    placed = (
        _Aligner(words, speech_at, speech[1] - speech[0] - float(lengths.sum())).place()
        if len(words) > 1
        else []
    )
    for boundary, j in placed:
        _spread(words, first, boundary, t0, pauses[j][0], out)
        first, t0 = boundary, pauses[j][1]
    _spread(words, first, len(words), t0, speech[1], out)
    return out


def file_word_times(text: str, file: bytes, format: AudioFormat, sample_rate: int) -> list[WordTime]:
    """:func:`estimate_word_times` of a complete file (decoded: an MP3's or AAC's times include the
    encoder's delay, about 45 ms, as a player that ignores it would hear).

    Raises:
        ValueError: the file does not decode as ``format``.
    """
    pcm, rate = file_samples(file, format, sample_rate)
    return estimate_word_times(text, pcm, rate)
