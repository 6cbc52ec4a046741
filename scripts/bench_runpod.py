"""Benchmark the RunPod handler's own cost: the real SDK worker against the loopback fake control plane.

Runs ``python handler.py`` in production mode (tiny random checkpoint unless ``--model``), submits
streaming jobs one after another and measures at the fake control plane:

* per-chunk handler overhead: stream POST received - engine emit, where emit = ``t0_unix`` (wall
  clock of the chunks' ``t_ms`` origin, reported by the final message) + ``t_ms``. It covers service
  encoding, the thread hand-off, JSON + base64, and the SDK's HTTP POST on loopback. When the service
  does not expose the exact origin, ``t0_unix`` is when the handler began iterating (earlier by the
  voice lookup), so these figures are upper bounds;
  split into emit -> yield (inside the worker, from the messages' ``ts``) and yield -> POST received;
* time to first yielded chunk: first stream POST received - job taken by the worker, split into
  take -> handler start (the SDK's dispatch) and handler start -> first yield;
* the engine's own time to first audio (``timing.ttfa_ms``) for comparison.

* the queue path as a remote client sees it (``--client-jobs``): jobs submitted with the SDK's own
  client (``runpod.Endpoint(...).run()``, then ``Job.stream()``, which polls ``/stream`` after a 1 s
  sleep each time), first audio at that client against the engine's own first audio of the same job.
  A load-balancing endpoint (``VOXCAST_ENDPOINT_TYPE=http``) sends it at once: scripts/bench_http.py.

Prints p50/p95 and writes ``bench-results/runpod.json``.

    python scripts/bench_runpod.py [--jobs 20] [--frames 16] [--model DIR] [--concurrency 1] [--client-jobs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
from benchlib import use_checkout  # noqa: E402

use_checkout()


from tests.fixtures.runpod_control_plane import API_KEY, FakeControlPlane, running_worker  # noqa: E402


def _pct(xs: list[float], q: float) -> float:
    """Percentile by linear interpolation (q in [0, 100])."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _summary(xs: list[float]) -> dict[str, float]:
    return {
        "n": len(xs),
        "p50": round(_pct(xs, 50), 3),
        "p95": round(_pct(xs, 95), 3),
        "mean": round(statistics.fmean(xs), 3) if xs else float("nan"),
        "max": round(max(xs), 3) if xs else float("nan"),
    }


def _model_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from tests.fixtures.models import build_cached_model

    return build_cached_model("custom_voice")


def _job_figures(rec: Any) -> dict[str, list[float]]:
    """Figures (ms) of one finished job; see the module docstring."""
    *chunks, final = rec.outputs
    if not final.get("done"):
        raise RuntimeError(f"job {rec.id} failed: {rec.done}")
    posts = rec.streams[: len(chunks)]
    emits = [final["t0_unix"] + c["t_ms"] / 1000 for c in chunks]
    started = final["handler"]["started_unix"]
    return {
        "chunk_overhead_ms": [(p.t_recv - e) * 1000 for p, e in zip(posts, emits, strict=True)],
        "emit_to_yield_ms": [(c["ts"] - e) * 1000 for c, e in zip(chunks, emits, strict=True)],
        "yield_to_post_ms": [(p.t_recv - c["ts"]) * 1000 for p, c in zip(posts, chunks, strict=True)],
        "first_chunk_after_take_ms": [(posts[0].t_recv - rec.t_taken) * 1000],
        "take_to_handler_ms": [(started - rec.t_taken) * 1000],
        "handler_first_message_ms": [float(final["handler"]["first_message_ms"])],
        "engine_ttfa_ms": [float(final["timing"]["ttfa_ms"])],
    }


def client_jobs(plane: FakeControlPlane, request: dict[str, Any], n: int) -> dict[str, list[float]]:
    """``n`` jobs through the SDK's client, one after another: first audio at the client (from
    ``run()`` to the first output of ``stream()``) and the engine's own first audio of the job."""
    import runpod

    runpod.endpoint_url_base = plane.url + "/v2"  # read when the client is made
    endpoint = runpod.Endpoint("voxcast", api_key=API_KEY)
    out: dict[str, list[float]] = {"sdk_client_first_audio_ms": [], "sdk_client_engine_ttfa_ms": []}
    for _ in range(n):
        t0 = time.perf_counter()
        job = endpoint.run(request)
        for _output in job.stream():
            out["sdk_client_first_audio_ms"].append((time.perf_counter() - t0) * 1000)
            break
        final = plane.wait_done(job.job_id, 300).outputs[-1]
        out["sdk_client_engine_ttfa_ms"].append(float(final["timing"]["ttfa_ms"]))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = _model_dir(args.model)
    request = {
        "text": "Hello there, this is a benchmark of the streaming handler.",
        "voice": args.voice,
        "max_frames": args.frames,
        "first_chunk_frames": 1,
        "chunk_frames": args.chunk_frames,
        "response_format": args.format,
    }
    env = {
        "VOXCAST_MODEL": str(model),
        "VOXCAST_STORAGE_DIR": tempfile.mkdtemp(prefix="bench-runpod-store-"),
        "VOXCAST_RUNPOD_CONCURRENCY": str(args.concurrency),
        "VOXCAST_THREADS": str(args.threads),
        "OMP_NUM_THREADS": str(args.threads),
        "RUNPOD_LOG_LEVEL": "WARN",
        "VOXCAST_LOG_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
    }
    figures: dict[str, list[float]] = {}
    log_path = Path(tempfile.mkdtemp(prefix="bench-runpod-")) / "worker.log"
    with FakeControlPlane() as plane:
        t0 = time.perf_counter()
        with running_worker(plane, env, log_path):
            ready_s = time.perf_counter() - t0
            plane.wait_done(plane.submit(dict(request, max_frames=2)), 120)  # discard: first job
            for _ in range(args.jobs):
                ids = [plane.submit(request) for _ in range(args.concurrency)]
                for job in ids:
                    for name, values in _job_figures(plane.wait_done(job, 300)).items():
                        figures.setdefault(name, []).extend(values)
            figures.update(client_jobs(plane, request, args.client_jobs))
    return {
        "benchmark": "runpod_handler",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "model": str(model),
        "request": request,
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "worker_ready_s": round(ready_s, 2),
        "summary": {name: _summary(values) for name, values in figures.items()},
        "raw": figures,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20, help="measured jobs (per concurrency slot)")
    p.add_argument("--frames", type=int, default=16, help="max_frames per job")
    p.add_argument("--chunk-frames", type=int, default=1, help="frames per chunk after the first")
    p.add_argument("--format", default="pcm", help="response_format")
    p.add_argument("--voice", default="ryan")
    p.add_argument("--concurrency", type=int, default=1, help="VOXCAST_RUNPOD_CONCURRENCY")
    p.add_argument("--threads", type=int, default=1, help="torch threads in the worker")
    p.add_argument("--model", default=None, help="checkpoint dir (default: the tiny test checkpoint)")
    p.add_argument("--client-jobs", type=int, default=5, help="jobs through the SDK's polling client")
    p.add_argument("--out", default=str(REPO / "bench-results" / "runpod.json"))
    args = p.parse_args()
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"worker ready after {result['worker_ready_s']} s; {args.jobs} jobs x {args.frames} frames")
    for name, s in result["summary"].items():
        print(f"{name:28s} n={s['n']:4d}  p50={s['p50']:8.2f}  p95={s['p95']:8.2f}  max={s['max']:8.2f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
