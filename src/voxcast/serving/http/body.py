"""Request bodies read within the size limit, and JSON parsed with errors that name the field."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from voxcast.serving.http.errors import HttpError

__all__ = ["ClientDisconnected", "check_length", "read_body", "read_json"]


class ClientDisconnected(HttpError):
    """The client went away (or was cut off by the body timeout) before its request body was
    complete: nothing to answer, counted as ``cancelled``, never an internal error."""

    def __init__(self) -> None:
        super().__init__(
            499, "the client disconnected before its request body was complete", code="cancelled"
        )


def _too_large(limit: int) -> HttpError:
    return HttpError(
        413,
        f"the request body is larger than {limit} bytes (VOXCAST_HTTP_MAX_BODY_MB)",
        code="request_too_large",
    )


def check_length(request: Request, limit: int) -> None:
    """Refuse a body whose declared length is over ``limit`` before reading any of it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it passes ``limit`` bytes (declared or sent)."""
    check_length(request, limit)
    parts, size = [], 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise _too_large(limit)
            parts.append(part)
    except ClientDisconnect:
        raise ClientDisconnected() from None
    return b"".join(parts)


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON (an object is checked by the caller)."""
    body = await read_body(request, limit)
    if not body.strip():
        raise HttpError(
            400, "the request body is empty; send a JSON object", code="invalid_request", field="request"
        )
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HttpError(
            400, f"the request body is not valid JSON: {e}", code="invalid_request", field="request"
        ) from None
