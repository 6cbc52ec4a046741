"""Errors on the HTTP wire: a status code and OpenAI's error body, carrying voxcast's code and field.

Body: ``{"error": {"message", "type", "param", "code"}}`` as OpenAI's API sends it (``param`` names
the request field at fault, ``code`` is voxcast's stable code: ``invalid_request``,
``voice_not_found``, ...), so the ``openai`` SDK raises its matching exception with the message.
"""

from __future__ import annotations

from typing import Any

from voxcast.errors import (
    EngineUnavailable,
    InvalidRequest,
    OverCapacity,
    StorageError,
    VoiceNotFound,
    VoxcastError,
)
from voxcast.serving.drain import WorkerShutdown

__all__ = ["HttpError", "error_body", "error_for"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    411: "invalid_request_error",
    403: "permission_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    502: "server_error",
    503: "server_error",
    500: "server_error",
}


class HttpError(Exception):
    """An error answered with ``status`` (raised by the server's own checks: auth, size, routes)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.field = field
        self.headers = headers or {}


def error_body(status: int, message: str, code: str, field: str | None = None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": field,
            "code": code,
        }
    }


def error_for(e: BaseException) -> HttpError:
    """The HTTP error of an exception raised while serving a request (unknown ones: 500, no details)."""
    if isinstance(e, HttpError):
        return e
    if isinstance(e, VoiceNotFound) and e.field == "voice_id":  # the path names it: /v1/audio/voices/{id}
        return HttpError(404, e.message, code=e.code, field=e.field)
    if isinstance(e, InvalidRequest):
        return HttpError(400, e.message, code=e.code, field=e.field)
    if isinstance(e, OverCapacity):  # admission control: come back soon, or try another instance
        return HttpError(503, e.message, code=e.code, headers={"Retry-After": str(e.retry_after_s)})
    if isinstance(e, EngineUnavailable | WorkerShutdown):
        return HttpError(503, e.message, code=e.code, headers={"Retry-After": "5"})
    if isinstance(e, StorageError):
        return HttpError(502, e.message, code=e.code)
    if isinstance(e, VoxcastError):
        return HttpError(500, e.message, code=e.code)
    return HttpError(500, "internal error (see the server log)", code="internal_error")
