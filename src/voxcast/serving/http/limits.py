"""Limits on every socket of the HTTP server: what uvicorn does not bound by itself.

uvicorn closes a keep-alive connection that stays idle after a response (``timeout_keep_alive``), but
holds a connection that never completes a request head, or sends its body a byte at a time, for as
long as the client likes (slowloris), and it accepts connections until the process runs out of file
descriptors, after which asyncio's accept loop logs a traceback thousands of times a second. Here:

- :func:`guarded_protocol` wraps uvicorn's HTTP protocol class: a connection must complete each
  request head within ``header_timeout_s`` (from its opening, or from the end of its previous
  response) and that request's body within ``body_timeout_s`` of its head, else it is closed; a
  connection beyond ``max_connections`` (WebSockets included) gets 503 and is closed at once, so its
  file descriptor is free again.
- the same protocol bounds each request head: at most ``max_header_bytes`` (request line and
  headers) and ``max_headers`` header lines, counted as the bytes arrive, before the parser buffers
  them; a head past either gets 431 with OpenAI's error object and the connection is closed (httptools
  has no limit of its own: one 16 MB header was accepted, and 20 of them held ~0.4 GB).
- :func:`quiet_accept_errors` turns asyncio's "socket.accept() out of system resource" (no file
  descriptor left: asyncio stops accepting for a second, then tries again) into one warning line per
  ``every_s``, with the count of the ones left out.
- :func:`default_max_connections` derives the cap from the process's file-descriptor limit.

The protocol reads only what uvicorn's h11 and httptools protocols share (``cycle``, its
``more_body`` and ``response_complete``, ``connections``, ``transport``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import resource
import select
import time
from typing import Any

__all__ = [
    "ABORT_EXTENSION",
    "RateLimitedLog",
    "default_max_connections",
    "guarded_protocol",
    "quiet_accept_errors",
]

log = logging.getLogger(__name__)

ABORT_EXTENSION = "voxcast.abort"
"""Scope extension of a guarded connection: a callable (loop thread only) that resets it at once,
unsent data dropped. ``transport.close()`` would wait to flush to a client that stopped reading."""

FD_RESERVE = 64
"""File descriptors kept for the process's own use (store, logs, pipes, threads) beyond connections."""

_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
"""The accept errors after which asyncio stops accepting for a second (``selector_events``)."""


