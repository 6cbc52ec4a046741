"""Graceful stop of the RQ worker (``python worker.py``), signalled mid-job: warm shutdown with a
deadline (``VOXCAST_DRAIN_S``), its state in the worker's RQ hash, and what a job cut at the deadline
leaves behind (failed with a clear reason, or requeued where it has retries left)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from rq import Queue

from tests.fixtures.polling import wait_until
from tests.fixtures.rq_worker import WorkerProcess, wait_for_chunks
from voxcast.serving.rq.client import JobFailed, QueueClient
from voxcast.serving.rq.config import QueueConfig
from voxcast.serving.rq.stream import EntryType, read_all, stream_key

QUEUE = "vx-drain"
CFG = QueueConfig(queues=(QUEUE,), retries=0)
# 8000 frames of the tiny model take about a minute: every job here is cut or cancelled long before
LONG = {"text": "A sentence that keeps the worker busy.", "voice": "vivian", "max_frames": 8000}

pytestmark = pytest.mark.slow

Start = Callable[[float], WorkerProcess]


@pytest.fixture
def start(tiny_model_dir, tmp_path: Path, redis_url: str) -> Iterator[Start]:
    """``start(drain_s)``: a worker process with that drain deadline (all stopped at the end)."""
    model = tiny_model_dir("custom_voice")
    workers: list[WorkerProcess] = []

    def run(drain_s: float) -> WorkerProcess:
        log = tmp_path / f"worker{len(workers)}.log"
        w = WorkerProcess(redis_url, model, tmp_path / "store", log, QUEUE, {"VOXCAST_DRAIN_S": str(drain_s)})
        workers.append(w)
        return w

    yield run
    for w in workers:
        w.kill() if w.alive else None


def _state(client: QueueClient, worker: WorkerProcess) -> str | None:
    return next((w["state"] for w in client.workers() if w["name"] == worker.name), None)


def test_sigterm_reports_draining_takes_no_new_job_and_exits_0_after_the_running_one(
    start: Start, redis_client: redis.Redis, redis_url: str
) -> None:
    client = QueueClient(redis_client, CFG)
    w = start(600)
    w.wait_ready(redis_client)
    listed = subprocess.run(
        [sys.executable, "-m", "voxcast.serving.cli.main", "workers", "--redis-url", redis_url],
        env={**os.environ, "VOXCAST_QUEUES": QUEUE},
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert [(x["name"], x["state"]) for x in json.loads(listed.stdout)] == [(w.name, "ready")]
    running = client.enqueue({**LONG, "seed": 1})
    wait_for_chunks(redis_client, running, 2)
    w.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: _state(client, w) == "draining", what="the worker's state to read draining")
    later = client.enqueue({**LONG, "max_frames": 4})
    assert client.cancel(running) == "cancelling"  # the running job goes on under the drain until this
    assert w.proc.wait(timeout=60) == 0
    assert client.status(running)["status"] == "cancelled"
    assert read_all(redis_client, stream_key(running))[-1].type is EntryType.CANCELLED
    assert client.status(later)["status"] == "queued" and Queue(QUEUE, connection=redis_client).count == 1
    assert "draining: 1 in flight, deadline 600 s" in w.log.read_text()


def test_a_job_running_at_the_deadline_fails_with_shutdown_or_is_requeued(
    start: Start, redis_client: redis.Redis
) -> None:
    client = QueueClient(redis_client, CFG)
    first = start(0)  # the deadline is the signal itself: whatever runs is cut at once
    first.wait_ready(redis_client)
    cut = client.enqueue({**LONG, "seed": 2})
    wait_for_chunks(redis_client, cut, 2)
    # the next worker starts while this one is cut and exits: ``cut`` is running here (and has no
    # retry), and ``retried`` is queued only after this one exited, so the new one takes only that
    second = start(0)
    first.proc.send_signal(signal.SIGTERM)
    with pytest.raises(JobFailed) as failed:
        client.wait(cut, timeout_s=60)
    assert "WorkerShutdown" in (failed.value.exc or "") and "drain deadline" in (failed.value.exc or "")
    last = read_all(redis_client, stream_key(cut))[-1]
    assert last.type is EntryType.CANCELLED and last.info["code"] == "shutdown"
    assert first.proc.wait(timeout=60) == 0

    second.wait_ready(redis_client)
    retried = client.enqueue({**LONG, "seed": 3}, retries=1)
    wait_for_chunks(redis_client, retried, 2)
    second.proc.send_signal(signal.SIGTERM)
    assert second.proc.wait(timeout=60) == 0
    # requeued, with no terminal entry: a reader following the stream sees the next attempt restart it
    assert client.status(retried)["status"] == "queued"
    assert client.job(retried).meta["interrupted"].startswith("the worker is shutting down")
    assert not any(e.type.terminal for e in read_all(redis_client, stream_key(retried)))
    third = start(600)
    third.wait_ready(redis_client)
    wait_until(
        lambda: [e.type for e in read_all(redis_client, stream_key(retried))].count(EntryType.START) == 2
    )
    assert client.job(retried).meta["attempt"] == 2
    client.cancel(retried)
    wait_until(lambda: client.status(retried)["status"] == "cancelled", timeout_s=60)
