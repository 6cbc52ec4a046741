"""Sentence splitting and long-text planning.

:func:`split_sentences` finds sentence ends: ``.``, ``!``, ``?`` and ``…`` followed by whitespace (or
the end), after any closing quotes/brackets; the CJK and other full-width enders ``。！？．`` plus
``।`` (danda), ``؟`` and ``۔``, which need no space after them; and blank lines. A period is not an end
when it is part of a number (``3.14``, no space follows), follows a common abbreviation (``Dr.``,
``e.g.``, ``No. 5``) or a single-letter initial (``J. R. R. Tolkien``), or when the next word starts in
lower case. A sentence longer than ``max_chars`` is cut at clause punctuation (``, ; :`` and their CJK
forms, dashes), then at spaces, and only as a last resort inside a word (never inside a digit run when
that can be avoided). Every piece has at most ``max_chars`` characters; the text of the pieces is taken
verbatim from the input (stripped), so joining them loses nothing but whitespace.

:func:`plan_chunks` packs consecutive sentences into chunks of at most ``max_chars`` for synthesis.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_MAX_CHARS", "plan_chunks", "split_sentences"]

DEFAULT_MAX_CHARS = 400
"""Default longest piece: about 25 s of English speech, well inside the engine's frame cap."""

_CLOSERS = "\"'”’»)]}」』）】〉》"
_WIDE_ENDERS = "。！？．।؟۔"
_SENTENCE_END = re.compile(
    rf"(?:[.!?…]+[{re.escape(_CLOSERS)}]*(?=\s|$)|[{_WIDE_ENDERS}]+[{re.escape(_CLOSERS)}]*)|\n[ \t]*\n"
)
_CLAUSE_END = re.compile(r"(?:[,;:]+|\s[—–-])(?=\s)|[，、；：—]")
_SPACE = re.compile(r"\s+")

_ABBREVIATIONS = frozenset(
    {
        *("mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "cf", "fig", "approx"),
        *("ca", "dept", "mt", "ft", "z.b", "bzw", "mme", "mlle", "hr", "frau"),
    }
)
"""Words that a period follows without ending the sentence (lower case, inner dots kept)."""
_BEFORE_NUMBER = frozenset({"no", "nr", "nos", "tel", "vol", "p", "pp", "art"})
"""Abbreviations only when a number follows ("No. 5"), since "no." also ends sentences."""


def _is_false_end(text: str, start: int, end: int) -> bool:
    """Whether the sentence-end match ``text[start:end]`` is not really a sentence end."""
    mark = text[start:end].rstrip(_CLOSERS)
    if not mark or mark.strip(".…"):
        return False  # ! ? (or a wide ender, or a blank line) always ends a sentence
    rest = text[end:].lstrip()
    if not rest:
        return False
    if rest[0].islower():
        return True  # "approx. five", "wait... and then"
    if mark != "." or end - start != 1:
        return False
    word = re.search(r"([\w.]+)$", text[:start])
    token = word.group(1).lower() if word else ""
    if token in _ABBREVIATIONS or (len(token) == 1 and token.isalpha()):
        return True
    return token in _BEFORE_NUMBER and rest[0].isdigit()


def _sentence_spans(text: str) -> list[str]:
    pieces, last = [], 0
    for m in _SENTENCE_END.finditer(text):
        if _is_false_end(text, m.start(), m.end()):
            continue
        pieces.append(text[last : m.end()])
        last = m.end()
    pieces.append(text[last:])
    return [p.strip() for p in pieces if p.strip()]


def _cut_points(text: str, pattern: re.Pattern[str]) -> list[str]:
    """Split ``text`` after every match of ``pattern``, keeping all characters."""
    pieces, last = [], 0
    for m in pattern.finditer(text):
        pieces.append(text[last : m.end()])
        last = m.end()
    pieces.append(text[last:])
    return [p for p in pieces if p]


def _hard_cut(text: str, max_chars: int) -> list[str]:
    """Cut inside a word, moving each cut back before a digit run when the run does not fill the piece."""
    out = []
    while len(text) > max_chars:
        cut = max_chars
        while cut > 0 and text[cut - 1].isdigit() and text[cut].isdigit():
            cut -= 1
        cut = cut or max_chars
        out.append(text[:cut])
        text = text[cut:]
    return [*out, text] if text else out


def _pack(pieces: list[str], max_chars: int) -> list[str]:
    """Greedily join consecutive verbatim pieces into stripped chunks of at most ``max_chars``."""
    chunks: list[str] = []
    current = ""
    for piece in pieces:
        if current and len((current + piece).strip()) > max_chars:
            chunks.append(current.strip())
            current = ""
        current += piece
    if current.strip():
        chunks.append(current.strip())
    return chunks


def _split_long(text: str, max_chars: int, level: int = 0) -> list[str]:
    if len(text) <= max_chars:
        return [text]
    if level == 2:
        return _hard_cut(text, max_chars)
    pattern = _CLAUSE_END if level == 0 else _SPACE
    pieces = _cut_points(text, pattern) if level == 0 else re.findall(r"\S+\s*", text)
    out: list[str] = []
    for chunk in _pack(pieces, max_chars):
        out.extend(_split_long(chunk, max_chars, level + 1))
    return out


def split_sentences(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """Split text into sentences, cutting any sentence longer than ``max_chars`` further.

    Args:
        text: input text (normalised or not; line breaks inside a paragraph are fine).
        max_chars: longest piece, at least 1.

    Returns:
        Non-empty stripped pieces in order, each at most ``max_chars`` characters.

    Raises:
        ValueError: ``max_chars`` < 1.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    out: list[str] = []
    for sentence in _sentence_spans(text):
        out.extend(p.strip() for p in _split_long(sentence, max_chars) if p.strip())
    return out


def _joiner(left: str, right: str) -> str:
    """No space between pieces of unspaced scripts (after a wide ender or between two CJK characters)."""
    tail = left.rstrip(_CLOSERS)[-1:]
    if tail and (tail in _WIDE_ENDERS or (_is_cjk(tail) and _is_cjk(right[0]))):
        return ""
    return " "


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return 0x3000 <= code <= 0x9FFF or 0xAC00 <= code <= 0xD7AF or 0xF900 <= code <= 0xFFEF


def plan_chunks(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """Group sentences into synthesis chunks of at most ``max_chars`` characters.

    Args:
        text: input text.
        max_chars: longest chunk, at least 1.

    Returns:
        Chunks in order; sentences are never split unless one alone exceeds ``max_chars``.
    """
    chunks: list[str] = []
    for sentence in split_sentences(text, max_chars):
        if chunks:
            joined = chunks[-1] + _joiner(chunks[-1], sentence) + sentence
            if len(joined) <= max_chars:
                chunks[-1] = joined
                continue
        chunks.append(sentence)
    return chunks
