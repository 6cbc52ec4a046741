"""Prompt-library throughput: one library fanned out over 1 or 2 worker processes, 1 or N prompts in flight.

A library of ``--prompts`` short IVR prompts (each cut at ``--frames`` frames: random weights never end
speech by themselves; quality gate off) is rendered to two presets through the real queue path: a
redis-server on a free port, ``python worker.py`` processes serving a CustomVoice checkpoint with
random weights (``--size tiny`` or ``0.6b``, ``--quant int8``), the library job -> chunk jobs -> final
step. Every configuration renders other seeds (no audio-cache hits; ``cache_hits`` says so). Workers split the CPU
cores between them (``VOXCAST_THREADS`` = cores / workers) and run with ``VOXCAST_MAX_ACTIVE`` = the
largest in-flight count, so every configuration has the same engine; ``in_flight`` is the job's.

``--workers 0`` renders in this process instead (no Redis; the same renderer and in-flight loop), for
machines without ``redis-server`` (the GPU check).

Per configuration: prompts per minute and audio seconds per second (wall time from enqueue to the
final step's end, worker start-up excluded), and each worker's share of the prompts. Prints a table;
writes ``bench-results/prerender-fanout-<size>[-<quant>].json``.

    python scripts/bench_prerender_fanout.py --size 0.6b --quant int8 --workers 1,2 --in-flight 1,4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import ROOT, checkpoint, machine_info, use_checkout

use_checkout()

TEXTS = [
    "Thank you for calling. Your call is important to us.",
    "For sales, press one. For support, press two.",
    "Please hold while we connect your call.",
    "Our offices are closed. Please call again tomorrow.",
    "Sorry, that is not a valid option.",
    "Please leave a message after the tone.",
]
PRESETS = ["mulaw8k", "wav24k"]


def manifest(n: int, frames: int, run: int) -> str:
    """``n`` prompts; ``run`` shifts every seed, so no run is served from another's audio cache."""
    rows = [
        f'p{i:04d},"{TEXTS[i % len(TEXTS)]}",{("ryan", "vivian")[i % 2]},{frames},{run * 100_000 + i}'
        for i in range(n)
    ]
    return "id,text,voice,max_frames,seed\n" + "\n".join(rows) + "\n"


def env_for(
    model: Path, store: Path, args: argparse.Namespace, threads: int, max_active: int
) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "VOXCAST_MODEL": str(model),
        "VOXCAST_STORAGE_DIR": str(store),
        "VOXCAST_DEVICE": args.device,
        "VOXCAST_QUANT": args.quant,
        **({"VOXCAST_DTYPE": args.dtype} if args.dtype else {}),
        "VOXCAST_MAX_ACTIVE": str(max_active),
        "VOXCAST_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "VOXCAST_CALIBRATION_DIR": "off",
    }


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (use --workers 0 for the in-process figures)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
        ],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.3)
    return proc, f"redis://127.0.0.1:{port}/0"


