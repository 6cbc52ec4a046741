"""``voxcast serve`` / ``server.py``: the HTTP server process.

The API port answers ``/ping`` with 204 at once, while the service loads and warms on a background
thread, and with 200 once it is ready (RunPod load-balancing endpoints route traffic only then); a
failed load exits with code 1.

SIGTERM/SIGINT drain the server (:class:`~voxcast.serving.drain.Drain`): ``/ping`` answers 503
``draining`` and new requests 503 at once, while open responses and WebSockets go on for up to
``VOXCAST_DRAIN_S`` (30); those still open then end with a ``shutdown`` error (an SSE ``error`` event,
a WebSocket ``error`` and close 1001, or a raw audio body closed before its end). Then uvicorn stops,
the service is closed (voice writes still queued reach the store) and the process exits 0. A second
signal stops uvicorn at once.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import uvicorn

from voxcast.serving.cli.errors import CommandError
from voxcast.serving.drain import Drain, drain_seconds
from voxcast.serving.exit import die, ends_process
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.http.limits import default_max_connections, guarded_protocol, quiet_accept_errors

__all__ = ["add_parsers", "serve"]

log = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 5.0
"""After the drain deadline, how long open responses have to send their ``shutdown`` ending."""


class _Server(uvicorn.Server):
    """A uvicorn server that drains before it stops (the first signal) and stops its peers too (the
    API and the health port share one signal)."""

    peers: list[uvicorn.Server]
    drain: Drain

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.drain.begin():  # the first signal: drain; _stop_when_drained stops the servers
            return
        super().handle_exit(sig, frame)
        for peer in self.peers:
            peer.should_exit = True


def _stop_when_drained(drain: Drain, servers: list[_Server]) -> None:
    """Once nothing is open (at the latest just after the drain deadline), stop every server."""
    drain.wait_idle(drain.deadline_s + _SHUTDOWN_GRACE_S)
    for s in servers:
        s.should_exit = True


def serve(env: Mapping[str, str] | None = None, *, http: HttpConfig | None = None) -> int:
    """Run the HTTP server until SIGTERM/SIGINT; returns the exit code (0 after a clean stop)."""
    from voxcast.service import Service, ServiceConfig  # imports torch: not for ``voxcast --help``
    from voxcast.serving.http.app import ServiceHolder, create_app, health_app

    env = os.environ if env is None else env
    http = HttpConfig.from_env(env) if http is None else http
    service_config = ServiceConfig.from_env(env)
    _check_before_binding(service_config.engine.model, http)
    drain_s = drain_seconds(env)
    holder = ServiceHolder()
    app = create_app(holder, http)

    protocol = _protocol(http)

    def config(asgi: Any, port: int) -> uvicorn.Config:
        return uvicorn.Config(
            asgi,
            host=http.host,
            port=port,
            log_config=None,  # voxcast's logging (VOXCAST_LOG_LEVEL), not uvicorn's own
            timeout_graceful_shutdown=int(_SHUTDOWN_GRACE_S),  # the drain came first
            lifespan="off",
            http=protocol,
            timeout_keep_alive=http.idle_timeout_s,
        )

    servers = [_Server(config(app, http.port))]
    if http.separate_health_port:
        assert http.health_port is not None
        servers.append(_Server(config(health_app(holder), http.health_port)))

    def draining() -> None:  # in the signal handler
        holder.state = "draining"
        threading.Thread(
            target=_stop_when_drained, args=(drain, servers), name="voxcast-drain", daemon=True
        ).start()

    drain = holder.drain = Drain(drain_s, on_begin=draining)
    for s in servers:
        s.peers = [p for p in servers if p is not s]
        s.drain = drain

    def failed(_: BaseException) -> None:
        threading.Timer(0.5, die, (1,)).start()  # let /ping report the failure briefly

    holder.load_in_background(lambda metrics: Service.load(service_config, metrics), failed)
    log.info(
        "voxcast serve: listening on %s:%d (health on %s)",
        http.host,
        http.port,
        http.health_port or http.port,
    )
    # uvicorn re-raises a signal it handled once it has stopped; a quiet handler makes that a no-op,
    # so the process closes the service and exits 0.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)

    async def run_all() -> None:
        quiet_accept_errors(asyncio.get_running_loop())
        await asyncio.gather(*(s.serve() for s in servers))

    asyncio.run(run_all())
    if holder.service is not None:
        log.info("voxcast serve: stopped; closing the service")
        holder.service.close()
    return 0


PORT_IN_USE_EXIT = 4
"""``voxcast serve``'s exit code when its port is taken by another process (README: exit codes)."""


