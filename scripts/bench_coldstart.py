"""Cold start of each process type: process start -> ready -> first audio, with its parts.

For each model (``--sizes``: tiny and/or 0.6b random CustomVoice checkpoints, built once and cached,
as bench_engine.py does) and precision (``--quants``: none = float32, int8), every process type in
``--types`` is started fresh and timed from outside:

* ``http``: ``voxcast serve``; ready = ``/ping`` answers 200; first audio = the first audio event of
  a pcm ``/v1/audio/speech`` (``stream_format: sse``, whose done event carries the timing) sent at once.
* ``rq``: ``python worker.py`` against a redis-server of its own; ready = the worker registered; first
  audio = the first ``chunk`` entry of a job enqueued at once (from the enqueue).
* ``runpod``: ``python handler.py`` in production mode against the loopback fake control plane; ready
  = its first job-take poll; first audio = the first stream POST of a job submitted at once.

Each row has ``spawn_to_ready_s`` and ``spawn_to_first_audio_s`` (wall clock, outside), and the
process's own split from its first request's ``timing.extra.startup`` (``ready``, ``before_load``:
interpreter and imports, ``load``, ``kernels``: building or loading the C++ kernels, ``warmup``).
``weights_s`` is the pure weight load of the same checkpoint (every safetensors file read into
tensors, a fresh process, the same page cache), the floor that ``ready`` is compared with.

Prints a table and writes ``bench-results/coldstart.json``.

    python scripts/bench_coldstart.py [--sizes tiny,0.6b] [--quants none,int8] [--types http,rq,runpod]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
from benchlib import checkpoint, cpu_name, use_checkout  # noqa: E402

use_checkout()


from tests.fixtures.procs import free_port, stop_process  # noqa: E402
from tests.fixtures.redis import RedisServer  # noqa: E402
from tests.fixtures.runpod_control_plane import FakeControlPlane, start_worker  # noqa: E402

from voxcast.serving.rq.client import QueueClient  # noqa: E402
from voxcast.serving.rq.config import QueueConfig  # noqa: E402
from voxcast.serving.rq.stream import EntryType, read_all, stream_key  # noqa: E402

TEXT = "Thank you for calling."
REQUEST = {"text": TEXT, "voice": "ryan", "max_frames": 4, "response_format": "pcm", "cache": False}


def weights_s(model: Path) -> float:
    """Seconds a fresh process takes to read every safetensors file of ``model`` into tensors of its
    own (``load_file`` maps the file lazily: each tensor is copied, as a model's load does)."""
    code = (
        "import sys, time, glob; import safetensors.torch as st; t = time.perf_counter();"
        "[[v.clone() for v in st.load_file(f).values()]"
        " for f in glob.glob(sys.argv[1] + '/**/*.safetensors', recursive=True)];"
        "print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(model)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def _env(model: Path, quant: str, store: Path, **extra: str) -> dict[str, str]:
    kept = ("VOXCAST_CALIBRATION_DIR", "VOXCAST_INT8_CACHE_DIR", "VOXCAST_KERNEL_DIR")  # the caches in use
    env = {k: v for k, v in os.environ.items() if k in kept or not k.startswith(("VOXCAST_", "RUNPOD_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]),
        VOXCAST_MODEL=str(model),
        VOXCAST_DEVICE="cpu",
        VOXCAST_QUANT=quant,
        VOXCAST_STORAGE_DIR=str(store),
        HF_HUB_OFFLINE="1",
        **extra,
    )
    return env


def _wait(
    cond: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout_s: float = 900
) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
        if cond():
            return time.monotonic()
        time.sleep(0.02)
    raise RuntimeError(f"{what}: not within {timeout_s} s")


def run_http(model: Path, quant: str, tmp: Path) -> dict[str, Any]:
    port = free_port()
    env = _env(model, quant, tmp / "store")
    t0 = time.monotonic()
    with open(tmp / "http.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=log,
        )
    api = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(api + "/ping", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        t_ready = _wait(ready, proc, "http")
        body = {**REQUEST, "input": TEXT, "stream_format": "sse"}
        del body["text"]
        t_first, events = 0.0, []
        with httpx.stream("POST", api + "/v1/audio/speech", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    t_first = t_first or time.monotonic()
                    events.append(json.loads(line[6:]))
    finally:
        stop_process(proc, 30)
    startup = events[-1]["timing"]["extra"]["startup"]
    return {"spawn_to_ready_s": t_ready - t0, "spawn_to_first_audio_s": t_first - t0, **_parts(startup)}


def run_rq(model: Path, quant: str, tmp: Path) -> dict[str, Any]:
    server = RedisServer(shutil.which("redis-server") or "redis-server", free_port(), tmp)
    server.start()
    client = redis.Redis.from_url(server.url)
    queue = QueueClient(client, QueueConfig(queues=("coldstart",), retries=0))
    env = _env(model, quant, tmp / "store")
    t0 = time.monotonic()
    with open(tmp / "rq.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "worker.py"), "--queues", "coldstart", "--redis-url", server.url],
            env=env,
            stdout=log,
            stderr=log,
        )
    try:
        t_ready = _wait(lambda: bool(queue.workers()), proc, "rq")
        job = queue.enqueue(REQUEST)
        t_first = _wait(
            lambda: any(e.type is EntryType.CHUNK for e in read_all(client, stream_key(job))), proc, "rq job"
        )
        result = queue.wait(job, timeout_s=300)
    finally:
        stop_process(proc, 30)
        server.stop()
    return {
        "spawn_to_ready_s": t_ready - t0,
        "spawn_to_first_audio_s": t_first - t0,
        **_parts(result["timing"]["extra"]["startup"]),
    }


def run_runpod(model: Path, quant: str, tmp: Path) -> dict[str, Any]:
    env = _env(model, quant, tmp / "store", RUNPOD_LOG_LEVEL="WARN")
    with FakeControlPlane() as plane:
        t0 = time.monotonic()
        worker = start_worker(plane, env, tmp / "runpod.log", ready_timeout_s=900)
        t_ready = time.monotonic()
        try:
            job = plane.submit(REQUEST)
            plane.wait_streams(job, 1, 300)
            t_first = time.monotonic()
            rec = plane.wait_done(job, 300)
        finally:
            worker.stop(30)
    return {
        "spawn_to_ready_s": t_ready - t0,
        "spawn_to_first_audio_s": t_first - t0,
        **_parts(rec.outputs[-1]["timing"]["extra"]["startup"]),
    }


def _parts(startup: dict[str, float]) -> dict[str, float]:
    return {f"{k.removesuffix('_ms')}_s": round(v / 1000, 3) for k, v in startup.items()}


RUNNERS = {"http": run_http, "rq": run_rq, "runpod": run_runpod}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="tiny,0.6b")
    ap.add_argument("--quants", default="none,int8")
    ap.add_argument("--types", default="http,rq,runpod")
    ap.add_argument("--out", type=Path, default=REPO / "bench-results" / "coldstart.json")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for size in args.sizes.split(","):
        model = checkpoint(size, "custom_voice")
        floor = weights_s(model)
        for quant in args.quants.split(","):
            for kind in args.types.split(","):
                with tempfile.TemporaryDirectory() as d:
                    row = {"size": size, "quant": quant, "type": kind, "weights_s": round(floor, 3)}
                    row.update(RUNNERS[kind](model, quant, Path(d)))
                row["ready_over_weights"] = round(row.get("ready_s", row["spawn_to_ready_s"]) / floor, 2)
                rows.append(row)
                print(
                    f"{size:5} {quant:5} {kind:7} ready {row['spawn_to_ready_s']:7.2f} s  first audio "
                    f"{row['spawn_to_first_audio_s']:7.2f} s  (before load {row.get('before_load_s', 0):5.2f}, "
                    f"load {row.get('load_s', 0):6.2f}, kernels {row.get('kernels_s', 0):5.2f}, warm-up "
                    f"{row.get('warmup_s', 0):6.2f}; weights alone {floor:5.2f} s: "
                    f"x{row['ready_over_weights']})",
                    flush=True,
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"cpu": cpu_name(), "cpu_count": os.cpu_count(), "rows": rows}, indent=2) + "\n"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
