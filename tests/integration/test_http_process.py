"""The HTTP server as a process: ``handler.py`` with ``VOXCAST_ENDPOINT_TYPE=http`` (RunPod load-balancing
endpoints: ``PORT``, ``/ping`` on ``PORT_HEALTH``) and ``voxcast serve``, stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.fixtures.polling import wait_until
from tests.fixtures.procs import free_port, stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
Factory = Callable[[str], Path]


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> list[int]:
    """Poll ``url`` (/ping) until 200; returns every status seen (204 while loading, 200 ready)."""
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited"
        try:
            status = httpx.get(url, timeout=2).status_code
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        seen.append(status)
        if status == 200:
            return seen
        assert status == 204
        time.sleep(0.05)
    raise AssertionError("the server never became ready")


def _env(model: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOXCAST_", "RUNPOD_", "PORT"))}
    env.update(
        VOXCAST_MODEL=str(model),
        VOXCAST_DEVICE="cpu",
        VOXCAST_STORAGE_DIR=str(tmp_path / "store"),
        VOXCAST_STORAGE_FSYNC="0",
        VOXCAST_WARMUP="0",
        VOXCAST_THREADS="1",  # one OpenMP thread, as the other server fixtures: the test process
        OMP_NUM_THREADS="1",  # works beside it on 2 cores (oversubscribed teams are 2-10x slower)
        **extra,
    )
    return env


def test_handler_serves_http_for_load_balancing_endpoints(tiny_model_dir: Factory, tmp_path: Path) -> None:
    port, health = free_port(), free_port()
    env = _env(
        tiny_model_dir("custom_voice"),
        tmp_path,
        VOXCAST_ENDPOINT_TYPE="http",
        PORT=str(port),
        PORT_HEALTH=str(health),
        VOXCAST_HOST="127.0.0.1",
        VOXCAST_LOG_FORMAT="json",
    )
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "handler.py"], cwd=REPO_ROOT, env=env, stdout=log, stderr=log
        )
        try:
            seen = _wait_ready(f"http://127.0.0.1:{health}/ping", proc)
            assert seen[-1] == 200
            api = f"http://127.0.0.1:{port}"
            assert httpx.get(api + "/ping", timeout=5).status_code == 200
            r = httpx.post(
                api + "/v1/audio/speech",
                json={"input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 3},
                headers={"X-Request-Id": "call-42"},
                timeout=60,
            )
            assert r.status_code == 200 and len(r.content) == 3 * 3840
            assert r.headers["x-request-id"] == "call-42"
            # the health port answers health only
            assert httpx.get(f"http://127.0.0.1:{health}/v1/models", timeout=5).status_code == 404
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            stop_process(proc)
    log_text = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log_text
    lines = [json.loads(x) for x in log_text.splitlines() if x.startswith("{")]
    (line,) = [x for x in lines if x["logger"] == "voxcast.requests"]  # the caller's id names the request
    assert line["request_id"] == "call-42" and line["entry"] == "http" and line["outcome"] == "ok"


def _serve(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(port)]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=fh, stderr=fh)
    return proc, f"http://127.0.0.1:{port}"


def _speaking(api: str, text: str, max_frames: int) -> ClientConnection:
    """A WebSocket whose sentence ``text`` has started."""
    ws = connect(api.replace("http", "ws") + "/v1/audio/speech/stream", open_timeout=30)
    ws.send(json.dumps({"type": "config", "voice": "ryan", "max_frames": max_frames, "seed": 3}))
    ws.send(json.dumps({"type": "text", "text": text}))
    ws.send(json.dumps({"type": "flush"}))
    assert json.loads(ws.recv(timeout=60))["type"] == "started"
    return ws


def _sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: "):
            yield json.loads(line[6:])


def test_sigterm_drains_open_streams_then_exits_0(tiny_model_dir: Factory, tmp_path: Path) -> None:
    """Within the drain: /ping and new requests answer 503, the open SSE response and WebSocket
    utterance finish whole, and the server exits 0 once they have."""
    env = _env(tiny_model_dir("custom_voice"), tmp_path, VOXCAST_DRAIN_S="600")
    proc, api = _serve(env, tmp_path / "serve.log")
    try:
        _wait_ready(api + "/ping", proc)
        ws = _speaking(api, "Still speaking.", max_frames=12)
        speech = {"input": "Hello.", "voice": "ryan", "max_frames": 24, "seed": 1, "response_format": "pcm"}
        speech["stream_format"] = "sse"
        with httpx.stream("POST", api + "/v1/audio/speech", json=speech, timeout=60) as r:
            assert r.status_code == 200
            events = _sse_events(r.iter_lines())
            assert next(events)["type"] == "speech.audio.delta"
            proc.send_signal(signal.SIGTERM)
            wait_until(lambda: httpx.get(api + "/ping", timeout=5).status_code == 503, what="draining")
            assert httpx.get(api + "/ping", timeout=5).json()["status"] == "draining"
            refused = httpx.post(api + "/v1/audio/speech", json=speech, timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"]
            _assert_refused_while_draining(api)
            rest = list(events)
        assert rest[-1]["type"] == "speech.audio.done" and rest[-1]["timing"]["frames"] == 24
        seen = [json.loads(m)["type"] for m in _ws_messages(ws) if isinstance(m, str)]
        assert "segment_done" in seen and "error" not in seen
        ws.send(json.dumps({"type": "close"}))
        assert [json.loads(m)["type"] for m in _ws_messages(ws) if isinstance(m, str)] == ["closed"]
        assert proc.wait(timeout=60) == 0
    finally:
        stop_process(proc)
    log = (tmp_path / "serve.log").read_text()
    # the WebSocket is in flight until it closes (the SSE response may have ended before the signal)
    assert "in flight, deadline 600 s" in log and "Traceback" not in log


def _assert_refused_while_draining(api: str) -> None:
    """A WebSocket opened while the server drains: an ``error`` saying so, then close 1001 (going
    away) with a reason that says draining (not 1013 "the model is loading")."""
    with connect(api.replace("http", "ws") + "/v1/audio/speech/stream", open_timeout=30) as ws:
        error = json.loads(ws.recv(timeout=30))
        assert error["type"] == "error" and error["error"]["code"] == "engine_unavailable"
        assert "draining" in error["error"]["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert "draining" in closed.value.rcvd.reason


def _ws_messages(ws: ClientConnection) -> Iterator[str | bytes]:
    """Messages until the server closes or ``segment_done``/``closed``/``error`` arrives."""
    while True:
        try:
            message = ws.recv(timeout=60)
        except ConnectionClosed:
            return
        yield message
        if isinstance(message, str) and json.loads(message)["type"] in ("segment_done", "closed", "error"):
            return


def test_streams_open_at_the_drain_deadline_end_with_shutdown(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    """Past the deadline: SSE ends with an ``error`` event of code ``shutdown``, the WebSocket gets the
    same error and close code 1001, raw audio is cut before its body's end; the server exits 0."""
    env = _env(tiny_model_dir("custom_voice"), tmp_path, VOXCAST_DRAIN_S="0.5")
    proc, api = _serve(env, tmp_path / "serve.log")
    long = {"input": "Hello.", "voice": "ryan", "max_frames": 8000, "seed": 1, "response_format": "pcm"}
    try:
        _wait_ready(api + "/ping", proc)
        ws = _speaking(api, "A long sentence.", max_frames=8000)
        with (
            httpx.stream(
                "POST", api + "/v1/audio/speech", json={**long, "stream_format": "sse"}, timeout=60
            ) as sse,
            httpx.stream("POST", api + "/v1/audio/speech", json=long, timeout=60) as raw,
        ):
            events, body = _sse_events(sse.iter_lines()), raw.iter_raw()
            assert next(events)["type"] == "speech.audio.delta" and next(body)
            proc.send_signal(signal.SIGTERM)
            last = list(events)[-1]
            assert last["type"] == "error" and last["error"]["code"] == "shutdown"
            with pytest.raises(httpx.HTTPError):  # cut visibly: no terminating chunk
                for _ in body:
                    pass
        errors = [json.loads(m) for m in _ws_messages(ws) if isinstance(m, str)]
        assert errors[-1]["type"] == "error" and errors[-1]["error"]["code"] == "shutdown"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert proc.wait(timeout=60) == 0
    finally:
        stop_process(proc)


