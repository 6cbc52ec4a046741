"""What voxcast's two speech WebSockets share: ``/v1/audio/speech/stream`` (:mod:`.ws`, voxcast's
own protocol) and ``/v1/audio/speech/ws`` (:mod:`.nari_ws`, ``nari.speech.v1``).

A client message is read as one JSON object (:func:`receive_object`); every error the server
reports is the ``error`` event, OpenAI's error object with voxcast's code and the field at fault
(:func:`error_event`); text a message carries must be valid Unicode (:func:`is_unicode`); and an
open stream (``Service.open``) takes more text only while :func:`takes_text` holds.

A text frame that is not valid UTF-8 is refused by uvicorn itself (close code 1007, which is right)
with an ERROR and a traceback; :func:`quiet_invalid_utf8` drops that record, and
:func:`receive_object` logs one INFO line per connection instead and counts it
(``voxcast_websocket_invalid_utf8_total``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from voxcast.errors import InvalidRequest
from voxcast.metrics import Metrics
from voxcast.service import ServiceStream
from voxcast.serving.http.body import parse_json
from voxcast.serving.http.errors import error_body, error_for

__all__ = [
    "encode_event",
    "error_event",
    "is_unicode",
    "quiet_invalid_utf8",
    "receive_object",
    "takes_text",
]

log = logging.getLogger(__name__)

_INVALID_UTF8 = 1007
"""The close code of a text frame that is not valid UTF-8 (RFC 6455, 7.4.1)."""
_UVICORN_UTF8_MSG = "Invalid UTF-8 sequence received from client."
"""What uvicorn's websockets-sansio protocol logs (ERROR, with a traceback) before closing with 1007."""


class _DropUvicornUtf8(logging.Filter):
    """Drops uvicorn's ERROR for invalid UTF-8: a client's fault, reported by :func:`receive_object`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _UVICORN_UTF8_MSG


def quiet_invalid_utf8() -> None:
    """Drop uvicorn's per-connection traceback for invalid UTF-8 (idempotent: one filter at most)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropUvicornUtf8) for f in logger.filters):
        logger.addFilter(_DropUvicornUtf8())


def error_event(e: BaseException) -> dict[str, Any]:
    """``{"type": "error", "error": {"message", "type", "param", "code"}}`` for ``e`` (over capacity:
    with ``retry_after_s``, since a socket has no ``Retry-After`` header)."""
    err = error_for(e)
    out = {"type": "error", **error_body(err.status, err.message, err.code, err.field)}
    if "Retry-After" in err.headers:
        out["retry_after_s"] = int(err.headers["Retry-After"])
    return out


def encode_event(event: dict[str, Any]) -> str:
    """A JSON event as sent: compact."""
    return json.dumps(event, separators=(",", ":"))


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode (JSON's ``\\ud800`` escapes decode to lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def receive_object(ws: WebSocket, metrics: Metrics | None = None) -> dict[str, Any]:
    """The next client message, a JSON object sent as text.

    Args:
        ws: the connection.
        metrics: where a close for invalid UTF-8 is counted.

    Raises:
        WebSocketDisconnect: the client went away (or sent invalid UTF-8: code 1007).
        InvalidRequest: a binary message, or text that is not a JSON object (field ``message``).
    """
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        code = message.get("code", 1000)
        if code == _INVALID_UTF8:
            log.info("websocket %s: a text frame is not valid UTF-8; closed with 1007", ws.url.path)
            if metrics is not None:
                metrics.ws_invalid_utf8.inc()
        raise WebSocketDisconnect(code)
    raw = message.get("text")
    msg = parse_json(raw, "the message", "message") if raw is not None else None
    if not isinstance(msg, dict):
        raise InvalidRequest("a message must be a JSON object (text)", field="message")
    return msg


def takes_text(stream: ServiceStream) -> bool:
    """Whether an open stream still takes text: not once its audio ended (its ``max_frames``, end
    of speech, a failure: text pushed now would never be spoken) or its text is complete (closed by
    the caller, or for it after ``VOXCAST_TEXT_WAIT_S`` without text)."""
    timed_out = stream.feed is not None and stream.feed.closed
    return not (stream.ended or timed_out)
