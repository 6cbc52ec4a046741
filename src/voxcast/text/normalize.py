"""Conservative text normalisation, used both for synthesis input and for cache keys.

What it does: Unicode NFC; line breaks, tabs and every Unicode space become one ASCII space, runs of
whitespace collapse, the ends are stripped; other control characters and invisible format characters
(zero-width space, soft hyphen, BOM, bidi marks) are removed, except ZWJ/ZWNJ, which change the
spelling of Persian, Indic and emoji text; typographic double/single quotes become ``"`` and ``'``;
hyphen variants and the minus sign become ``-``; the horizontal bar becomes an em dash.

What it does not do: expand numbers, dates, currencies or abbreviations. That is language dependent and
the model reads digits itself; doing it wrong would change what is said. En/em dashes, guillemets,
CJK brackets, primes and the ellipsis character are left as they are (they carry meaning or prosody).
Two texts that normalise to the same string are spoken the same and share a cache entry.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["normalize_text"]

_KEEP_FORMAT = {"\u200c", "\u200d"}  # ZWNJ, ZWJ

_REPLACE = str.maketrans(
    {
        "\u201c": '"',  # left double quotation mark
        "\u201d": '"',  # right double quotation mark
        "\u201e": '"',  # double low-9
        "\u201f": '"',  # double high-reversed-9
        "\u2018": "'",  # left single quotation mark
        "\u2019": "'",  # right single quotation mark / apostrophe
        "\u201a": "'",  # single low-9
        "\u201b": "'",  # single high-reversed-9
        "\u2010": "-",  # hyphen
        "\u2011": "-",  # non-breaking hyphen
        "\u2212": "-",  # minus sign
        "\u2015": "\u2014",  # horizontal bar -> em dash
    }
)

_SPACES = re.compile(r"\s+")


def _clean_char(ch: str) -> str:
    """Map one character: spaces/separators/whitespace controls -> ' ', other controls/format -> ''."""
    if ch.isspace():
        return " "
    cat = unicodedata.category(ch)
    if cat in ("Zs", "Zl", "Zp"):
        return " "
    if cat == "Cc" or (cat == "Cf" and ch not in _KEEP_FORMAT):
        return ""
    return ch


def normalize_text(text: str) -> str:
    """Normalise text for synthesis and cache keys (see the module docstring for the exact rules).

    Args:
        text: any Unicode text.

    Returns:
        The normalised text (possibly empty).
    """
    text = unicodedata.normalize("NFC", text).translate(_REPLACE)
    cleaned = "".join(_clean_char(ch) for ch in text)
    return _SPACES.sub(" ", cleaned).strip()
