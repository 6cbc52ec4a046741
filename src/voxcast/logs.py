"""Process logging set-up shared by every entry point, and credential redaction.

:func:`setup_logging` configures the root logger once (level from the argument or
``VOXCAST_LOG_LEVEL``, default INFO) and installs :class:`RedactingFilter` on its handlers, so a URL
with credentials (``redis://:PASSWORD@host/0``, ``https://user:secret@endpoint``) never reaches a log
line in clear, whoever logs it (voxcast, RQ, botocore). Code that prints to the terminal runs its
text through :func:`redact`.

Request ids: every entry point binds the id of the request it serves (:func:`bind_request_id`: the
RunPod job id, the RQ job id, the HTTP ``X-Request-Id`` header or a generated one) and
:class:`RequestIdFilter` stamps it on every line logged meanwhile in that context (threads started
with :func:`contextvars.copy_context` inherit it); lines the engine thread logs about one request pass
it in ``extra={"request_id": ...}``. Text lines show it as ``[<id>]`` after the logger name; JSON lines
carry ``request_id``.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

__all__ = [
    "JsonFormatter",
    "RedactingFilter",
    "RequestIdFilter",
    "bind_request_id",
    "redact",
    "set_request_id",
    "setup_logging",
]

_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"

_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("voxcast_request_id", default=None)


@contextlib.contextmanager
def bind_request_id(request_id: str | None) -> Iterator[None]:
    """Lines logged in this context (and in tasks and copied contexts started from it) carry
    ``request_id`` for the duration of the ``with`` block."""
    token = _REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        _REQUEST_ID.reset(token)


def set_request_id(request_id: str | None) -> None:
    """Bind ``request_id`` for the rest of the current context (an asyncio task that serves one request)."""
    _REQUEST_ID.set(request_id)


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (an ``extra`` given by the caller wins, else the bound one) and
    ``record.request_tag`` (`` [<id>]`` or empty) for the text format."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = getattr(record, "request_id", None) or _REQUEST_ID.get()
        record.request_id = rid
        record.request_tag = f" [{rid}]" if rid else ""
        return True


#: ``scheme://[user]:password@``: the password is replaced, the user name is kept.
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):(?P<secret>[^@/\s]+)@")


#: ``api_key=...`` / ``token=...`` in a query string (a browser's WebSocket carries its key there).
_QUERY_SECRET = re.compile(r"(?i)(?P<head>[?&](?:api_key|apikey|access_token|token|key)=)[^&\s\"']+")


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` and the value of every
    ``?api_key=`` / ``token=`` query parameter replaced by ``***``."""
    return _QUERY_SECRET.sub(r"\g<head>***", _USERINFO.sub(r"\g<head>:***@", text))


class RedactingFilter(logging.Filter):
    """Rewrites a record whose formatted message (or traceback) holds credentials in a URL."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            if redact(text) != text:  # the traceback names a secret: keep it, redacted, as text
                record.msg = f"{record.getMessage()}\n{redact(text)}"
                record.args, record.exc_info, record.exc_text = None, None, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (ISO 8601 UTC), ``level``, ``logger``, ``msg``, the fields a
    record carries in ``record.fields`` (a request's end: see :mod:`voxcast.request_log`), and
    ``exc`` (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            out["request_id"] = rid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def setup_logging(level: str | int | None = None, *, stream: TextIO | None = None) -> None:
    """Configure the root logger (first call wins, as :func:`logging.basicConfig`) and redact URLs.

    ``VOXCAST_LOG_FORMAT``: ``text`` (default) or ``json`` (one JSON object per line, for log
    collectors).

    Raises:
        ValueError: an unknown level name, naming ``VOXCAST_LOG_LEVEL``, or an unknown format,
            naming ``VOXCAST_LOG_FORMAT``.
    """
    fmt = os.environ.get("VOXCAST_LOG_FORMAT", "").strip().lower() or "text"
    if fmt not in ("text", "json"):
        raise ValueError(f"VOXCAST_LOG_FORMAT must be text or json, not {fmt!r}")
    chosen = level if level is not None else os.environ.get("VOXCAST_LOG_LEVEL", "INFO")
    if isinstance(chosen, str):
        name = chosen.strip().upper()
        if not isinstance(logging.getLevelName(name), int):
            raise ValueError(f"VOXCAST_LOG_LEVEL / --log-level {chosen!r} is not a logging level")
        chosen = name
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig (its RequestIdFilter, added below, sets request_tag)
        console = logging.StreamHandler(stream or sys.stderr)
        console.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(console)
        root.setLevel(chosen)
    for handler in root.handlers:
        if fmt == "json" and not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(JsonFormatter())
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