def run_queue(
    model: Path, tmp: Path, args: argparse.Namespace, workers: int, flights: list[int]
) -> list[dict]:
    """One set of worker processes; every in-flight count rendered on it, each into a fresh store."""
    import redis
    from rq import Queue, Worker

    from voxcast.serving.rq.client import QueueClient
    from voxcast.serving.rq.config import QueueConfig

    server, url = start_redis(tmp)
    client = QueueClient(redis.Redis.from_url(url), QueueConfig(redis_url=url, queues=("bench",)))
    threads = max(1, (os.cpu_count() or 2) // workers) if args.device == "cpu" else 1
    procs = []
    out = []
    try:
        store = tmp / f"store-w{workers}"
        for i in range(workers):
            log = open(tmp / f"worker{workers}-{i}.log", "wb")  # noqa: SIM115 - closed with the process
            cmd = [
                sys.executable,
                str(ROOT / "worker.py"),
                "--queues",
                "bench",
                "--redis-url",
                url,
                "--name",
                f"w{i}",
            ]
            env = env_for(model, store, args, threads, max(flights))
            procs.append(subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
        t0 = time.perf_counter()
        while (
            len(Worker.all(connection=client.redis, queue=Queue("bench", connection=client.redis))) < workers
        ):
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"a worker exited; see {tmp}")
            time.sleep(0.2)
        ready_s = time.perf_counter() - t0
        for k in flights:
            lib = f"w{workers}-f{k}"
            t0 = time.perf_counter()
            job = client.prerender(
                manifest(args.prompts, args.frames, workers * 100 + k), library=lib, manifest_format="csv", presets=PRESETS,
                gate=False, in_flight=k, chunk_prompts=args.chunk,
            )  # fmt: skip
            summary = client.wait(job, timeout_s=args.timeout)
            wall = time.perf_counter() - t0
            doc = json.loads((store / "libraries" / lib / "manifest.json").read_bytes())
            out.append(_row(workers, k, wall, summary, doc, ready_s))
            print(_line(out[-1]), flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
        server.terminate()
    return out


def run_inprocess(model: Path, tmp: Path, args: argparse.Namespace, flights: list[int]) -> list[dict]:
    """The same renderer and in-flight loop in this process, on one service (no queue)."""
    from voxcast.prerender.library import PrerenderJob, prerender
    from voxcast.service import Service, ServiceConfig

    t0 = time.perf_counter()
    service = Service.load(
        ServiceConfig.from_env(env_for(model, tmp / "store-inproc", args, os.cpu_count() or 2, max(flights)))
    )
    ready_s = time.perf_counter() - t0
    out = []
    try:
        for k in flights:
            lib = f"inproc-f{k}"
            payload = {"library": lib, "manifest": manifest(args.prompts, args.frames, k), "manifest_format": "csv",
                       "presets": PRESETS, "gate": False, "in_flight": k}  # fmt: skip
            t0 = time.perf_counter()
            summary = prerender(service, PrerenderJob.from_payload(payload))
            wall = time.perf_counter() - t0
            doc = json.loads(service.store.get_bytes(f"libraries/{lib}/manifest.json"))
            out.append(
                _row(0, k, wall, {**summary, "workers": {"in-process": summary["rendered"]}}, doc, ready_s)
            )
            print(_line(out[-1]), flush=True)
    finally:
        service.close()
    return out


def _row(workers: int, k: int, wall: float, summary: dict, doc: dict, ready_s: float) -> dict[str, Any]:
    audio_s = sum(float(e.get("source_duration_s") or 0.0) for e in doc["prompts"].values())
    n = summary["rendered"]
    return {
        "workers": workers,
        "in_flight": k,
        "prompts": n,
        "failed": summary["failed"],
        "cache_hits": summary["cache_hits"],
        "wall_s": round(wall, 2),
        "prompts_per_min": round(60 * n / wall, 1),
        "audio_s_per_s": round(audio_s / wall, 3),
        "audio_s": round(audio_s, 1),
        "shares": summary.get("workers", {}),
        "workers_ready_s": round(ready_s, 1),
    }


def _line(r: dict[str, Any]) -> str:
    shares = "/".join(str(v) for _, v in sorted(r["shares"].items()))
    return (
        f"workers {r['workers']}  in flight {r['in_flight']:2d}  {r['prompts']:4d} prompts in {r['wall_s']:7.1f} s  "
        f"{r['prompts_per_min']:7.1f} prompts/min  {r['audio_s_per_s']:6.3f} audio s/s  shares {shares}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="tiny", help="tiny or 0.6b (random weights, built once)")
    p.add_argument("--quant", default="none", help="none or int8")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", help="VOXCAST_DTYPE (default: the engine's for the device)")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--frames", type=int, default=24, help="frames per prompt (12.5 a second)")
    p.add_argument("--chunk", type=int, default=16, help="prompts per chunk job")
    p.add_argument("--workers", default="1,2", help="worker process counts; 0 = in this process")
    p.add_argument("--in-flight", default="1,4")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = p.parse_args()
    model = checkpoint(args.size, "custom_voice")
    flights = [int(x) for x in args.in_flight.split(",")]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="voxcast-bench-lib-") as tmp:
        for w in [int(x) for x in args.workers.split(",")]:
            sub = Path(tmp) / f"w{w}"
            sub.mkdir()
            rows += (
                run_inprocess(model, sub, args, flights)
                if w == 0
                else run_queue(model, sub, args, w, flights)
            )
    base = {r["workers"]: r["prompts_per_min"] for r in rows if r["in_flight"] == min(flights)}
    for r in rows:
        r["speedup_vs_sequential"] = (
            round(r["prompts_per_min"] / base[r["workers"]], 2) if base.get(r["workers"]) else None
        )
    print("\nspeed-up over 1 in flight (same workers): " + ", ".join(
        f"w{r['workers']} f{r['in_flight']} {r['speedup_vs_sequential']}x" for r in rows))  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"prerender-fanout-{args.size}" + (f"-{args.quant}" if args.quant != "none" else "") + (
        f"-{args.device}" if args.device != "cpu" else "")  # fmt: skip
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {**machine_info(), "cores": os.cpu_count(), "python": platform.python_version()},
        "rows": rows,
    }
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / f'{name}.json'}")


if __name__ == "__main__":
    main()
