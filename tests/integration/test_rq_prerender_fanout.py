"""A prompt library fanned out over worker processes: real redis-server, ``python worker.py`` serving
the tiny random-weight model, local blob stores in temp dirs.

Workers run with ``VOXCAST_MAX_ACTIVE=4`` (so a chunk keeps several prompts in flight) and the
fixture's short recovery settings (4 s job lease, maintenance every 2 s), so a killed worker's chunk
runs again within seconds. Rows are cut at a few frames, so the quality gate (tested elsewhere) is off.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue, Worker

from tests.fixtures.rq_worker import WorkerProcess
from voxcast.serving.rq.client import JobFailed, QueueClient
from voxcast.serving.rq.config import QueueConfig

QUEUE = "vx-lib"
CFG = QueueConfig(queues=(QUEUE,))
PRESETS = ["mulaw8k", "wav24k"]
#: Manifest fields that say when or how fast, not what was rendered.
VOLATILE = {"updated_at", "rendered_at", "synthesis_ms", "cache_hit"}

pytestmark = pytest.mark.slow


def manifest(n: int, frames: int = 10) -> str:
    rows = [
        f"p{i:02d},Prompt number {i} of the library.,{'vivian' if i % 2 else 'ryan'},{frames}"
        for i in range(n)
    ]
    return "id,text,voice,max_frames\n" + "\n".join(rows) + "\n"


@pytest.fixture
def fleet(tiny_model_dir, tmp_path: Path, redis_client: redis.Redis, redis_url: str) -> Iterator[Any]:
    """``start(store_name) -> WorkerProcess``; every worker is stopped at the end."""
    model = tiny_model_dir("custom_voice")
    workers: list[WorkerProcess] = []

    def start(store: str = "store") -> WorkerProcess:
        log = tmp_path / f"worker{len(workers)}.log"
        w = WorkerProcess(redis_url, model, tmp_path / store, log, QUEUE, env={"VOXCAST_MAX_ACTIVE": "4"})
        workers.append(w)
        return w

    yield start
    for w in workers:
        if w.alive:
            w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        w.stop()


def files(store: Path, library: str) -> dict[str, bytes]:
    root = store / "libraries" / library
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".tmp" not in p.parts
    }


def stable(manifest_bytes: bytes) -> dict[str, Any]:
    doc = json.loads(manifest_bytes)
    doc.pop("updated_at")
    doc["prompts"] = {k: {f: v for f, v in e.items() if f not in VOLATILE} for k, e in doc["prompts"].items()}
    return doc


def render(
    client: QueueClient, text: str, library: str = "ivr", timeout_s: float = 180, **options: Any
) -> dict:
    job = client.prerender(
        text, library=library, manifest_format="csv", presets=PRESETS, gate=False, **options
    )
    return client.wait(job, timeout_s=timeout_s)


def wait_until(cond: Callable[[], bool], timeout_s: float = 120, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached in {timeout_s} s")


def test_three_workers_share_a_library_byte_for_byte_as_one_worker(fleet, redis_client, tmp_path) -> None:
    client = QueueClient(redis_client, CFG)
    text = manifest(12)
    solo = fleet("solo")
    solo.wait_ready(redis_client)
    one = render(client, text, in_flight=1, chunk_prompts=2)
    solo.stop()
    assert (one["rendered"], one["failed"], one["chunks"]) == (12, 0, 6)
    assert one["workers"] == {solo.name: 12}

    workers = [fleet("shared") for _ in range(3)]
    for w in workers:
        w.wait_ready(redis_client)
    three = render(client, text, in_flight=4, chunk_prompts=2)
    assert (three["rendered"], three["failed"], three["rerenders"]) == (12, 0, 0)
    shares = three["workers"]
    print(f"three workers, 6 chunks of 2 prompts, 4 in flight: prompts per worker {sorted(shares.values())}")
    assert set(shares) == {w.name for w in workers} and sum(shares.values()) == 12  # each prompt once
    assert all(n > 0 for n in shares.values())

    a, b = files(tmp_path / "solo", "ivr"), files(tmp_path / "shared", "ivr")
    assert len(a) == 12 * len(PRESETS) + 1
    assert {k: v for k, v in a.items() if k != "manifest.json"} == {
        k: v for k, v in b.items() if k != "manifest.json"
    }
    assert stable(a["manifest.json"]) == stable(b["manifest.json"])


def test_a_worker_killed_mid_chunk_its_chunk_runs_elsewhere_and_the_library_completes(
    fleet, redis_client, tmp_path
) -> None:
    client = QueueClient(redis_client, CFG)
    workers = [fleet() for _ in range(2)]
    for w in workers:
        w.wait_ready(redis_client)
    job = client.prerender(manifest(8, frames=40), library="ivr", manifest_format="csv", presets=PRESETS,
                           gate=False, in_flight=1, chunk_prompts=4)  # fmt: skip
    q = Queue(QUEUE, connection=redis_client)

    def busy_mid_chunk() -> WorkerProcess | None:
        if client.progress(job).get("done", 0) < 1:
            return None
        for rw in Worker.all(connection=redis_client, queue=q):
            jid = rw.get_current_job_id() or ""
            if re.search(r"-c\d{5}$", jid) and client.progress(job)["workers"].get(rw.name, 0) >= 1:
                return next(w for w in workers if w.name == rw.name)
        return None

    wait_until(lambda: busy_mid_chunk() is not None, what="a worker with a committed prompt mid-chunk")
    victim = busy_mid_chunk()
    assert victim is not None
    victim.kill()
    t_kill = time.monotonic()
    done_before = client.progress(job)["workers"][victim.name]
    summary = client.wait(job, timeout_s=120)
    recovered_s = time.monotonic() - t_kill
    print(
        f"SIGKILL mid-chunk ({done_before} prompt(s) of it committed) -> library done {recovered_s:.1f} s later"
    )
    assert (summary["rendered"], summary["failed"], summary["status"]) == (8, 0, "finished")
    assert summary["workers"][victim.name] == done_before  # its committed prompts were not rendered again
    assert sum(summary["workers"].values()) == 8
    stored = files(tmp_path / "store", "ivr")
    doc = json.loads(stored["manifest.json"])
    for pid, entry in doc["prompts"].items():  # one rendering per prompt: every file is the recorded one
        for preset, obj in entry["objects"].items():
            assert hashlib.sha256(stored[f"{preset}/{pid}.wav"]).hexdigest() == obj["sha256"]
    assert len(stored) == 8 * len(PRESETS) + 1


def test_cancel_stops_every_chunk_and_a_rerun_resumes(fleet, redis_client, tmp_path) -> None:
    client = QueueClient(redis_client, CFG)
    w = fleet()
    w.wait_ready(redis_client)
    text = manifest(10, frames=30)
    job = client.prerender(text, library="ivr", manifest_format="csv", presets=PRESETS, gate=False,
                           in_flight=2, chunk_prompts=2)  # fmt: skip
    wait_until(lambda: client.progress(job).get("done", 0) >= 2, what="two prompts rendered")
    rival = client.prerender(text, library="ivr", manifest_format="csv", presets=PRESETS, gate=False)
    assert client.cancel(job) == "cancelling"
    cancelled = client.wait(job, timeout_s=120)
    assert client.status(job)["status"] == "cancelled" and cancelled["status"] == "cancelled"
    with pytest.raises(JobFailed) as e:  # it was queued behind the library's chunks: the library was busy
        client.wait(rival, timeout_s=60)
    assert e.value.error["code"] == "library_busy"
    done = cancelled["rendered"]
    assert 2 <= done < 10 and cancelled["not_rendered"] == 10 - done and not cancelled["errors"]
    assert len(json.loads(files(tmp_path / "store", "ivr")["manifest.json"])["prompts"]) == done

    again = render(client, text, in_flight=2, chunk_prompts=2)
    assert (again["skipped"], again["rendered"], again["failed"]) == (done, 10 - done, 0)
    assert len(json.loads(files(tmp_path / "store", "ivr")["manifest.json"])["prompts"]) == 10
    assert w.alive
