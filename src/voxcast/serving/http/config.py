"""Settings of the HTTP server, built from an environment mapping (and ``voxcast serve`` flags).

Only the server's own knobs live here; the model, device, storage and chunking come from the service
configuration (``voxcast.service.ServiceConfig``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from voxcast.envvars import env_float, env_int, env_str
from voxcast.serving.http.exposure import Exposure

__all__ = ["HttpConfig"]

_MB = 1024 * 1024


@dataclass(frozen=True)
class HttpConfig:
    """How the HTTP server runs. Build with :meth:`from_env`.

    Attributes:
        host: interface to listen on (``VOXCAST_HOST``, ``127.0.0.1``; ``0.0.0.0`` in a container).
        port: port of the API (``VOXCAST_PORT``, else RunPod's ``PORT``, else 8000).
        health_port: a second port answering only ``/ping`` and ``/health`` (RunPod load-balancing
            endpoints' ``PORT_HEALTH``; unset or equal to ``port``: the API port answers them).
        api_key: bearer token every ``/v1/*`` request must carry (``VOXCAST_API_KEY``; unset = no
            auth). Health routes stay open; ``/metrics`` needs it too (see ``exposure``).
        max_body_bytes: largest request body (``VOXCAST_HTTP_MAX_BODY_MB``, 16): a bigger one gets 413.
        queue_chunks: encoded chunks buffered per stream between the engine and the socket
            (``VOXCAST_HTTP_QUEUE_CHUNKS``, 32).
        stall_s: a client that leaves that buffer full this long (it stopped reading) has its stream
            cancelled and counted (``VOXCAST_HTTP_STALL_S``, 10).
        header_timeout_s: a connection must complete each request head (request line and headers)
            within this long of its opening or of its previous response, else it is closed
            (``VOXCAST_HTTP_HEADER_TIMEOUT_S``, 10; slowloris).
        body_timeout_s: a request's body must be complete this long after its head, else the
            connection is closed (``VOXCAST_HTTP_BODY_TIMEOUT_S``, 60: 16 MB at ~2 Mbit/s).
        idle_timeout_s: a keep-alive connection idle this long after a response is closed
            (``VOXCAST_HTTP_IDLE_TIMEOUT_S``, 5: uvicorn's ``timeout_keep_alive``; whole seconds).
        max_connections: connections held at once, WebSockets included; one more gets 503 and is
            closed at once (``VOXCAST_HTTP_MAX_CONNECTIONS``; unset: the process's file-descriptor
            limit less a reserve, :func:`voxcast.serving.http.limits.default_max_connections`).
        max_header_bytes: largest request head (request line and headers, bytes); a bigger one gets
            431 and the connection is closed (``VOXCAST_HTTP_MAX_HEADER_KB``, 64).
        max_headers: most header lines in one request head; more get 431 (``VOXCAST_HTTP_MAX_HEADERS``,
            100).
        exposure: browser origins (CORS), API docs and metrics access (``VOXCAST_CORS_ORIGINS``,
            ``VOXCAST_HTTP_DOCS``, ``VOXCAST_METRICS_AUTH``; :mod:`voxcast.serving.http.exposure`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    health_port: int | None = None
    api_key: str | None = None
    max_body_bytes: int = 16 * _MB
    queue_chunks: int = 32
    stall_s: float = 10.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: int = 5
    max_connections: int | None = None
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    exposure: Exposure = field(default_factory=Exposure)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, not {self.port}")
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(f"health port must be 0..65535, not {self.health_port}")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")
        if self.queue_chunks < 1:
            raise ValueError("queue_chunks must be >= 1")
        if self.stall_s <= 0:
            raise ValueError("stall_s must be > 0")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0 or self.idle_timeout_s < 1:
            raise ValueError("header and body timeouts must be > 0, the idle timeout >= 1 s")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if self.max_header_bytes < 1024 or self.max_headers < 8:
            raise ValueError("max_header_bytes must be >= 1024 and max_headers >= 8")

    @property
    def separate_health_port(self) -> bool:
        return self.health_port is not None and self.health_port != self.port

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HttpConfig:
        """Build from environment variables; unset ones keep their defaults.

        Raises:
            ValueError: a variable that does not parse or is out of range (named in the message).
        """
        d = cls()
        port_var = "VOXCAST_PORT" if env_str(env, "VOXCAST_PORT") else "PORT"
        health = env_str(env, "PORT_HEALTH")
        return cls(
            host=env_str(env, "VOXCAST_HOST") or d.host,
            port=env_int(env, port_var, d.port, lo=0, hi=65535),
            health_port=env_int(env, "PORT_HEALTH", 0, lo=0, hi=65535) if health else None,
            api_key=env_str(env, "VOXCAST_API_KEY"),
            max_body_bytes=int(env_float(env, "VOXCAST_HTTP_MAX_BODY_MB", 16.0, positive=True) * _MB),
            queue_chunks=env_int(env, "VOXCAST_HTTP_QUEUE_CHUNKS", d.queue_chunks, lo=1, hi=4096),
            stall_s=env_float(env, "VOXCAST_HTTP_STALL_S", d.stall_s, positive=True),
            header_timeout_s=env_float(
                env, "VOXCAST_HTTP_HEADER_TIMEOUT_S", d.header_timeout_s, positive=True
            ),
            body_timeout_s=env_float(env, "VOXCAST_HTTP_BODY_TIMEOUT_S", d.body_timeout_s, positive=True),
            idle_timeout_s=env_int(env, "VOXCAST_HTTP_IDLE_TIMEOUT_S", d.idle_timeout_s, lo=1, hi=3600),
            max_connections=(
                env_int(env, "VOXCAST_HTTP_MAX_CONNECTIONS", 1, lo=1, hi=1 << 20)
                if env_str(env, "VOXCAST_HTTP_MAX_CONNECTIONS")
                else None
            ),
            max_header_bytes=int(
                env_float(env, "VOXCAST_HTTP_MAX_HEADER_KB", 64.0, lo=1.0, hi=65536.0) * 1024
            ),
            max_headers=env_int(env, "VOXCAST_HTTP_MAX_HEADERS", d.max_headers, lo=8, hi=10_000),
            exposure=Exposure.from_env(env),
        )
