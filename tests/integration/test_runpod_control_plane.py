"""The fake control plane against the real runpod SDK worker, with a model-free handler.

Pins down the SDK behaviour the voxcast handler relies on (runpod 1.12, production mode): every
yield is POSTed as it is produced; a yielded ``{"error": ...}`` fails the job with ``str()`` of the
value; a stop signal cancels the job's task and nothing more is sent for it; the worker then serves
the next job.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.polling import wait_until
from tests.fixtures.runpod_control_plane import API_KEY, FakeControlPlane, WorkerProcess, running_worker

pytest.importorskip("runpod")

_HANDLER = textwrap.dedent(
    """
    import asyncio, json, os
    import runpod

    class Err(dict):
        def __str__(self):
            return json.dumps(self)

    async def handler(job):
        inp = job["input"]
        if inp.get("bad"):
            yield {"error": Err(code="invalid_request", field="text")}
            return
        # The stop cancels the job's task wherever it waits, often in the SDK's own await of a
        # stream POST; the abandoned generator may then not be finalised for a long time (it sits
        # in a reference cycle), so watch the task rather than rely on CancelledError/GeneratorExit.
        def on_done(task):
            if task.cancelled():
                print("CANCELLED", job["id"], flush=True)

        asyncio.current_task().add_done_callback(on_done)
        for i in range(inp.get("n", 3)):
            if "gate" in inp:  # yield i waits until the test creates <gate>/<i> (or <gate>/all)
                while not any(os.path.exists(os.path.join(inp["gate"], f)) for f in (str(i), "all")):
                    await asyncio.sleep(0.01)
            else:
                await asyncio.sleep(inp.get("sleep", 0.1))
            yield {"seq": i}

    runpod.serverless.start({"handler": handler, "return_aggregate_stream": True})
    """
)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    d = tmp_path_factory.mktemp("rp_fake")
    (d / "handler.py").write_text(_HANDLER)
    with (
        FakeControlPlane() as plane,
        running_worker(
            plane,
            {"RUNPOD_LOG_LEVEL": "INFO"},
            d / "worker.log",
            handler=d / "handler.py",
            ready_timeout_s=60,
        ) as w,
    ):
        yield w


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    """The folder of a job's ``gate``: all of it opens when the test ends, so that a job it held
    (the test failed) does not keep the module's worker busy."""
    yield tmp_path
    (tmp_path / "all").touch()


def _let_through(gate: Path, *seqs: int) -> None:
    """Let the gated handler make its yields ``seqs``."""
    for i in seqs:
        (gate / str(i)).touch()


def test_each_yield_is_posted_before_the_next_is_made_and_done_carries_the_aggregate(
    worker: WorkerProcess, gate: Path
) -> None:
    """The handler makes yield i+1 only once the test has seen yield i's POST: a worker that held
    yields back (until the end, or until the next one) would leave the test waiting for that POST."""
    plane = worker.plane
    job = plane.submit({"n": 4, "gate": str(gate)})
    for i in range(4):
        _let_through(gate, i)
        rec = plane.wait_streams(job, i + 1, 30)
        assert len(rec.streams) == i + 1  # one POST per yield
        if i < 3:  # the handler waits at the next gate: the job cannot have ended
            assert rec.done is None
    rec = plane.wait_done(job, 30)
    assert [o["seq"] for o in rec.outputs] == [0, 1, 2, 3]
    assert rec.done == {"output": rec.outputs} and rec.done_query["isStream"] == "true"
    assert not plane.unauthorized


def test_the_sdks_client_submits_and_polls_the_stream_of_a_queue_endpoint(
    worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runpod.Endpoint`` against the fake's client API (what bench_runpod.py measures the queue path
    with): every yield reaches the polling client, in order, and the job ends COMPLETED."""
    import runpod

    plane = worker.plane
    monkeypatch.setattr(runpod, "endpoint_url_base", plane.url + "/v2")  # read when the client is made
    endpoint = runpod.Endpoint("voxcast", api_key=API_KEY)
    job = endpoint.run({"n": 3, "sleep": 0.1})
    assert [o["seq"] for o in job.stream()] == [0, 1, 2]
    assert job.status() == "COMPLETED" and plane.jobs[job.job_id].t_done is not None


def test_yielded_error_fails_the_job_with_its_str(
    worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The production contract: a yielded ``{"error": value}`` ends the generator's job, and the done
    POST carries only ``{"error": str(value)}``, which the platform records as FAILED (what the SDK's
    client then reads)."""
    import runpod

    rec = worker.plane.wait_done(worker.plane.submit({"bad": True}), 30)
    assert rec.streams == []
    assert json.loads(rec.done["error"]) == {"code": "invalid_request", "field": "text"}
    monkeypatch.setattr(runpod, "endpoint_url_base", worker.plane.url + "/v2")
    job = runpod.Endpoint("voxcast", api_key=API_KEY).run({"bad": True})
    worker.plane.wait_done(job.job_id, 30)
    assert job.status() == "FAILED"


def test_stop_signal_cancels_the_task_and_the_worker_serves_on(worker: WorkerProcess, gate: Path) -> None:
    plane = worker.plane
    job = plane.submit({"n": 3, "gate": str(gate)})
    _let_through(gate, 0)
    plane.wait_streams(job, 1, 30)  # the handler now waits at the gate of yield 1
    plane.cancel(job)
    wait_until(lambda: f"CANCELLED {job}" in worker.log(), what=f"job {job}'s task cancelled")
    _let_through(gate, 1, 2)  # a task that still ran would now yield the rest and end the job
    nxt = plane.wait_done(plane.submit({"n": 1}), 30)
    assert [o["seq"] for o in nxt.done["output"]] == [0]
    assert len(plane.jobs[job].streams) == 1 and plane.jobs[job].done is None  # nothing more was sent
