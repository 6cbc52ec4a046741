"""Benchmark the HTTP server's own cost: client-observed first audio vs the service's, over HTTP and WebSocket.

Runs the real server (uvicorn on a loopback port, in this process) on a random-weight CustomVoice
checkpoint (``--size``; built once and cached) and, for each N in ``--streams``, starts N requests
together (``--reps`` times) and records per request:

* HTTP (``POST /v1/audio/speech``, pcm, ``stream_format=audio``): client first byte = time from
  sending the request to the first audio byte read by an httpx client; service first audio =
  the ``X-Voxcast-TTFA-Ms`` header (the service's own ``ttfa_ms``: voice, queue wait, prefill, the
  first frame and its decode);
* WebSocket (``/v1/audio/speech/stream``, connected ahead): client first byte = time from sending
  the text and ``flush`` to the first binary message; service first audio = the ``chunk`` event's
  ``t_ms``;
* overhead = client first byte, counted from when the request's last byte left the client, minus
  service first audio: the server's own cost (reading and parsing the request, the thread hand-off,
  the event loop, the socket both ways);
* send = the client's own time from starting the request to its last byte leaving (building and
  writing it; N client threads share one GIL, and the engine may already be computing the first
  request): part of what a caller on this machine sees, not the server's cost. ``client`` (from the
  call) = send + overhead + service.

Prints p50/p95 per transport and stream count; writes ``bench-results/http-<size>.json``. For the
RunPod queue path (the SDK's one-second ``/stream`` polls on top of the handler) see bench_runpod.py.

    python scripts/bench_http.py [--size tiny|0.6b] [--quant int8] [--streams 1,4,8] [--reps 3] [--frames 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

ROOT = Path(__file__).resolve().parents[1]
from benchlib import at_once, checkpoint, cpu_name, machine_info, use_checkout  # noqa: E402

use_checkout()


from tests.fixtures.http_server import running  # noqa: E402

from voxcast.config import EngineConfig  # noqa: E402
from voxcast.engine.engine import Engine  # noqa: E402
from voxcast.service import Service, ServiceConfig  # noqa: E402
from voxcast.serving.http.app import ServiceHolder, create_app  # noqa: E402
from voxcast.serving.http.config import HttpConfig  # noqa: E402
from voxcast.storage.local import LocalBlobStore  # noqa: E402

TEXT = "Thank you for calling. Your call is important to us."


_clients = threading.local()


def http_once(base: str, frames: int, seed: int) -> dict[str, float]:
    body = {
        "input": TEXT,
        "voice": "ryan",
        "response_format": "pcm",
        "max_frames": frames,
        "seed": seed,
        "cache": False,
    }
    client = getattr(_clients, "client", None)
    if client is None:  # one client per thread, made outside the timed part (it builds an SSL context)
        client = _clients.client = httpx.Client(timeout=300)
    sent: list[float] = []

    def trace(event: str, info: Any) -> None:  # httpcore's trace: when the request's last byte left
        if event == "http11.send_request_body.complete":
            sent.append(time.perf_counter())

    t0 = time.perf_counter()
    with client.stream("POST", base + "/v1/audio/speech", json=body, extensions={"trace": trace}) as r:
        it = r.iter_raw()
        next(it)
        t1 = time.perf_counter()
        for _ in it:
            pass
    service = float(r.headers["x-voxcast-ttfa-ms"])
    assert sent, "no send event from httpcore's HTTP/1.1 trace"
    return _row(t0, sent[0], t1, service)


def _row(t0: float, sent: float, first: float, service_ms: float) -> dict[str, float]:
    """One request's figures (ms) from the call's start, its request sent and its first audio byte."""
    client, send = (first - t0) * 1000, (sent - t0) * 1000
    return {
        "client_ms": client,
        "send_ms": send,
        "service_ms": service_ms,
        "overhead_ms": client - send - service_ms,
    }


def ws_once(url: str, frames: int, seed: int) -> dict[str, float]:
    with connect(url, open_timeout=60, max_size=None) as ws:
        ws.send(
            json.dumps(
                {"type": "config", "voice": "ryan", "max_frames": frames, "seed": seed, "cache": False}
            )
        )
        t0 = time.perf_counter()
        ws.send(json.dumps({"type": "text", "text": TEXT.split(". ")[0] + "."}))
        sent = time.perf_counter()  # the service's stream opens on this message
        ws.send(json.dumps({"type": "flush"}))
        service = first = None
        while first is None:
            msg = ws.recv(timeout=300)
            if isinstance(msg, bytes):
                first = time.perf_counter()
            elif json.loads(msg)["type"] == "chunk" and service is None:
                service = float(json.loads(msg)["t_ms"])
        ws.send(json.dumps({"type": "close"}))
        while True:
            msg = ws.recv(timeout=300)
            if isinstance(msg, str) and json.loads(msg)["type"] == "closed":
                break
    assert service is not None
    return _row(t0, sent, first, service)


def together(fn: Any, target: str, n: int, frames: int, seed0: int) -> list[dict[str, float]]:
    return at_once(n, lambda i: fn(target, frames, seed0 + i))


def client_main() -> int:
    """``--client``: the clients in a process of their own (as real clients are: they do not share the
    server's GIL). Reads one JSON command a line (transport, target, n, frames, seed0) and answers
    each with a JSON line of the rows of :func:`together`."""
    for line in sys.stdin:
        cmd = json.loads(line)
        fn = http_once if cmd["transport"] == "http" else ws_once
        print(json.dumps(together(fn, cmd["target"], cmd["n"], cmd["frames"], cmd["seed0"])), flush=True)
    return 0


class ClientProcess:
    """A ``--client`` subprocess driven over its stdin/stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--client"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def together(
        self, transport: str, target: str, n: int, frames: int, seed0: int
    ) -> list[dict[str, float]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        cmd = {"transport": transport, "target": target, "n": n, "frames": frames, "seed0": seed0}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the client process ended")
        rows: list[dict[str, float]] = json.loads(line)
        return rows

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _summary(n: int, transport: str, switch_ms: float | None, rows: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "streams": n,
        "transport": transport,
        "switch_ms": switch_ms,
        "requests": len(rows),
        **{
            f"{k}_{name}": round(pct([r[k] for r in rows], q), 2)
            for k in ("client_ms", "send_ms", "service_ms", "overhead_ms")
            for name, q in (("p50", 0.5), ("p95", 0.95))
        },
        "overhead_mean_ms": round(statistics.fmean(r["overhead_ms"] for r in rows), 2),
    }


def main() -> int:
    if sys.argv[1:2] == ["--client"]:
        return client_main()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=["tiny", "0.6b"])
    ap.add_argument("--quant", default="none")
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument(
        "--handoff-ms",
        type=float,
        default=EngineConfig.handoff_ms,
        help="the engine's first-chunk hand-off pause (VOXCAST_HANDOFF_MS; 0 = off)",
    )
    ap.add_argument(
        "--switch-ms",
        default="",
        help="comma-separated GIL switch intervals (ms) to compare, alternated rep by rep in this one "
        "process (sys.setswitchinterval; e.g. 5,0.5); default: the process's own setting only",
    )
    ap.add_argument(
        "--clients",
        default="process",
        choices=["process", "threads"],
        help="the clients in a process of their own (default: as real clients) or in threads of the "
        "server's process (they then share its GIL)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    levels = [int(x) for x in args.streams.split(",")]
    switches: list[float | None] = [float(x) for x in args.switch_ms.split(",") if x.strip()] or [None]
    default_switch = sys.getswitchinterval()

    path = checkpoint(args.size, "custom_voice")
    engine = Engine.load(
        EngineConfig(
            model=str(path),
            device="cpu",
            quant=args.quant,
            max_active=max(levels),
            warmup=True,
            handoff_ms=args.handoff_ms,
        )
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        service = Service.assemble(
            ServiceConfig(store_audio=False), engine, LocalBlobStore(Path(tmp), fsync=False)
        )
        with running(create_app(ServiceHolder(service), HttpConfig(queue_chunks=64))) as base:
            ws_url = base.replace("http://", "ws://") + "/v1/audio/speech/stream"
            http_once(base, 2, 0)  # the server's own first request (imports, connection pools)
            ws_once(ws_url, 2, 0)
            clients = ClientProcess() if args.clients == "process" else None

            def run(transport: str, target: str, n: int, seed0: int) -> list[dict[str, float]]:
                if clients is not None:
                    return clients.together(transport, target, n, args.frames, seed0)
                return together(http_once if transport == "http" else ws_once, target, n, args.frames, seed0)

            if clients is not None:  # its first requests: imports, connection pools
                run("http", base, 1, 0)
                run("websocket", ws_url, 1, 0)
            for n in levels:
                for transport, target in (("http", base), ("websocket", ws_url)):
                    by_switch: dict[float | None, list[dict[str, float]]] = {sw: [] for sw in switches}
                    for rep in range(args.reps):
                        for sw in switches:  # alternated: drift falls on every setting alike
                            sys.setswitchinterval(default_switch if sw is None else sw / 1000)
                            by_switch[sw] += run(transport, target, n, 1000 * rep + 10 * n)
                    sys.setswitchinterval(default_switch)
                    for sw, rows in by_switch.items():
                        key = f"{transport}/{n}" + (f"/switch{sw:g}ms" if sw is not None else "")
                        results[key] = _summary(n, transport, sw, rows)
            if clients is not None:
                clients.close()
        service.close()

    print(f"\nCPU: {cpu_name()}  model: {args.size} custom_voice  quant: {args.quant}  frames: {args.frames}")
    print(
        f"{'transport':<10} {'N':>3} {'switch':>7} {'client p50':>11} {'send p50':>9} {'service p50':>12}"
        f" {'overhead p50':>13} {'p95':>8}"
    )
    for r in results.values():
        sw = f"{r['switch_ms']:g}ms" if r["switch_ms"] is not None else "-"
        print(
            f"{r['transport']:<10} {r['streams']:>3} {sw:>7} {r['client_ms_p50']:>9.1f}ms {r['send_ms_p50']:>7.2f}ms"
            f" {r['service_ms_p50']:>10.1f}ms {r['overhead_ms_p50']:>11.2f}ms {r['overhead_ms_p95']:>6.2f}ms"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"http-{args.size}{'-' + args.quant if args.quant != 'none' else ''}.json"
    doc = {
        "machine": {**machine_info(), "cpu": cpu_name()},
        "args": vars(args) | {"out": str(args.out)},
        "results": results,
    }
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
