"""A small fake of the RunPod serverless control plane, served over real HTTP on loopback.

The real ``runpod`` SDK worker (``python handler.py``) runs in *production* mode when
``RUNPOD_WEBHOOK_GET_JOB`` is set. It then talks to these endpoints (runpod 1.12, read from
``runpod/serverless/modules/rp_job.py``, ``rp_http.py``, ``rp_ping.py``, ``rp_scale.py``):

``GET  /job-take/<worker>?...&job_in_progress=0|1``
    long-poll for one job: ``200 {"id", "input"}`` or ``204`` (no job).
``GET  /job-take-batch/<worker>?...&batch_size=N``
    used instead when ``concurrency_modifier`` > 1: ``200 [{"id", "input"}, ...]`` or ``204``.
``GET  /job-stop/<worker>?...``
    the stop channel (derived from the job-take URL): long-poll, ``200 {"jobsToStop": [ids]}`` or
    ``204``. The worker then ``task.cancel()``s each listed job's asyncio task; a stopped job sends
    nothing more (no done POST).
``POST /job-stream/<worker>/<job>?...&isStream=false``
    one POST per ``yield`` of a generator handler; body ``{"output": <yielded value>}`` (JSON sent as
    ``application/x-www-form-urlencoded``).
``POST /job-done/<worker>/<job>?...&isStream=true|false``
    the final result: ``{"output": ...}`` or ``{"error": "<string>"}``; for a generator handler
    ``output`` is the list of all yields when ``return_aggregate_stream`` is on, else ``[]``.
``GET  /ping/<worker>?job_id=a,b&runpod_version=...``
    heartbeat from a separate process every ``RUNPOD_PING_INTERVAL`` ms.

The fake records every request with its receive time (``time.time()``, the same clock as the worker
on this machine), so tests can assert that stream chunks arrived incrementally.

:func:`start_worker` runs ``handler.py`` as a subprocess pointed at a :class:`FakeControlPlane`
(env per ``/work/shared/docs/platform.md``) and waits until it asks for its first job, which it only
does after the model is loaded and warmed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeControlPlane", "JobRecord", "StreamPost", "WorkerProcess", "running_worker", "start_worker"]

REPO_ROOT = Path(__file__).resolve().parents[1]

TAKE_HOLD_S = 0.5
"""How long job-take holds an empty poll open before 204 (the SDK re-polls at once after a 204)."""

STOP_HOLD_S = 1.0
"""How long job-stop holds an empty poll (the SDK sleeps 1 s after an empty answer)."""

API_KEY = "fake-runpod-api-key"


@dataclass(frozen=True)
class StreamPost:
    """One job-stream POST as received."""

    t_recv: float
    body: Any

    @property
    def output(self) -> Any:
        return self.body.get("output") if isinstance(self.body, dict) else None


@dataclass
class JobRecord:
    """Everything the fake saw of one job."""

    id: str
    input: Any
    t_submit: float
    t_taken: float | None = None
    streams: list[StreamPost] = field(default_factory=list)
    done: Any = None
    done_query: dict[str, str] = field(default_factory=dict)
    t_done: float | None = None
    t_stop_sent: float | None = None

    @property
    def outputs(self) -> list[Any]:
        """The yielded values in arrival order."""
        return [p.output for p in self.streams]


class FakeControlPlane:
    """Job queue + webhooks of a RunPod endpoint, for one or more workers on loopback.

    Use as a context manager, or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.jobs: dict[str, JobRecord] = {}
        self.pings: list[tuple[float, dict[str, str]]] = []
        self.takes: list[tuple[float, str]] = []
        self.unauthorized: list[str] = []
        self._queue: deque[str] = deque()
        self._stops: deque[str] = deque()
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> FakeControlPlane:
        handler = type("_Handler", (_RequestHandler,), {"plane": self})
        self._server = ThreadingHTTPServer((self.host, 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-runpod", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def worker_env(self, pod_id: str = "fake-pod-1", ping_interval_ms: int = 1000) -> dict[str, str]:
        """The environment that puts the SDK into production mode against this fake."""
        return {
            "RUNPOD_WEBHOOK_GET_JOB": f"{self.url}/job-take/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{self.url}/job-done/$RUNPOD_POD_ID/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{self.url}/job-stream/$RUNPOD_POD_ID/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_PING": f"{self.url}/ping/$RUNPOD_POD_ID?gpu=cpu",
            "RUNPOD_PING_INTERVAL": str(ping_interval_ms),
            "RUNPOD_POD_ID": pod_id,
            "RUNPOD_AI_API_KEY": API_KEY,
            "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
            "RUNPOD_SKIP_GPU_CHECK": "true",
        }

    # ------------------------------------------------------------------ test API
    def submit(self, job_input: Any, job_id: str | None = None) -> str:
        """Queue a job; returns its id."""
        job_id = job_id or f"job-{next(self._ids)}"
        with self._cond:
            self.jobs[job_id] = JobRecord(id=job_id, input=job_input, t_submit=time.time())
            self._queue.append(job_id)
            self._cond.notify_all()
        return job_id

    def submit_many(self, inputs: list[Any]) -> list[str]:
        """Queue several jobs at once (a batch job-take can then return them together)."""
        with self._cond:
            ids = []
            for job_input in inputs:
                job_id = f"job-{next(self._ids)}"
                self.jobs[job_id] = JobRecord(id=job_id, input=job_input, t_submit=time.time())
                self._queue.append(job_id)
                ids.append(job_id)
            self._cond.notify_all()
        return ids

    def cancel(self, job_id: str) -> None:
        """Ask the worker to stop ``job_id`` (served on the job-stop long-poll)."""
        with self._cond:
            self._stops.append(job_id)
            self._cond.notify_all()

    def wait_done(self, job_id: str, timeout_s: float = 60.0) -> JobRecord:
        """Block until the job-done POST of ``job_id`` arrived.

        Raises:
            TimeoutError: it did not arrive in time.
        """
        return self._wait(job_id, lambda: self.jobs[job_id].t_done is not None, timeout_s, "its done POST")

    def wait_streams(self, job_id: str, n: int, timeout_s: float = 60.0) -> JobRecord:
        """Block until at least ``n`` stream POSTs of ``job_id`` arrived."""
        return self._wait(job_id, lambda: len(self.jobs[job_id].streams) >= n, timeout_s, f"{n} stream POSTs")

    def wait_taken(self, job_id: str, timeout_s: float = 60.0) -> JobRecord:
        """Block until a worker took ``job_id``."""
        return self._wait(
            job_id, lambda: self.jobs[job_id].t_taken is not None, timeout_s, "a worker to take it"
        )

    def wait_polled(self, timeout_s: float, after: int = 0) -> bool:
        """Block until more than ``after`` job-take polls arrived (a worker is ready); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self.takes) > after, timeout=timeout_s)

    def _wait(self, job_id: str, pred: Callable[[], bool], timeout_s: float, what: str) -> JobRecord:
        with self._cond:
            if not self._cond.wait_for(pred, timeout=timeout_s):
                raise TimeoutError(f"job {job_id}: timed out after {timeout_s} s waiting for {what}")
            return self.jobs[job_id]

    # ------------------------------------------------------------ server helpers
    def _take(self, n: int, hold_s: float) -> list[JobRecord]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._queue), timeout=hold_s)
            taken: list[JobRecord] = []
            while self._queue and len(taken) < n:
                rec = self.jobs[self._queue.popleft()]
                rec.t_taken = time.time()
                taken.append(rec)
            return taken

    def _take_stops(self, hold_s: float) -> list[str]:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._stops), timeout=hold_s)
            ids = list(self._stops)
            self._stops.clear()
            now = time.time()
            for i in ids:
                if i in self.jobs:
                    self.jobs[i].t_stop_sent = now
            return ids

    def _record(self, kind: str, job_id: str, body: Any, query: dict[str, str]) -> None:
        now = time.time()
        with self._cond:
            rec = self.jobs.get(job_id)
            if rec is None:
                rec = self.jobs[job_id] = JobRecord(id=job_id, input=None, t_submit=now)
            if kind == "job-stream":
                rec.streams.append(StreamPost(t_recv=now, body=body))
            else:
                rec.done, rec.done_query, rec.t_done = body, query, now
            self._cond.notify_all()


class _RequestHandler(BaseHTTPRequestHandler):
    """Routes the SDK's requests to the :class:`FakeControlPlane` in ``plane``."""

    plane: FakeControlPlane
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request access log."""

    def _parts(self) -> tuple[list[str], dict[str, str]]:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        return [p for p in split.path.split("/") if p], query

    def _check_auth(self) -> None:
        if self.headers.get("Authorization") != API_KEY:
            self.plane.unauthorized.append(self.path)

    def _send(self, status: HTTPStatus, payload: Any = None) -> None:
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._check_auth()
        parts, query = self._parts()
        route = parts[0] if parts else ""
        if route == "job-take":
            self._serve_take(1, batch=False)
        elif route == "job-take-batch":
            self._serve_take(int(query.get("batch_size", "1")), batch=True)
        elif route == "job-stop":
            ids = self.plane._take_stops(STOP_HOLD_S)
            self._send(HTTPStatus.OK, {"jobsToStop": ids}) if ids else self._send(HTTPStatus.NO_CONTENT)
        elif route == "ping":
            with self.plane._cond:
                self.plane.pings.append((time.time(), query))
            self._send(HTTPStatus.OK, {})
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})

    def _serve_take(self, n: int, *, batch: bool) -> None:
        with self.plane._cond:
            self.plane.takes.append((time.time(), self.path))
            self.plane._cond.notify_all()
        jobs = self.plane._take(n, TAKE_HOLD_S)
        if not jobs:
            self._send(HTTPStatus.NO_CONTENT)
            return
        payload = [{"id": j.id, "input": j.input} for j in jobs]
        self._send(HTTPStatus.OK, payload if batch else payload[0])

    def do_POST(self) -> None:
        self._check_auth()
        parts, query = self._parts()
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        if len(parts) != 3 or parts[0] not in ("job-stream", "job-done"):
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"_unparsable": raw.decode("utf-8", "replace")}
        self.plane._record(parts[0], parts[2], body, query)
        self._send(HTTPStatus.OK, {})


# ------------------------------------------------------------------------ worker
@dataclass
class WorkerProcess:
    """A running ``python handler.py`` in production mode."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    plane: FakeControlPlane

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if needed; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        return self.proc.returncode


def start_worker(
    plane: FakeControlPlane,
    env: Mapping[str, str],
    log_path: Path,
    *,
    ready_timeout_s: float = 180.0,
    args: tuple[str, ...] = (),
    handler: Path = REPO_ROOT / "handler.py",
) -> WorkerProcess:
    """Start ``handler.py`` against ``plane`` and wait until it polls for its first job.

    Args:
        plane: a started control plane.
        env: extra environment (``VOXCAST_*``); merged over the current one and ``plane.worker_env()``.
        log_path: where the worker's stdout+stderr go.
        ready_timeout_s: how long loading + warm-up may take.
        args: extra command-line arguments for ``handler.py``.
        handler: the entrypoint to run.

    Raises:
        RuntimeError: the worker exited or did not poll in time (its log is in the message).
    """
    full_env = {**os.environ, **plane.worker_env(), "PYTHONUNBUFFERED": "1", **env}
    src = str(REPO_ROOT / "src")
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (src, str(REPO_ROOT), full_env.get("PYTHONPATH")) if p
    )
    polls_before = len(plane.takes)
    fh = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, str(handler), *args],
        cwd=str(REPO_ROOT),
        env=full_env,
        stdout=fh,
        stderr=subprocess.STDOUT,
    )
    fh.close()
    worker = WorkerProcess(proc=proc, log_path=log_path, plane=plane)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if plane.wait_polled(0.2, after=polls_before):
            return worker
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}:\n{worker.log()[-4000:]}")
    worker.stop()
    raise RuntimeError(f"worker did not poll within {ready_timeout_s} s:\n{worker.log()[-4000:]}")


@contextlib.contextmanager
def running_worker(
    plane: FakeControlPlane, env: Mapping[str, str], log_path: Path, **kw: Any
) -> Iterator[WorkerProcess]:
    """:func:`start_worker` as a context manager that always stops the worker."""
    worker = start_worker(plane, env, log_path, **kw)
    try:
        yield worker
    finally:
        worker.stop()
