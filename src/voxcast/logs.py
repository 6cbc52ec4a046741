"""Process logging set-up shared by every entry point, and credential redaction.

:func:`setup_logging` configures the root logger once (level from the argument or
``VOXCAST_LOG_LEVEL``, default INFO) and installs :class:`RedactingFilter` on its handlers, so a URL
with credentials (``redis://:PASSWORD@host/0``, ``https://user:secret@endpoint``) never reaches a log
line in clear, whoever logs it (voxcast, RQ, botocore). Code that prints to the terminal runs its
text through :func:`redact`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any, TextIO

__all__ = ["JsonFormatter", "RedactingFilter", "redact", "setup_logging"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
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
    logging.basicConfig(level=chosen, format=_FORMAT, stream=stream or sys.stderr)
    root = logging.getLogger()
    for handler in root.handlers:
        if fmt == "json" and not isinstance(handler.formatter, JsonFormatter):
            handler.setFormatter(JsonFormatter())
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
