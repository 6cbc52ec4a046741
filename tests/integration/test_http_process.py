"""The HTTP server as a process: ``handler.py`` with ``VOXCAST_ENDPOINT_TYPE=http`` (RunPod load-balancing
endpoints: ``PORT``, ``/ping`` on ``PORT_HEALTH``) and ``voxcast serve``, stopped by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

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
                timeout=60,
            )
            assert r.status_code == 200 and len(r.content) == 3 * 3840
            # the health port answers health only
            assert httpx.get(f"http://127.0.0.1:{health}/v1/models", timeout=5).status_code == 404
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            stop_process(proc)
    assert b"Traceback" not in (tmp_path / "server.log").read_bytes()


def test_voxcast_serve_stops_cleanly_mid_stream_and_a_bad_model_exits_1(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    port = free_port()
    env = _env(tiny_model_dir("custom_voice"), tmp_path, VOXCAST_DRAIN_S="1")
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(port)]
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=log)
        try:
            _wait_ready(f"http://127.0.0.1:{port}/ping", proc)
            with httpx.stream(
                "POST",
                f"http://127.0.0.1:{port}/v1/audio/speech",
                json={"input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 8000},
                timeout=60,
            ) as r:
                assert r.status_code == 200
                body = r.iter_raw()
                next(body)
                proc.send_signal(signal.SIGTERM)
                with pytest.raises(httpx.HTTPError):  # the long stream is cut at the drain deadline, visibly
                    for _ in body:
                        pass
            assert proc.wait(timeout=30) == 0
        finally:
            stop_process(proc)

    bad = subprocess.run(
        [*cmd[:-1], str(free_port()), "--model", str(tmp_path / "missing")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert bad.returncode == 1, bad.stderr[-2000:]
