"""``python handler.py`` as a real RunPod SDK worker: production mode against the fake control plane
(the tiny model; the toy family where a test holds the model mid-stream), the ``--rp_serve_api``
local server, and a failed start-up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.models import build_cached_toy
from tests.fixtures.polling import wait_until
from tests.fixtures.procs import free_port
from tests.fixtures.runpod_control_plane import (
    REPO_ROOT,
    FakeControlPlane,
    WorkerProcess,
    running_worker,
    start_worker,
)
from tests.toy_family.family import held_env
from tests.toy_family.model import FRAMES_PER_WORD

pytest.importorskip("runpod")
pytestmark = pytest.mark.slow

TEXT = "Hello there, this is a test of streaming."
HELD = {"text": "one two three", "voice": "low", "first_chunk_frames": 1, "chunk_frames": 1}
"""A request to the toy family: one chunk per frame."""
HELD_FRAMES = FRAMES_PER_WORD * 3


def _worker_env(model: Path, store: Path, **extra: str) -> dict[str, str]:
    return {
        "VOXCAST_MODEL": str(model),
        "VOXCAST_STORAGE_DIR": str(store),
        "VOXCAST_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "RUNPOD_LOG_LEVEL": "INFO",
        "HF_HUB_OFFLINE": "1",
        **extra,
    }


@pytest.fixture(scope="module")
def worker(
    tiny_model_dir: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    d = tmp_path_factory.mktemp("rp_worker")
    env = _worker_env(
        tiny_model_dir("custom_voice"),
        d / "store",
        VOXCAST_RUNPOD_CONCURRENCY="2",  # aggregation: the default (on)
    )
    with FakeControlPlane() as plane, running_worker(plane, env, d / "worker.log") as w:
        yield w


@pytest.fixture(scope="module")
def held_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A worker on the toy family (tests/toy_family) whose model a test can hold (:func:`hold`)."""
    d = tmp_path_factory.mktemp("rp_held")
    env = _worker_env(build_cached_toy(), d / "store", **held_env(d / "hold"))
    with FakeControlPlane() as plane, running_worker(plane, env, d / "worker.log") as w:
        yield w


@pytest.fixture
def hold(held_worker: WorkerProcess) -> Iterator[Path]:
    """While this file exists, no stream of ``held_worker`` gets a frame after its first; it is
    removed when the test ends (if the test did not remove it)."""
    path = held_worker.log_path.parent / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def test_a_chunk_is_posted_while_the_engine_cannot_go_on(held_worker: WorkerProcess, hold: Path) -> None:
    """The model is held after the job's first frame: its first chunk must reach the control plane
    all the same (a handler or an SDK that held chunks back for the end would leave the test waiting)."""
    plane = held_worker.plane
    job = plane.submit(HELD)
    first = plane.wait_streams(job, 1, 60).outputs[0]
    assert first["seq"] == 0 and first["frames"] == 1 and plane.jobs[job].done is None
    hold.unlink()
    rec = plane.wait_done(job, 60)
    *chunks, final = rec.outputs
    assert final["done"] is True and final["timing"]["frames"] == HELD_FRAMES and final["audio_key"]
    assert [c["seq"] for c in chunks] == list(range(len(chunks)))
    assert sum(c["frames"] for c in chunks) == HELD_FRAMES and len(chunks) >= 2
    # the done POST carries the aggregate: every yielded message, the final one last
    assert rec.done == {"output": rec.outputs} and rec.done_query["isStream"] == "true"
    assert not plane.unauthorized


def test_a_stopped_job_stops_streaming_and_the_worker_serves_on(
    held_worker: WorkerProcess, hold: Path
) -> None:
    plane = held_worker.plane
    job = plane.submit(HELD)
    plane.wait_streams(job, 1, 60)  # held after its first frame: the stop lands mid-stream
    plane.cancel(job)
    wait_until(lambda: f"job {job}: cancelled" in held_worker.log(), what=f"job {job}'s task cancelled")
    hold.unlink()  # the engine may go on: the job's stream ends cancelled, not at its last frame
    wait_until(lambda: f"request {job} runpod cancelled" in held_worker.log(), what="the stream cancelled")
    nxt = plane.wait_done(plane.submit({**HELD, "text": "Hello."}), 60)
    assert nxt.outputs[-1]["done"] is True
    assert len(plane.jobs[job].streams) == 1 and plane.jobs[job].done is None  # nothing more was sent


def test_an_actions_result_is_the_jobs_output(worker: WorkerProcess) -> None:
    """By default the job's result (what ``/runsync`` and ``/status`` answer with) lists the
    messages: an action's result, not ``[]`` (aggregation off would send ``{"output": []}``)."""
    rec = worker.plane.wait_done(worker.plane.submit({"action": "list_voices"}), 60)
    (result,) = rec.done["output"]
    assert any("ryan" in json.dumps(v) for v in result["voices"])


