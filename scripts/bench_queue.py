"""Benchmark the queue side: worker pickup, Redis chunk latency, prerender throughput.

Starts its own ``redis-server`` (free loopback port) and one ``python worker.py`` subprocess serving the
tiny random-weight model (or ``--model``), then measures:

* **pickup**: enqueue (client clock) -> the job's ``start`` stream entry (worker clock, same host), on an
  idle worker, one job at a time; also RQ's own ``started_at - enqueued_at``.
* **chunk latency**: XADD by the worker -> XREAD BLOCK return in this process, for every chunk of live
  followed jobs (``received_ts - ts``), p50/p95/max.
* **prerender**: prompts/s for a manifest rendered cold (empty cache), again into another library
  (synthesis served from the rendered-audio cache), and re-run into the same library (nothing to do).

Figures are printed and written to ``bench-results/bench_queue.json``. Nothing here asserts timings.

    python scripts/bench_queue.py [--model DIR] [--jobs 30] [--prompts 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
from benchlib import use_checkout  # noqa: E402

use_checkout()


from rq import Queue, Worker  # noqa: E402

from voxcast.serving.rq.client import QueueClient, StreamCapture  # noqa: E402
from voxcast.serving.rq.config import QueueConfig, connect  # noqa: E402

QUEUE = "vx-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(pct(values, 50), 3),
        "p95": round(pct(values, 95), 3),
        "max": round(max(values), 3) if values else float("nan"),
        "mean": round(statistics.fmean(values), 3) if values else float("nan"),
    }


def tiny_model() -> Path:
    from tests.fixtures.models import build_cached_model

    return build_cached_model("custom_voice")


def start_redis(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(tmp)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = connect(QueueConfig(redis_url=url))
    for _ in range(200):
        try:
            client.ping()
            return proc, url
        except Exception:
            time.sleep(0.02)
    raise RuntimeError("redis-server did not start")


def start_worker(url: str, model: Path, storage: Path, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "VOXCAST_MODEL": str(model),
        "VOXCAST_STORAGE_DIR": str(storage),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "worker.py"), "--queues", QUEUE, "--redis-url", url],
            env=env, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    client = connect(QueueConfig(redis_url=url))
    while not Worker.all(connection=client, queue=Queue(QUEUE, connection=client)):
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited; see {log}")
        time.sleep(0.05)
    return proc, time.monotonic() - t0


def bench_pickup(client: QueueClient, jobs: int) -> dict[str, Any]:
    pickup, rq_pickup = [], []
    for i in range(jobs):
        time.sleep(0.3)  # let the worker go back to its blocking dequeue
        t_enq = time.time()
        job_id = client.enqueue(
            {"text": f"Pickup {i}.", "voice": "vivian", "max_frames": 2, "response_format": "pcm"}
        )
        cap = StreamCapture()
        for e in client.follow(job_id, idle_timeout_s=60, block_ms=100):
            cap.add(e)
            if e.type.value == "start":
                pickup.append((e.ts - t_enq) * 1000)
        job = client.job(job_id)
        if job.started_at and job.enqueued_at:
            rq_pickup.append((job.started_at - job.enqueued_at).total_seconds() * 1000)
    return {"enqueue_to_start_entry_ms": summary(pickup), "rq_enqueued_to_started_ms": summary(rq_pickup)}


def bench_chunks(client: QueueClient, jobs: int) -> dict[str, Any]:
    latencies, ttfa_client = [], []
    for i in range(jobs):
        t_enq = time.time()
        job_id = client.enqueue(
            {"text": f"A longer sentence number {i} for streaming.", "voice": "vivian", "max_frames": 48,
             "response_format": "pcm"}
        )  # fmt: skip
        cap = StreamCapture()
        for e in client.follow(job_id, idle_timeout_s=60, block_ms=100):
            cap.add(e)
        latencies.extend(cap.latencies_ms())
        if cap.chunks:
            ttfa_client.append((cap.chunks[0].received_ts - t_enq) * 1000)
    return {
        "chunk_publish_to_receive_ms": summary(latencies),
        "enqueue_to_first_chunk_ms": summary(ttfa_client),
    }


def manifest(prompts: int) -> str:
    rows = ["id,text,voice,language,max_frames"]
    for i in range(prompts):
        rows.append(f"p{i:03d},Prompt {i}: thank you for calling.,vivian,english,8")
    return "\n".join(rows) + "\n"


def bench_prerender(client: QueueClient, prompts: int) -> dict[str, Any]:
    text, out = manifest(prompts), {}
    for label, library in [("cold", "bench-a"), ("cache_hits", "bench-b"), ("rerun_same_library", "bench-b")]:
        t0 = time.monotonic()
        job_id = client.prerender(text, library=library, manifest_format="csv")
        result = client.wait(job_id, timeout_s=1800)
        wall = time.monotonic() - t0
        out[label] = {
            "prompts": prompts,
            "rendered": result["rendered"],
            "skipped": result["skipped"],
            "cache_hits": result["cache_hits"],
            "objects": result["objects"],
            "job_s": result["elapsed_s"],
            "wall_s": round(wall, 3),
            "prompts_per_s": round(prompts / result["elapsed_s"], 2) if result["elapsed_s"] else None,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="checkpoint dir (default: the tiny test model)")
    ap.add_argument("--jobs", type=int, default=30, help="jobs for the pickup benchmark")
    ap.add_argument("--stream-jobs", type=int, default=5, help="jobs followed live for chunk latency")
    ap.add_argument("--prompts", type=int, default=20, help="prompts in the prerender manifest")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results" / "bench_queue.json")
    args = ap.parse_args()

    model = args.model or tiny_model()
    tmp = Path(tempfile.mkdtemp(prefix="vx-bench-queue-"))
    redis_proc, url = start_redis(tmp)
    worker = None
    try:
        worker, startup_s = start_worker(url, model, tmp / "store", tmp / "worker.log")
        client = QueueClient(connect(QueueConfig(redis_url=url)), QueueConfig(redis_url=url, queues=(QUEUE,)))
        results = {
            "model": str(model),
            "cpu_count": os.cpu_count(),
            "worker_startup_s": round(startup_s, 2),
            "pickup": bench_pickup(client, args.jobs),
            "chunks": bench_chunks(client, args.stream_jobs),
            "prerender": bench_prerender(client, args.prompts),
        }
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
        redis_proc.terminate()
        redis_proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
