"""Request bodies read within the size limit, and JSON parsed (bounded in depth) with errors that
name the field."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from voxcast.errors import InvalidRequest
from voxcast.serving.http.errors import HttpError

__all__ = ["MAX_JSON_DEPTH", "ClientDisconnected", "check_length", "parse_json", "read_body", "read_json"]

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays and objects a JSON body or message may have (the schema needs 3): deeper
JSON is refused with a 400 before it reaches code that recurses over it."""


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
    """The body as JSON (an object is checked by the caller).

    Raises:
        HttpError: 413 too large, 415 a ``Content-Type`` other than JSON (a browser's form or
            ``text/plain`` post is never taken for an API call), 400 empty.
        InvalidRequest: (field ``request``) not JSON, or nested too deeply.
    """
    content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type and not _is_json_type(content_type):
        raise HttpError(
            415,
            f"the request body must be JSON (Content-Type: application/json), not {content_type[:80]!r}",
            code="unsupported_media_type",
            field="request",
        )
    body = await read_body(request, limit)
    if not body.strip():
        raise HttpError(
            400, "the request body is empty; send a JSON object", code="invalid_request", field="request"
        )
    return parse_json(body, "the request body", "request")


def _is_json_type(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


def parse_json(raw: str | bytes, what: str, field: str) -> Any:
    """``raw`` parsed as JSON, at most :data:`MAX_JSON_DEPTH` arrays and objects deep.

    Args:
        raw: the JSON text. what: how a message names it ("the request body"). field: the error's field.

    Raises:
        InvalidRequest: not valid JSON (UTF-8), or nested too deeply, naming ``field``.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        value = _TOO_DEEP
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidRequest(f"{what} is not valid JSON: {e}", field=field) from None
    if value is _TOO_DEEP or _too_deep(value):
        raise InvalidRequest(
            f"{what} is nested too deeply (at most {MAX_JSON_DEPTH} levels of arrays and objects)",
            field=field,
        )
    return value


_TOO_DEEP = object()


def _too_deep(value: Any) -> bool:
    """Whether ``value`` nests more than :data:`MAX_JSON_DEPTH` containers (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_JSON_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False
