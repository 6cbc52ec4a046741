"""Voice aliases: names a deployment gives to its voices (``VOXCAST_VOICE_ALIASES``).

An OpenAI client sends OpenAI's voice names (``alloy``, ``nova``, ...); a telephony platform may want
``support`` and ``billing``. An alias maps such a name to a voice the model has: a built-in speaker
or a registered voice id. Requests on every entry point may then name either; an alias and its voice
share audio-cache entries (the cache keys the voice, not the name). Aliases are matched without
regard to case; a name that is not an alias is used as given.

Format: ``alias=voice`` pairs separated by commas (``alloy=ryan,nova=vivian,support=vx_1a2b...``), or
a JSON object (``{"alloy": "ryan"}``).
"""

from __future__ import annotations

import json
import re

__all__ = ["ALIAS_RE", "parse_aliases", "parse_voice_name"]

ALIAS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""What an alias and its voice may look like (speaker names and voice ids both fit)."""


def parse_voice_name(value: str | None, var: str) -> str | None:
    """A voice named by a setting (``VOXCAST_DEFAULT_VOICE``): None when unset or blank.

    Raises:
        ValueError: naming ``var``: not the shape of a speaker name, alias or voice id.
    """
    if value is None or not value.strip():
        return None
    if not ALIAS_RE.fullmatch(value.strip()):
        raise ValueError(f"{var}: {value.strip()[:80]!r} must match {ALIAS_RE.pattern}")
    return value.strip()


def parse_aliases(value: str | None, var: str = "VOXCAST_VOICE_ALIASES") -> dict[str, str]:
    """``{alias (lower case): voice}`` from ``value`` (None or blank: no aliases).

    Raises:
        ValueError: naming ``var``: a malformed pair, an unsafe name, an alias given twice, or an
            alias that names another alias.
    """
    if value is None or not value.strip():
        return {}
    text = value.strip()
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{var} is not valid JSON: {e.msg}") from None
        if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
            raise ValueError(f'{var} must map names to voices, e.g. {{"alloy": "ryan"}}')
        pairs = list(raw.items())
    else:
        pairs = []
        for part in (p.strip() for p in text.split(",")):
            name, sep, voice = part.partition("=")
            if not sep:
                raise ValueError(f"{var}: {part!r} is not alias=voice")
            pairs.append((name.strip(), voice.strip()))
    out: dict[str, str] = {}
    for name, voice in pairs:
        for what, s in (("alias", name), ("voice", voice)):
            if not ALIAS_RE.fullmatch(s):
                raise ValueError(f"{var}: {what} {s!r} must match {ALIAS_RE.pattern}")
        if name.lower() in out:
            raise ValueError(f"{var}: {name!r} is given twice")
        out[name.lower()] = voice
    chained = sorted(v for v in out.values() if v.lower() in out)
    if chained:
        raise ValueError(f"{var}: {chained[0]!r} is both an alias and the voice of one (no chains)")
    return out