def _stalled_request(port: int, seed: int) -> socket.socket:
    """A raw socket that sends a long pcm request and never reads (a tiny receive buffer, audio of
    many bytes per frame: the server's buffers fill within a few hundred frames)."""
    body = json.dumps(
        {
            "input": "Hello.",
            "voice": "ryan",
            "response_format": "pcm",
            "sample_rate": 48000,
            "speed": 0.25,
            "max_frames": 8000,
            "seed": seed,
        }
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def _read_to_end(sock: socket.socket, timeout_s: float = 60.0) -> None:
    """Read until the server closed or reset the connection (raises socket.timeout if it did not)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass


def test_stalled_clients_leave_nothing_in_flight(tiny_model_dir: Factory, tmp_path: Path) -> None:
    """A client that stops reading is cut off (VOXCAST_HTTP_STALL_S) and its connection reset; it
    leaves no drain registration behind, so SIGTERM on the idle server afterwards exits at once, not
    after the drain deadline (600 s here)."""
    env = _env(
        tiny_model_dir("custom_voice"),
        tmp_path,
        VOXCAST_DRAIN_S="600",
        VOXCAST_HTTP_STALL_S="1",
        VOXCAST_HTTP_QUEUE_CHUNKS="1",
    )
    proc, api = _serve(env, tmp_path / "serve.log")
    try:
        _wait_ready(api + "/ping", proc)
        socks = [_stalled_request(int(api.rsplit(":", 1)[1]), seed) for seed in (1, 2)]
        wait_until(
            lambda: httpx.get(api + "/health", timeout=5).json()["requests"]["stalled"] == 2,
            timeout_s=240,
            what="both clients cut off",
        )
        for sock in socks:  # the server let go of the connection (reset), not only of the stream
            _read_to_end(sock)
            sock.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        stop_process(proc)
    log = (tmp_path / "serve.log").read_text()
    assert "draining: 0 in flight" in log
    assert "Traceback" not in log and " ERROR " not in log


def test_a_bad_model_exits_2(tiny_model_dir: Factory, tmp_path: Path) -> None:
    env = _env(tiny_model_dir("custom_voice"), tmp_path)
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(free_port())]
    bad = subprocess.run(
        [*cmd, "--model", str(tmp_path / "missing")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert bad.returncode == 2, bad.stderr[-2000:]
