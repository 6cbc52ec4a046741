"""What the HTTP server shows, and to whom: browser origins, the API docs and the metrics.

A web page open in a browser can send requests to a server on localhost (a form post, a
``text/plain`` fetch, a WebSocket): browsers send them without asking, and only mark them with an
``Origin`` header. So, safe by default:

- a request or WebSocket whose ``Origin`` is not the server's own and not in ``VOXCAST_CORS_ORIGINS``
  is refused (403, or the WebSocket handshake refused); a client that is not a browser sends no
  ``Origin`` and is not affected;
- allowed origins get CORS headers (preflight included), so a browser app of one's own can call;
- with an API key set, ``/docs``, ``/redoc`` and ``/openapi.json`` are off and ``/metrics`` needs the
  key (``VOXCAST_HTTP_DOCS=on`` and ``VOXCAST_METRICS_AUTH=off`` open them);
- JSON routes refuse a body that is not sent as JSON (:func:`voxcast.serving.http.body.read_json`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from voxcast.envvars import env_bool, env_str
from voxcast.serving.http.errors import error_body

__all__ = ["Exposure", "OriginGuard"]


@dataclass(frozen=True)
class Exposure:
    """Build with :meth:`from_env`.

    Attributes:
        cors_origins: browser origins allowed to call the API (``VOXCAST_CORS_ORIGINS``: comma
            separated, e.g. ``https://app.example.com``, or ``*`` for any; default none).
        docs: serve ``/docs``, ``/redoc`` and ``/openapi.json`` (``VOXCAST_HTTP_DOCS``; default: on
            without an API key, off with one).
        metrics_auth: ``/metrics`` needs the API key when one is set (``VOXCAST_METRICS_AUTH``, on).
    """

    cors_origins: tuple[str, ...] = ()
    docs: bool | None = None
    metrics_auth: bool = True

    def __post_init__(self) -> None:
        for origin in self.cors_origins:
            if origin != "*" and _origin_of(origin) != origin:
                raise ValueError(
                    f"VOXCAST_CORS_ORIGINS: {origin[:80]!r} is not an origin (scheme://host[:port], no path)"
                )

    def docs_on(self, api_key: str | None) -> bool:
        return self.docs if self.docs is not None else api_key is None

    def allows(self, origin: str, host: str | None) -> bool:
        """Whether a request from ``origin`` to the server at ``host`` (its ``Host`` header) is let in:
        the server's own pages, or an allowed origin."""
        if "*" in self.cors_origins or origin in self.cors_origins:
            return True
        own = urlsplit(origin).netloc
        return bool(host) and own == host

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Exposure:
        """Raises: ValueError naming the variable."""
        raw = env_str(env, "VOXCAST_CORS_ORIGINS") or ""
        docs = env_str(env, "VOXCAST_HTTP_DOCS")
        return cls(
            cors_origins=tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip()),
            docs=None if docs is None else env_bool(env, "VOXCAST_HTTP_DOCS", False),
            metrics_auth=env_bool(env, "VOXCAST_METRICS_AUTH", True),
        )


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class OriginGuard:
    """ASGI middleware: refuses HTTP requests and WebSockets from browser origins not allowed."""

    def __init__(self, app: ASGIApp, exposure: Exposure) -> None:
        self.app = app
        self.exposure = exposure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] in ("http", "websocket") else None
        if origin is None or (origin == "null" and "*" in self.exposure.cors_origins):
            await self.app(scope, receive, send)
            return
        if self.exposure.allows(origin, _header(scope, b"host")):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "origin not allowed"})
            return
        await _refuse(send, origin)


async def _refuse(send: Send, origin: str) -> None:
    message = (
        f"requests from the browser origin {origin[:100]!r} are not allowed (VOXCAST_CORS_ORIGINS lists "
        "the origins that may call this server)"
    )
    body = json.dumps(error_body(403, message, "origin_not_allowed", "Origin")).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    start: dict[str, Any] = {"type": "http.response.start", "status": 403, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
