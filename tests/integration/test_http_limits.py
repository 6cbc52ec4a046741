"""Limits on the HTTP server's sockets, tried with raw sockets against the real ``voxcast serve``
process: idle and half-sent heads and slow bodies are shed (slowloris), a normal request is served
while they are held, a connection over the cap is answered 503 at once, and running out of file
descriptors neither floods the log nor stops the server for good."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.fixtures.procs import free_port, stop_process
from tests.integration.test_http_process import REPO_ROOT, _env, _wait_ready

Factory = Callable[[str], Path]
SAY = {"input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 2}
HEAD = b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"


def _serve(env: dict[str, str], log: Path, nofile: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()

    def limit_fds() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(port)]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=fh, stderr=fh, preexec_fn=limit_fds)
    return proc, port


def _connect(port: int, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    if data:
        sock.sendall(data)
    return sock


def _ends(sock: socket.socket, timeout_s: float = 60.0) -> bytes:
    """Everything the server sends until it closes or resets the connection (socket.timeout if it
    holds it past ``timeout_s``: a generous bound, the limits under test are 1-2 s)."""
    sock.settimeout(timeout_s)
    got = b""
    try:
        while part := sock.recv(65536):
            got += part
    except ConnectionResetError:
        pass
    sock.close()
    return got


def _speak(port: int) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=SAY, timeout=60)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_idle_half_sent_and_slow_sockets_are_shed_while_requests_go_on(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    env = _env(
        tiny_model_dir("custom_voice"),
        tmp_path,
        VOXCAST_HTTP_HEADER_TIMEOUT_S="1",
        VOXCAST_HTTP_BODY_TIMEOUT_S="1",
        VOXCAST_HTTP_IDLE_TIMEOUT_S="1",
    )
    proc, port = _serve(env, tmp_path / "serve.log")
    try:
        _wait_ready(f"http://127.0.0.1:{port}/ping", proc)
        held = [_connect(port) for _ in range(20)]  # nothing sent
        held += [_connect(port, HEAD) for _ in range(20)]  # a head without its end
        held += [_connect(port, HEAD + b"Content-Length: 1000\r\n\r\n{") for _ in range(20)]  # a slow body
        ok = _speak(port)  # served while they are held
        assert ok.status_code == 200 and len(ok.content) == 2 * 3840
        # a kept-alive connection whose next head never ends
        body = httpx.Request("POST", "/", json=SAY).content
        again = _connect(port, HEAD + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while not got.endswith(b"0\r\n\r\n"):  # the whole chunked response
            got += again.recv(65536)
        again.sendall(HEAD)
        for sock in [*held, again]:
            assert _ends(sock) == b""  # closed without an answer
        assert _speak(port).status_code == 200
        _stop(proc)
    finally:
        stop_process(proc)
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and " ERROR " not in log
    assert "no complete request head within 1 s" in log and "request body not complete within 1 s" in log


def test_a_connection_over_the_cap_gets_503_at_once(tiny_model_dir: Factory, tmp_path: Path) -> None:
    env = _env(tiny_model_dir("custom_voice"), tmp_path, VOXCAST_HTTP_MAX_CONNECTIONS="3")
    proc, port = _serve(env, tmp_path / "serve.log")
    try:
        _wait_ready(f"http://127.0.0.1:{port}/ping", proc)
        held = [_connect(port) for _ in range(3)]  # the header timeout (10 s) holds them meanwhile
        refused = _ends(_connect(port))
        assert refused.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in refused
        for sock in held:
            sock.close()
        assert _speak(port).status_code == 200  # room again
        _stop(proc)
    finally:
        stop_process(proc)


def _serve_out_of_fds(
    tiny_model_dir: Factory, tmp_path: Path, header_timeout_s: int
) -> tuple[subprocess.Popen[bytes], int]:
    """A server with 128 file descriptors and a connection cap above that, so idle sockets exhaust
    the descriptors before the cap refuses any; idle heads are shed after ``header_timeout_s``."""
    env = _env(
        tiny_model_dir("custom_voice"),
        tmp_path,
        VOXCAST_HTTP_HEADER_TIMEOUT_S=str(header_timeout_s),
        VOXCAST_HTTP_MAX_CONNECTIONS="1000",
    )
    return _serve(env, tmp_path / "serve.log", nofile=128)


def test_out_of_file_descriptors_backs_off_quietly_and_recovers(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    """With 128 file descriptors and a cap set above that, 150 idle sockets exhaust them: accepting
    pauses (one warning line per 10 s, not a traceback per try), the idle ones are shed after the
    header timeout, those that waited in the backlog are then accepted and shed, and a normal
    request is served again."""
    proc, port = _serve_out_of_fds(tiny_model_dir, tmp_path, header_timeout_s=2)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/ping", proc)
        idle = [_connect(port) for _ in range(150)]
        for sock in idle:
            assert _ends(sock) == b""
        assert _speak(port).status_code == 200
        _stop(proc)
    finally:
        stop_process(proc)
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and "out of system resource" not in log
    assert 1 <= log.count("cannot accept connections") <= 10


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_file_descriptors_the_accept_loop_stays_idle(tiny_model_dir: Factory, tmp_path: Path) -> None:
    """While every file descriptor is taken (128, 200 sockets held open, a cap above that), the
    server stops accepting for a while and burns next to no CPU (asyncio's own retry tried the whole
    backlog and re-armed it from every failed try: 1.6 s of CPU per 5 s); once the sockets close it
    serves again."""
    proc, port = _serve_out_of_fds(tiny_model_dir, tmp_path, header_timeout_s=120)
    held: list[socket.socket] = []
    try:
        _wait_ready(f"http://127.0.0.1:{port}/ping", proc)
        held = [_connect(port) for _ in range(200)]
        time.sleep(2.0)  # the descriptors run out; asyncio's retries begin
        before = _cpu_s(proc.pid)
        time.sleep(5.0)
        busy_s = _cpu_s(proc.pid) - before
        for sock in held:
            sock.close()
        assert busy_s < 0.4, f"{busy_s:.2f} s of CPU in 5 s while out of file descriptors"
        assert _speak(port).status_code == 200
        _stop(proc)
    finally:
        for sock in held:
            sock.close()
        stop_process(proc)
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log
    assert 1 <= log.count("cannot accept connections") <= 5


def test_request_heads_past_the_limits_get_431_and_the_memory_is_not_held(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    """Before: one 16 MB header got 200, and 20 of them at once raised the server's RSS by ~0.4 GB,
    never given back. Now a head over ``VOXCAST_HTTP_MAX_HEADER_KB`` or ``VOXCAST_HTTP_MAX_HEADERS``
    is answered 431 with OpenAI's error object as it arrives, and the server keeps serving."""
    env = _env(
        tiny_model_dir("custom_voice"),
        tmp_path,
        VOXCAST_HTTP_MAX_HEADER_KB="16",
        VOXCAST_HTTP_MAX_HEADERS="20",
    )
    proc, port = _serve(env, tmp_path / "serve.log")
    try:
        _wait_ready(f"http://127.0.0.1:{port}/ping", proc)
        rss_before = _rss_kb(proc.pid)
        big = b"X-Big: " + b"a" * (4 << 20) + b"\r\n"  # 4 MB, sent in pieces
        refused = []
        for _ in range(10):
            sock = _connect(port, HEAD)
            try:
                for i in range(0, len(big), 1 << 16):
                    sock.sendall(big[i : i + (1 << 16)])
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed by the server once the limit passed
            refused.append(_ends(sock))
        assert all(r.startswith(b"HTTP/1.1 431 ") and b'"code": "header_too_large"' in r for r in refused)
        many = HEAD + b"".join(f"X-H{i}: {i}\r\n".encode() for i in range(30)) + b"\r\n"
        assert _ends(_connect(port, many)).startswith(b"HTTP/1.1 431 ")
        # a head within the limits (a body in the same packet is not counted as head)
        body = httpx.Request("POST", "/", json=SAY).content
        fits = (
            HEAD
            + b"X-Ok: "
            + b"b" * 8000
            + b"\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        assert _ends(_connect(port, fits + body)).startswith(b"HTTP/1.1 200 ")
        assert _speak(port).status_code == 200
        grown_mb = (_rss_kb(proc.pid) - rss_before) / 1024
        assert grown_mb < 100, f"RSS grew {grown_mb:.0f} MB"
        _stop(proc)
    finally:
        stop_process(proc)
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log and "refused a request from" in log


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