def _check_before_binding(model: str, http: HttpConfig) -> None:
    """Fail in a second, with one line, before the port is bound and the model loads in the background:
    a model that names no checkpoint (a missing path; offline, a hub id not in the cache) is bad input
    (exit 2); a port another process holds exits :data:`PORT_IN_USE_EXIT`.

    Raises:
        CommandError: with the exit code and the line.
    """
    from voxcast.errors import CheckpointError
    from voxcast.models.hub import not_a_checkpoint, resolve_checkpoint

    wrong = not_a_checkpoint(model)
    if wrong is None and os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        try:
            resolve_checkpoint(model, local_files_only=True)
        except CheckpointError as e:
            wrong = e.message
    if wrong is not None:
        raise CommandError(f"model: {wrong}", code=2)
    ports = [http.port] + ([http.health_port] if http.separate_health_port and http.health_port else [])
    for port in ports:
        if port and not _free(http.host, port):
            raise CommandError(
                f"port {port} on {http.host} is already in use (another server?): choose another with "
                "--port / VOXCAST_PORT",
                code=PORT_IN_USE_EXIT,
            )


def _free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (a listening server holds it; TIME_WAIT does not)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise CommandError(f"cannot listen on {host}:{port}: {e.strerror}", code=2) from e
    return True


def _protocol(http: HttpConfig) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) with the header/body timeouts and the cap."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    cap = http.max_connections or default_max_connections()
    log.info(
        "connections: at most %d; head within %g s, body within %g s, idle %d s",
        cap,
        http.header_timeout_s,
        http.body_timeout_s,
        http.idle_timeout_s,
    )
    return guarded_protocol(
        AutoHTTPProtocol,
        header_timeout_s=http.header_timeout_s,
        body_timeout_s=http.body_timeout_s,
        max_connections=cap,
        max_header_bytes=http.max_header_bytes,
        max_headers=http.max_headers,
    )


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the HTTP server (OpenAI-compatible /v1/audio/speech, voices, /ping)",
        description="Serve the OpenAI-compatible speech API and voice management over HTTP. Settings "
        "come from VOXCAST_* variables; flags override them.",
    )
    p.add_argument("--host", help="interface to listen on (default: VOXCAST_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="API port (default: VOXCAST_PORT, PORT or 8000)")
    p.add_argument("--health-port", type=int, help="a separate port for /ping (default: PORT_HEALTH)")
    p.add_argument("--model", help="checkpoint directory or hub id (default: VOXCAST_MODEL)")
    p.add_argument("--device", help="auto, cpu, cuda (default: VOXCAST_DEVICE)")
    p.add_argument("--dtype", help="auto, float32, bfloat16 (default: VOXCAST_DTYPE)")
    p.set_defaults(func=_run)


@ends_process
def _run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    for flag, name in (
        ("host", "VOXCAST_HOST"),
        ("port", "VOXCAST_PORT"),
        ("health_port", "PORT_HEALTH"),
        ("model", "VOXCAST_MODEL"),
        ("device", "VOXCAST_DEVICE"),
        ("dtype", "VOXCAST_DTYPE"),
    ):
        if getattr(args, flag) is not None:
            env[name] = str(getattr(args, flag))
    return serve(env)


def main(argv: Sequence[str] | None = None) -> int:
    """``server.py``: ``voxcast serve`` with the same flags."""
    from voxcast.serving.cli.main import main as cli_main

    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])
