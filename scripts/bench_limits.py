"""Socket limits of ``voxcast serve`` measured against the real server process on a tiny checkpoint.

Prints and writes JSON: how many idle sockets the server held, how long it took to shed them
(``VOXCAST_HTTP_HEADER_TIMEOUT_S``), the server's RSS before and after N clients that stop reading
(``VOXCAST_HTTP_STALL_S``), and the exit time after SIGTERM once they were cut off.

    python scripts/bench_limits.py --model /tmp/tiny --idle 200 --stalls 10 --out limits.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _start(model: str, port: int, store: Path, env_extra: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXCAST_")}
    env.update(VOXCAST_MODEL=model, VOXCAST_DEVICE="cpu", VOXCAST_STORAGE_DIR=str(store), **env_extra)
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not become ready")


def _stalled(port: int, seed: int) -> socket.socket:
    body = json.dumps(
        {"input": "Hello.", "voice": "ryan", "response_format": "pcm", "sample_rate": 48000, "speed": 0.25}
        | {"max_frames": 8000, "seed": seed}
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def _shed_s(socks: list[socket.socket], t0: float) -> float:
    """Seconds from ``t0`` until the server closed the last of ``socks``."""
    for sock in socks:
        sock.settimeout(120)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass
        sock.close()
    return time.monotonic() - t0


def _stall_round(api: str, port: int, stalls: int, round_: int) -> None:
    """``stalls`` clients that stop reading, until the server has cut them all off."""
    socks = [_stalled(port, round_ * 1000 + seed) for seed in range(stalls)]
    deadline = time.monotonic() + 600
    while httpx.get(api + "/health", timeout=10).json()["requests"]["stalled"] < stalls * round_:
        if time.monotonic() > deadline:
            raise RuntimeError("the clients were not cut off")
        time.sleep(0.5)
    for sock in socks:
        sock.close()
    time.sleep(2)


def measure(model: str, idle: int, stalls: int, header_timeout_s: float) -> dict[str, Any]:
    port = 18000 + os.getpid() % 1000
    store = Path(f"/tmp/bench-limits-{os.getpid()}")
    extra = {"VOXCAST_HTTP_HEADER_TIMEOUT_S": str(header_timeout_s), "VOXCAST_HTTP_STALL_S": "1"}
    extra |= {"VOXCAST_HTTP_QUEUE_CHUNKS": "1", "VOXCAST_WARMUP": "0"}
    proc = _start(model, port, store, extra)
    api = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {
        "idle_sockets": idle,
        "stalled_clients": stalls,
        "header_timeout_s": header_timeout_s,
    }
    try:
        t0 = time.monotonic()
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle)]
        t1 = time.monotonic()
        ok = httpx.post(
            api + "/v1/audio/speech",
            json={"input": "Hi.", "voice": "ryan", "response_format": "pcm", "max_frames": 2},
            timeout=120,
        )
        out["request_while_held_ms"] = round((time.monotonic() - t1) * 1000, 1)
        out["request_while_held_status"] = ok.status_code
        out["idle_shed_s"] = round(_shed_s(held, t0), 2)
        out["rss_before_stalls_mb"] = round(_rss_mb(proc.pid), 1)
        for round_ in (1, 2):  # a second round: a leak grows again, a one-off (batch buffers) does not
            _stall_round(api, port, stalls, round_)
            out[f"rss_after_stalls_round{round_}_mb"] = round(_rss_mb(proc.pid), 1)
        t2 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out["exit_code"] = proc.wait(timeout=120)
        out["sigterm_exit_s"] = round(time.monotonic() - t2, 2)
    finally:
        if proc.poll() is None:
            proc.kill()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a tiny checkpoint (voxcast make-test-model)")
    p.add_argument("--idle", type=int, default=200, help="idle sockets to open")
    p.add_argument("--stalls", type=int, default=10, help="clients that stop reading")
    p.add_argument("--header-timeout", type=float, default=2.0, help="VOXCAST_HTTP_HEADER_TIMEOUT_S")
    p.add_argument("--out", type=Path, default=Path("bench_limits.json"))
    args = p.parse_args()
    figures = measure(args.model, args.idle, args.stalls, args.header_timeout)
    cpu = next(
        (
            x.split(":", 1)[1].strip()
            for x in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in x
        ),
        "?",
    )
    figures["cpu"] = f"{cpu}, {os.cpu_count()} cores"
    for k, v in figures.items():
        print(f"{k:28s} {v}")
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
