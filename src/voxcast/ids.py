"""The one rule for request ids, and the mapping of platform job ids into it.

A request id names a request's stream (``voxcast:stream:<id>``), its RQ job and its stored render
(``renders/<id>.<ext>``), so it must be acceptable to all three. No torch, no pydantic: the CLI and
the queue client import this without loading a model stack.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from voxcast.errors import InvalidRequest

__all__ = ["REQUEST_ID_RE", "REQUEST_ID_RULE", "check_request_id", "request_id_for"]

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
"""The one rule for request ids (and RQ job ids, stream names and render keys, which are made from them):
1-128 letters, digits, ``_`` and ``-``, starting with a letter or digit. It is the intersection of what
RQ's job ids, Redis key conventions and storage key components accept, so an id that passes here
works everywhere."""

REQUEST_ID_RULE = "1-128 letters, digits, '_' or '-', starting with a letter or digit"


def check_request_id(value: Any, field: str = "request_id") -> str:
    """``value`` if it follows :data:`REQUEST_ID_RE`, else :class:`InvalidRequest` naming ``field``."""
    if not isinstance(value, str) or not REQUEST_ID_RE.fullmatch(value):
        raise InvalidRequest(f"{field}: must be {REQUEST_ID_RULE}; got {str(value)[:80]!r}", field=field)
    return value


def request_id_for(platform_id: str) -> str:
    """A request id for an id a platform chose (RunPod or RQ job id): the id itself where it follows
    :data:`REQUEST_ID_RE`, else its allowed characters (up to 95) plus ``-`` and 32 hex of its SHA-256,
    so two different ids never map to one (ids that share a 128-character prefix included)."""
    if REQUEST_ID_RE.fullmatch(platform_id):
        return platform_id
    kept = re.sub(r"[^A-Za-z0-9_-]", "", platform_id)[:95].lstrip("_-")
    digest = hashlib.sha256(platform_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{kept}-{digest}" if kept else f"id-{digest}"
