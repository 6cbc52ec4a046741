"""Words of a text as a listener hears them: where each one is, how long it takes to say, and the
pause its punctuation calls for after it.

A word is a run of non-space characters, its punctuation attached (``"Hello,"``). Scripts written
without spaces are split further: every Han character and every kana is a word of its own (each is
about one syllable), so ``"今日は晴れ"`` gives five. A run of punctuation alone (a dash
between spaces, a quote) joins the word before it; an opening bracket or curly quote inside a token
starts the word after it.

The weight of a word estimates how long it takes to say, in letter-equivalents: one for a letter,
a number as long as it is read (``42`` "forty-two" 8, ``4471`` "four thousand four hundred
seventy-one" 26; five digits or more are read one by one, 4 each), three for a CJK character or a
Hangul syllable (one syllable each, about three letters of English), five for a symbol that is read
out (``%``, ``&``, ``@``...). Only ratios between weights matter.

``pause`` is what the punctuation at a word's end asks for: :data:`SENTENCE` after ``. ! ? …`` and
their full-width forms, :data:`CLAUSE` after ``, ; :``, dashes and their CJK forms, else :data:`NONE`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

__all__ = ["CLAUSE", "NONE", "SENTENCE", "Word", "split_words"]

NONE, CLAUSE, SENTENCE = 0, 1, 2
"""Pause strengths after a word."""

_TOKEN = re.compile(r"\S+")
_SYLLABIC = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff]")
"""Characters that are one syllable each in a script written without spaces (kana, Han)."""
_HANGUL = re.compile(r"[\uac00-\ud7a3]")
_SENTENCE_END = set(".!?…。！？．।؟۔")
_CLAUSE_END = set(",;:—–-，、；：")
_CLOSERS = set("\"')]}»”’」』）】〉》")
_OPENERS = set("([{«“‘「『（【〈《")
_READ_SYMBOLS = set("%&@#$€£¥+=§°")

_LETTER_WEIGHT, _SYLLABLE_WEIGHT, _SYMBOL_WEIGHT = 1.0, 3.0, 5.0
_NUMBER = re.compile(r"\d+")
_NUMBER_WEIGHT = {1: 4.0, 2: 8.0, 3: 18.0, 4: 26.0}
"""A run of digits read as a number, in letters: "7" seven, "42" forty-two, "471" four hundred
seventy-one, "4471" four thousand four hundred seventy-one (a year, "twenty twenty-six", is shorter);
longer runs are read digit by digit (phone, order and confirmation numbers), four letters each."""
_DIGIT_WEIGHT = 4.0


@dataclass(frozen=True, slots=True)
class Word:
    """One word of a text.

    Attributes:
        text: the word as written, punctuation included (``text[start:end]`` of the source).
        start: index of its first character in the source text.
        end: index one past its last character.
        weight: how long it takes to say, in letter-equivalents (see the module docstring).
        pause: the pause its punctuation calls for after it: NONE, CLAUSE or SENTENCE.
    """

    text: str
    start: int
    end: int
    weight: float
    pause: int


def _weight(token: str) -> float:
    total = sum(_NUMBER_WEIGHT.get(len(m), _DIGIT_WEIGHT * len(m)) for m in _NUMBER.findall(token))
    for ch in token:
        if _SYLLABIC.match(ch) or _HANGUL.match(ch):
            total += _SYLLABLE_WEIGHT
        elif ch.isdecimal():
            continue  # counted with its number above
        elif ch.isdigit():  # "²", "①": read on their own
            total += _DIGIT_WEIGHT
        elif ch.isalpha():
            total += _LETTER_WEIGHT
        elif ch in _READ_SYMBOLS:
            total += _SYMBOL_WEIGHT
        elif unicodedata.category(ch).startswith("M"):  # combining marks (Indic vowel signs...)
            total += _LETTER_WEIGHT / 2
    return total


def _pause(token: str) -> int:
    stripped = token.rstrip("".join(_CLOSERS))
    if not stripped:
        return NONE
    last = stripped[-1]
    if last in _SENTENCE_END:
        return SENTENCE
    if last in _CLAUSE_END:
        return CLAUSE
    return NONE


def _pieces(token: str, offset: int) -> list[tuple[str, int]]:
    """``token`` cut into one piece per syllabic character (with the punctuation after it) and per
    run of other characters between them."""
    out: list[tuple[str, int]] = []
    begin, spoken, syllabic = 0, False, False  # the current piece: start, has weight, has a syllable
    for i, ch in enumerate(token):
        is_syllable = bool(_SYLLABIC.match(ch))
        if spoken and (ch in _OPENERS or (_weight(ch) > 0 and (is_syllable or syllabic))):
            out.append((token[begin:i], offset + begin))
            begin, spoken, syllabic = i, False, False
        spoken = spoken or _weight(ch) > 0
        syllabic = syllabic or is_syllable
    out.append((token[begin:], offset + begin))
    return out


def split_words(text: str) -> list[Word]:
    """The words of ``text`` in order (see the module docstring); ``[]`` when it has none.

    A token of punctuation alone joins the word before it (or the one after, at the start).
    """
    out: list[Word] = []
    orphan: tuple[str, int] | None = None  # punctuation before the first word
    for m in _TOKEN.finditer(text):
        for piece, start in _pieces(m.group(), m.start()):
            end = start + len(piece)
            if _weight(piece) == 0:
                if out:
                    last = out[-1]
                    pause = max(last.pause, _pause(piece))  # 'end. "' keeps its sentence end
                    out[-1] = Word(text[last.start : end], last.start, end, last.weight, pause)
                elif orphan is None:
                    orphan = (piece, start)
                continue
            if orphan is not None:
                start, orphan = orphan[1], None
            out.append(Word(text[start:end], start, end, _weight(piece), _pause(piece)))
    return out
