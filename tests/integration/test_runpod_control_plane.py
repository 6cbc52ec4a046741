"""The fake control plane against the real runpod SDK worker, with a model-free handler.

Pins down the SDK behaviour the voxcast handler relies on (runpod 1.12, production mode): every
yield is POSTed as it is produced; a yielded ``{"error": ...}`` fails the job with ``str()`` of the
value; a stop signal cancels the job's task and nothing more is sent for it; the worker then serves
the next job.
"""

from __future__ import annotations

import itertools
import json
import textwrap
import time
from collections.abc import Iterator

import pytest

from tests.fixtures.runpod_control_plane import API_KEY, FakeControlPlane, WorkerProcess, running_worker

pytest.importorskip("runpod")

_HANDLER = textwrap.dedent(
    """
    import asyncio, json, time
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
            await asyncio.sleep(inp.get("sleep", 0.1))
            yield {"seq": i, "ts": time.time()}

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


def test_yields_arrive_incrementally_and_done_carries_the_aggregate(worker: WorkerProcess) -> None:
    plane = worker.plane
    job = plane.submit({"n": 4, "sleep": 0.15})
    rec = plane.wait_done(job, 30)
    assert [o["seq"] for o in rec.outputs] == [0, 1, 2, 3]
    recv = [p.t_recv for p in rec.streams]
    assert all(b - a > 0.08 for a, b in itertools.pairwise(recv))  # one POST per yield
    assert all(p.t_recv - p.output["ts"] < 0.5 for p in rec.streams)
    assert rec.t_done is not None and rec.t_done - recv[0] > 0.3
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


def test_stop_signal_cancels_the_task_and_the_worker_serves_on(worker: WorkerProcess) -> None:
    plane = worker.plane
    job = plane.submit({"n": 200, "sleep": 0.05})
    plane.wait_streams(job, 2, 30)
    plane.cancel(job)
    deadline = time.monotonic() + 10
    while f"CANCELLED {job}" not in worker.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"CANCELLED {job}" in worker.log()
    n = len(plane.jobs[job].streams)
    time.sleep(0.3)
    assert len(plane.jobs[job].streams) == n < 200 and plane.jobs[job].done is None
    nxt = plane.wait_done(plane.submit({"n": 1}), 30)
    assert [o["seq"] for o in nxt.done["output"]] == [0]