def test_with_concurrency_2_two_jobs_stream_at_the_same_time(worker: WorkerProcess) -> None:
    plane = worker.plane
    req = {"text": TEXT, "voice": "ryan", "max_frames": 16, "chunk_frames": 1}
    # Submit once the SDK polls for two jobs again: right after an earlier test's job it may still
    # count that job as running and ask for one, then wait a second before asking again.
    deadline = time.time() + 30
    seen = len(plane.takes)
    while time.time() < deadline and not any("batch_size=2" in path for _, path in plane.takes[seen:]):
        plane.wait_polled(1.0, after=len(plane.takes))
    a, b = plane.submit_many([req, req])
    ra, rb = plane.wait_done(a, 120), plane.wait_done(b, 120)
    assert any("/job-take-batch/" in path and "batch_size=2" in path for _, path in plane.takes)
    # interleaved, not queued: each job's first chunk arrived before the other one's final message
    info = [(r.id, r.t_taken, [round(p.t_recv - r.t_submit, 3) for p in r.streams]) for r in (ra, rb)]
    assert ra.streams[0].t_recv < rb.streams[-1].t_recv and rb.streams[0].t_recv < ra.streams[-1].t_recv, info
    assert ra.outputs[-1]["done"] and rb.outputs[-1]["done"]


def test_bad_input_fails_naming_the_field_and_the_next_job_succeeds(worker: WorkerProcess) -> None:
    plane = worker.plane
    bad = plane.submit({"text": "hi", "sample_rate": 12345})
    unknown = plane.submit({"text": "hi", "voice": "nobody-knows-me"})
    good = plane.submit({"text": TEXT, "voice": "ryan", "max_frames": 3})
    for job, field in ((bad, "sample_rate"), (unknown, "voice")):
        rec = plane.wait_done(job, 60)
        assert set(rec.done) == {"error"} and rec.streams == []
        assert json.loads(rec.done["error"])["field"] == field
    assert plane.wait_done(good, 60).outputs[-1]["done"] is True


def test_a_failed_load_exits_non_zero_without_taking_jobs(tmp_path: Path) -> None:
    with FakeControlPlane() as plane:
        with pytest.raises(RuntimeError, match="exited with 1") as ei:
            start_worker(
                plane, _worker_env(tmp_path / "no-such-model", tmp_path / "store"), tmp_path / "w.log"
            )
        assert "start-up failed" in str(ei.value)
        assert plane.takes == []


def _post_json(url: str, payload: Any, timeout_s: float) -> Any:
    req = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def test_rp_serve_api_runsync_smoke(tiny_model_dir: Callable[..., Path], tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
    env.update(_worker_env(tiny_model_dir("custom_voice"), tmp_path / "store"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT / "src"), env.get("PYTHONPATH")) if p)
    args = ["--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", str(port)]
    with (tmp_path / "api.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "handler.py", *args], cwd=REPO_ROOT, env=env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "api.log").read_text()
                assert time.monotonic() < deadline, "the API server did not come up"
                time.sleep(0.2)
        body = {"input": {"text": TEXT, "voice": "ryan", "max_frames": 3, "stream": False}}
        out = _post_json(f"http://127.0.0.1:{port}/runsync", body, 120)
        assert out["status"] == "COMPLETED", out
        (final,) = out["output"]
        assert final["done"] is True and final["audio"] and final["timing"]["frames"] == 3
        # runpod 1.12's local server ignores a generator's yielded error (rp_fastapi._sim_runsync): the
        # job says COMPLETED with the error as its last output, where production fails it (documented)
        bad = _post_json(f"http://127.0.0.1:{port}/runsync", {"input": {"text": "hi", "sample_rate": 5}}, 60)
        assert bad["status"] == "COMPLETED" and bad["output"][-1]["error"]["field"] == "sample_rate", bad
    finally:
        proc.terminate()
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_sigterm_mid_job_lets_it_finish_within_the_drain_then_exits_0(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    env = _worker_env(build_cached_toy(), tmp_path / "store", VOXCAST_DRAIN_S="600", **held_env(hold))
    with FakeControlPlane() as plane, running_worker(plane, env, tmp_path / "worker.log") as w:
        hold.touch()  # the job is held after its first frame: still running when the signal lands
        job = plane.submit(HELD)
        plane.wait_streams(job, 1, 60)
        children = _children(w.proc.pid)
        assert children  # the SDK's heartbeat process
        w.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining: 1 in flight, deadline 600 s" in w.log(), what="the drain")
        hold.unlink()
        rec = plane.wait_done(job, 120)
        assert rec.outputs[-1]["done"] is True and rec.outputs[-1]["timing"]["frames"] == HELD_FRAMES
        assert w.proc.wait(timeout=60) == 0
        assert not [pid for pid in children if _alive(pid)]  # none outlives the worker


def test_a_job_running_at_the_drain_deadline_ends_with_shutdown_and_the_worker_exits_0(
    tmp_path: Path,
) -> None:
    hold = tmp_path / "hold"
    env = _worker_env(build_cached_toy(), tmp_path / "store", VOXCAST_DRAIN_S="0", **held_env(hold))
    with FakeControlPlane() as plane, running_worker(plane, env, tmp_path / "worker.log") as w:
        hold.touch()  # the job is held after its first frame: still running at the deadline
        job = plane.submit(HELD)
        plane.wait_streams(job, 1, 60)
        w.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "drain deadline passed: cancelling 1 in flight" in w.log(), what="the deadline")
        hold.unlink()
        rec = plane.wait_done(job, 60)
        error = json.loads(rec.done["error"])
        assert error["code"] == "shutdown" and "drain deadline" in error["message"]
        assert len(rec.streams) >= 1 and w.proc.wait(timeout=60) == 0


def _children(pid: int) -> list[int]:
    """Child processes of ``pid`` (Linux)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie left for an init that does not reap counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
