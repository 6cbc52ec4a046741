"""What the HTTP server shows, and to whom: browser origins, the API docs and the metrics.

A web page open in a browser can send requests to a server on localhost (a form post, a
``text/plain`` fetch, a WebSocket): browsers send them without asking, and only mark them with an
``Origin`` header. So, safe by default:

- a request or WebSocket whose ``Host`` header names a host the server was not told to serve is
  refused (400 ``host_not_allowed``, or the WebSocket handshake refused): a page whose name an
  attacker re-points at 127.0.0.1 (DNS rebinding) is then same-origin, so only the ``Host`` shows it.
  Allowed: any IP address (a browser that sent one connected to it, no name was resolved),
  ``localhost`` and ``*.localhost``, the bound name, and ``VOXCAST_ALLOWED_HOSTS``. With an API key
  and no ``VOXCAST_ALLOWED_HOSTS`` the check is off (a rebound page cannot know the key); ``/ping``
  and ``/health`` are never refused for their ``Host`` (load balancers probe them by any name);
- a request or WebSocket whose ``Origin`` is not the server's own and not in ``VOXCAST_CORS_ORIGINS``
  is refused (403, or the WebSocket handshake refused); a client that is not a browser sends no
  ``Origin`` and is not affected;
- allowed origins get CORS headers (preflight included), so a browser app of one's own can call;
- with an API key set, ``/docs``, ``/redoc`` and ``/openapi.json`` are off and ``/metrics`` needs the
  key (``VOXCAST_HTTP_DOCS=on`` and ``VOXCAST_METRICS_AUTH=off`` open them);
- JSON routes refuse a body that is not sent as JSON (:func:`voxcast.serving.http.body.read_json`).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from voxcast.envvars import env_bool, env_str
from voxcast.serving.http.errors import error_body

__all__ = ["Exposure", "OriginGuard", "host_allowed"]

#: Names every server answers to: ``localhost`` and its subdomains (browsers resolve them to loopback
#: themselves, so no DNS answer can re-point them). IP addresses are always allowed too.
LOOPBACK_NAMES = (".localhost",)
#: Paths answered whatever the ``Host``: load balancers probe them by the name they know.
_ANY_HOST_PATHS = ("/ping", "/health")


@dataclass(frozen=True)
class Exposure:
    """Build with :meth:`from_env`.

    Attributes:
        cors_origins: browser origins allowed to call the API (``VOXCAST_CORS_ORIGINS``: comma
            separated, e.g. ``https://app.example.com``, or ``*`` for any; default none).
        docs: serve ``/docs``, ``/redoc`` and ``/openapi.json`` (``VOXCAST_HTTP_DOCS``; default: on
            without an API key, off with one).
        metrics_auth: ``/metrics`` needs the API key when one is set (``VOXCAST_METRICS_AUTH``, on).
        allowed_hosts: names the ``Host`` header may carry besides IP addresses, ``localhost`` and the
            bound name (``VOXCAST_ALLOWED_HOSTS``: comma separated; ``.example.com`` is example.com
            and its subdomains; ``*`` any). None (unset): checked only without an API key.
    """

    cors_origins: tuple[str, ...] = ()
    docs: bool | None = None
    metrics_auth: bool = True
    allowed_hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for origin in self.cors_origins:
            if origin != "*" and _origin_of(origin) != origin:
                raise ValueError(
                    f"VOXCAST_CORS_ORIGINS: {origin[:80]!r} is not an origin (scheme://host[:port], no path)"
                )
        for name in self.allowed_hosts or ():
            if not name or any(c in name for c in "/:@ "):
                raise ValueError(
                    f"VOXCAST_ALLOWED_HOSTS: {name[:80]!r} is not a host name (no scheme, port or path)"
                )

    def host_names(self, bind_host: str, api_key: str | None) -> tuple[str, ...] | None:
        """The names a request's ``Host`` may carry (IP addresses besides); None: any host."""
        if self.allowed_hosts is None and api_key is not None:
            return None  # the key protects: a rebound page cannot send it
        names = LOOPBACK_NAMES + (self.allowed_hosts or ())
        if "*" in names:
            return None
        return (*names, bind_host.lower().rstrip("."))

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
        hosts = env_str(env, "VOXCAST_ALLOWED_HOSTS")
        return cls(
            cors_origins=tuple(o.strip().rstrip("/") for o in raw.split(",") if o.strip()),
            docs=None if docs is None else env_bool(env, "VOXCAST_HTTP_DOCS", False),
            metrics_auth=env_bool(env, "VOXCAST_METRICS_AUTH", True),
            allowed_hosts=None
            if hosts is None
            else tuple(h.strip().lower().rstrip(".") for h in hosts.split(",") if h.strip()),
        )


def host_allowed(host: str | None, names: tuple[str, ...] | None) -> bool:
    """Whether a ``Host`` header (``name[:port]``) is one of ``names`` (``.suffix`` entries match the
    name and its subdomains) or an IP address; None (no header: not a browser) or ``names`` None: yes."""
    if host is None or names is None:
        return True
    if any(c in host for c in "/?#@\\ "):
        return False
    try:
        name = (urlsplit("//" + host).hostname or "").rstrip(".")
    except ValueError:  # a port that is not a number
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return any(name == n or (n.startswith(".") and (name == n[1:] or name.endswith(n))) for n in names)


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


class OriginGuard:
    """ASGI middleware: refuses HTTP requests and WebSockets to a ``Host`` not served
    (``host_names``, None: any) or from browser origins not allowed; ``on_refused(reason, status)``
    counts each refusal (reason ``host`` or ``origin``)."""

    def __init__(
        self,
        app: ASGIApp,
        exposure: Exposure,
        host_names: tuple[str, ...] | None = None,
        on_refused: Callable[[str, int], None] = lambda reason, status: None,
    ) -> None:
        self.app = app
        self.exposure = exposure
        self.host_names = host_names
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _header(scope, b"host")
        if scope.get("path") not in _ANY_HOST_PATHS and not host_allowed(host, self.host_names):
            message = (
                f"the Host header {str(host)[:100]!r} names no host this server serves "
                "(VOXCAST_ALLOWED_HOSTS lists the names it answers to besides localhost and IP addresses)"
            )
            await self._refuse(scope, send, "host", 400, error_body(400, message, "host_not_allowed", "Host"))
            return
        origin = _header(scope, b"origin")
        if origin is None or (origin == "null" and "*" in self.exposure.cors_origins):
            await self.app(scope, receive, send)
            return
        if self.exposure.allows(origin, host):
            await self.app(scope, receive, send)
            return
        message = (
            f"requests from the browser origin {origin[:100]!r} are not allowed (VOXCAST_CORS_ORIGINS lists "
            "the origins that may call this server)"
        )
        await self._refuse(
            scope, send, "origin", 403, error_body(403, message, "origin_not_allowed", "Origin")
        )

    async def _refuse(self, scope: Scope, send: Send, reason: str, status: int, error: Any) -> None:
        """Refuse: a WebSocket handshake is closed before it is accepted (the client sees 403)."""
        if scope["type"] == "websocket":
            self.on_refused(reason, 403)
            await send({"type": "websocket.close", "code": 1008, "reason": f"{reason} not allowed"})
            return
        self.on_refused(reason, status)
        await _send_json(send, status, error)


async def _send_json(send: Send, status: int, error: Any) -> None:
    body = json.dumps(error).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