class RateLimitedLog:
    """At most one log line per ``every_s`` for one kind of event; the next line says how many
    were left out in between."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self.logger = logger
        self.every_s = every_s
        self._last = -float("inf")
        self.left_out = 0

    def warning(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            self.left_out += 1
            return
        left_out, self.left_out, self._last = self.left_out, 0, now
        suffix = f" ({left_out} more like it in the last {self.every_s:g} s not logged)" if left_out else ""
        self.logger.warning(message + suffix, *args)


def default_max_connections() -> int:
    """Connections the process can hold: its soft file-descriptor limit less :data:`FD_RESERVE`
    and the descriptors already open (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 32
    return max(16, int(soft) - FD_RESERVE - open_now)


def _refusal() -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": "too many connections (VOXCAST_HTTP_MAX_CONNECTIONS); retry later",
                "type": "server_error",
                "param": None,
                "code": "too_many_connections",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _too_large(what: str) -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": f"request header fields too large: {what}",
                "type": "invalid_request_error",
                "param": "headers",
                "code": "header_too_large",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


_HEAD_END = b"\r\n\r\n"


def guarded_protocol(
    base: type[asyncio.Protocol],
    *,
    header_timeout_s: float,
    body_timeout_s: float,
    max_connections: int,
    max_header_bytes: int = 64 * 1024,
    max_headers: int = 100,
) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's HTTP protocol class ``base`` that enforces the limits above."""
    slow_head, slow_body, refused = RateLimitedLog(log), RateLimitedLog(log), RateLimitedLog(log)
    too_large = RateLimitedLog(log)

    class Guarded(base):  # type: ignore[valid-type, misc]
        _vx_cycle: Any = None
        _vx_timer: asyncio.TimerHandle | None = None
        _vx_head_bytes = 0
        _vx_head_lines = 0
        _vx_tail = b""

        def data_received(self, data: bytes) -> None:
            if self._vx_awaiting_head():
                over = self._vx_count_head(data)
                if over is not None:
                    too_large.warning("refused a request from %s: %s", _peer(self.client), over)
                    self.transport.write(_too_large(over))
                    self.transport.close()
                    return
            super().data_received(data)

        def _vx_awaiting_head(self) -> bool:
            cycle = self._vx_cycle
            return self.transport is not None and (cycle is None or cycle.response_complete)

        def _vx_count_head(self, data: bytes) -> str | None:
            """Count ``data`` into the head being received (up to its blank line); what is over a
            limit, or None."""
            seen = self._vx_tail + data
            end = seen.find(_HEAD_END)
            part = seen[len(self._vx_tail) : end + len(_HEAD_END)] if end >= 0 else data
            self._vx_head_bytes += len(part)
            self._vx_head_lines += part.count(b"\n")
            self._vx_tail = b"" if end >= 0 else seen[-3:]
            over = None
            if self._vx_head_bytes > max_header_bytes:
                over = f"more than {max_header_bytes} bytes (VOXCAST_HTTP_MAX_HEADER_KB)"
            elif self._vx_head_lines > max_headers + 2:  # the request line and the blank line
                over = f"more than {max_headers} header lines (VOXCAST_HTTP_MAX_HEADERS)"
            if end >= 0:
                self._vx_head_bytes = self._vx_head_lines = 0
            return over

        # uvicorn assigns ``cycle`` when a request's head is complete (both protocols)
        @property
        def cycle(self) -> Any:
            return self._vx_cycle

        @cycle.setter
        def cycle(self, value: Any) -> None:
            self._vx_cycle = value
            if value is not None:
                value.scope.setdefault("extensions", {})[ABORT_EXTENSION] = self._vx_abort
                self._vx_arm(body_timeout_s, value)

        def _vx_abort(self) -> None:
            if self.transport.get_protocol() is self:  # not handed to a WebSocket since
                self.transport.abort()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                refused.warning(
                    "refused a connection: %d open (max %d)", len(self.connections), max_connections
                )
                transport.write(_refusal())
                transport.close()
                return
            self._vx_arm(header_timeout_s, None)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not getattr(self, "pipeline", None):
                self._vx_arm(header_timeout_s, self.cycle)  # the next head, from now

        def connection_lost(self, exc: Exception | None) -> None:
            self._vx_cancel()
            super().connection_lost(exc)

        def _vx_arm(self, delay_s: float, waiting_on: Any) -> None:
            self._vx_cancel()
            self._vx_timer = self.loop.call_later(delay_s, self._vx_check, waiting_on)

        def _vx_cancel(self) -> None:
            if self._vx_timer is not None:
                self._vx_timer.cancel()
                self._vx_timer = None

        def _vx_check(self, waiting_on: Any) -> None:
            """The timer armed when a head (``waiting_on`` is the previous cycle, or None) or a body
            (``waiting_on`` is its cycle) began to be awaited has fired."""
            self._vx_timer = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self:  # closed or upgraded
                return
            cycle = self.cycle
            if cycle is waiting_on and (cycle is None or cycle.response_complete):
                slow_head.warning(
                    "closed a connection from %s: no complete request head within %g s",
                    _peer(self.client),
                    header_timeout_s,
                )
            elif cycle is waiting_on and cycle.more_body and not cycle.response_complete:
                slow_body.warning(
                    "closed a connection from %s: request body not complete within %g s of its head",
                    _peer(self.client),
                    body_timeout_s,
                )
            else:
                return
            transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _peer(client: Any) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"


def quiet_accept_errors(loop: asyncio.AbstractEventLoop, every_s: float = 10.0) -> None:
    """Log asyncio's accept failures (out of file descriptors) as one warning per ``every_s``
    instead of a traceback each time, and make asyncio's one-second pause after such a failure hold
    (:func:`_stop_at_first_failure`); every other loop error goes to the handler set before."""
    limited = RateLimitedLog(log, every_s)
    previous = loop.get_exception_handler()
    failures = _stop_at_first_failure(loop)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if "socket" in context and isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES:
            failures[0] += 1
            limited.warning("cannot accept connections: %s; retrying each second", context.get("exception"))
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def _stop_at_first_failure(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Make asyncio's accept loop stop at its first failure for want of resources.

    asyncio (``selector_events``, CPython 3.11-3.13) accepts up to ``backlog`` connections per
    readiness event; on EMFILE it stops watching the socket and schedules a restart in a second, but
    goes on through the rest of its ``backlog`` (uvicorn's: 2048) tries, each failing and scheduling
    one more restart, and every restart re-arms the socket: out of file descriptors, the server spent
    1.1-1.6 s of CPU per 5 s. Here each try takes one connection, and the tries stop at the first
    failure (the loop's exception handler counts them in the returned list), so a pause is one
    failed accept and one restart a second. A loop without that private method is left as it is.
    """
    failures = [0]
    accept = getattr(loop, "_accept_connection", None)
    if accept is None:
        return failures
    backlogs: dict[int, int] = {}

    def accept_until_failure(
        protocol_factory: Any,
        sock: Any,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *rest: Any,
    ) -> None:
        tries = backlogs.setdefault(sock.fileno(), backlog)  # asyncio's restart passes our 1
        before = failures[0]
        for _ in range(tries):
            if not _pending(sock):
                return
            accept(protocol_factory, sock, sslcontext, server, 1, *rest)
            if failures[0] != before:  # asyncio stopped watching the socket and restarts it in 1 s
                return

    loop._accept_connection = accept_until_failure  # type: ignore[attr-defined]
    return failures


def _pending(sock: Any) -> bool:
    """Whether a connection waits on listening socket ``sock`` (poll, no wait)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))
