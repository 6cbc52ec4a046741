"""Python client of the queue side: enqueue jobs, follow their Redis streams, cancel, wait.

Example::

    client = QueueClient.connect(QueueConfig.from_env(os.environ))
    job_id = client.enqueue({"text": "Hello", "voice": "vivian", "response_format": "mulaw",
                             "sample_rate": 8000})
    capture = StreamCapture()
    for entry in client.follow(job_id):          # live, or a replay from the start if late
        capture.add(entry)                        # entry.audio: bytes as they arrive
    capture.audio, capture.result["timing"]["ttfa_ms"]

Requests are validated here with the shared schema before anything is enqueued (a bad request
never reaches a worker). The job id is the request id and names the stream
``voxcast:stream:<job id>``. A request id is an idempotency key (:mod:`voxcast.serving.rq.claims`):
enqueueing the identical request again while its job or stream lives returns that job (nothing new
runs); another request under the same id is refused (``request_id_in_use``).
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Callback, Job, JobStatus, Retry
from rq.serializers import JSONSerializer

from voxcast.engine.request import parse_request
from voxcast.ids import check_request_id
from voxcast.serving.rq.claims import Claim, claim, claim_ttl_s
from voxcast.serving.rq.config import QueueConfig, connect
from voxcast.serving.rq.jobs import ON_FAILURE, PRERENDER, REGISTER_VOICE, SYNTHESIZE, cancel_key
from voxcast.serving.rq.library import final_job_id, library_progress
from voxcast.serving.rq.stream import EntryType, StreamEntry, StreamPublisher, follow, stream_key

__all__ = ["CANCELLED", "Claim", "JobFailed", "QueueClient", "StreamCapture"]

#: The status :meth:`QueueClient.status` gives a cancelled job (queued or running when cancelled).
CANCELLED = "cancelled"

_UNKNOWN: dict[str, Any] = {"status": "unknown", "meta": {}, "result": None, "error": None, "exc": None}
_WAITING = ("queued", "deferred", "scheduled")


def _is_library(job: Job) -> bool:
    """A prerender library job (a payload that does not decode is not one)."""
    try:
        return job.func_name == PRERENDER
    except DeserializationError:
        return False


_EXCEPTION_CODES = {
    "AbandonedJobError": ("worker_lost", "the worker running this job stopped (killed or crashed)"),
    "JobTimeoutException": ("timeout", "the job exceeded its time limit"),
    "StorageError": ("storage_error", "the blob store failed"),
    "WorkerShutdown": ("shutdown", "the worker stopped (drained) while the job ran"),
}


def _error_of_exception(exc: str | None, job: Job) -> dict[str, Any] | None:
    """A structured error for a failed job that recorded none, from the exception RQ kept (the last
    line of its traceback names the type): a lost worker, a time limit, the store; else None."""
    if not exc:
        return None
    lines = [line for line in exc.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    name = last.split(":", 1)[0].rsplit(".", 1)[-1].strip()
    if name not in _EXCEPTION_CODES:
        return None
    code, message = _EXCEPTION_CODES[name]
    detail = last.split(":", 1)[1].strip() if ":" in last else ""
    if code == "timeout" and job.timeout:
        message = f"the job exceeded its {job.timeout} s limit"
    return {"code": code, "message": f"{message}: {detail}" if detail and code != "timeout" else message}


class JobFailed(RuntimeError):
    """A job ended failed or stopped. ``error`` is the structured error when known."""

    def __init__(self, job_id: str, status: str, error: Mapping[str, Any] | None, exc: str | None) -> None:
        detail = (error or {}).get("message") or (exc or "").strip().splitlines()[-1:] or [status]
        super().__init__(f"job {job_id} {status}: {detail if isinstance(detail, str) else detail[0]}")
        self.job_id = job_id
        self.status = status
        self.error = dict(error or {})
        self.exc = exc


@dataclass
class StreamCapture:
    """Accumulates a followed stream: the audio, per-chunk arrival times and the terminal entry.

    A second ``start`` entry (the job was retried after its worker died) discards what the first
    attempt sent; a repeated ``seq`` (a retried XADD) is ignored.
    """

    start: dict[str, Any] = field(default_factory=dict)
    chunks: list[StreamEntry] = field(default_factory=list)
    terminal: StreamEntry | None = None
    restarts: int = 0
    first_received_ts: float | None = None

    def add(self, entry: StreamEntry) -> None:
        if self.first_received_ts is None:
            self.first_received_ts = entry.received_ts
        if entry.type is EntryType.START:
            if self.start:
                self.restarts += 1
            self.start, self.chunks = entry.info, []
        elif entry.type is EntryType.CHUNK:
            if not self.chunks or (entry.seq or 0) > (self.chunks[-1].seq or 0):
                self.chunks.append(entry)
        else:
            self.terminal = entry

    @property
    def audio(self) -> bytes:
        return b"".join(c.audio for c in self.chunks)

    @property
    def status(self) -> str:
        """``eos``, ``error``, ``cancelled``, or ``open`` while no terminal entry has been seen."""
        return self.terminal.type.value if self.terminal is not None else "open"

    @property
    def result(self) -> dict[str, Any]:
        """The ``eos`` info (timing, audio key...) or the error info."""
        return self.terminal.info if self.terminal is not None else {}

    @property
    def gaps(self) -> int:
        """Chunks missing from the sequence (a stream trimmed by MAXLEN, or joined too late)."""
        seqs = [c.seq or 0 for c in self.chunks]
        return (seqs[-1] + 1 - len(seqs)) if seqs else 0

    def latencies_ms(self) -> list[float]:
        """Publish -> receive latency of each chunk (same-host clocks)."""
        return [(c.received_ts - c.ts) * 1000 for c in self.chunks]


class QueueClient:
    """Enqueue voxcast jobs and read their results.

    Args:
        client: Redis client (``decode_responses=False``).
        config: queue settings (queues, timeouts, TTLs).
    """

    def __init__(self, client: redis.Redis, config: QueueConfig) -> None:
        self.redis = client
        self.config = config

    @classmethod
    def connect(cls, config: QueueConfig) -> QueueClient:
        return cls(connect(config), config)

    def queue(self, name: str | None = None) -> Queue:
        return Queue(name or self.config.queues[0], connection=self.redis, serializer=JSONSerializer)

    def workers(self) -> list[dict[str, Any]]:
        """The registered workers of every configured queue: ``name``, ``state`` (``ready``,
        ``unloaded``, ``draining``; ``busy``/``idle`` is RQ's ``rq_state``), ``rq_state``,
        ``current_job``, ``queues``, ``last_heartbeat`` (ISO 8601) and ``pid``."""
        from rq import Worker

        from voxcast.serving.rq.worker import STATE_FIELD

        out, seen = [], set()
        for name in self.config.queues:
            for w in Worker.all(connection=self.redis, queue=self.queue(name)):
                if w.name in seen:
                    continue
                seen.add(w.name)
                raw = self.redis.hget(w.key, STATE_FIELD)
                out.append(
                    {
                        "name": w.name,
                        "state": raw.decode() if isinstance(raw, bytes) else raw,
                        "rq_state": str(w.get_state()),
                        "current_job": w.get_current_job_id(),
                        "queues": w.queue_names(),
                        "last_heartbeat": w.last_heartbeat.isoformat() if w.last_heartbeat else None,
                        "pid": w.pid,
                    }
                )
        return sorted(out, key=lambda w: w["name"])

    # -- enqueue --------------------------------------------------------------------------------
    def enqueue(
        self,
        request: Mapping[str, Any],
        *,
        queue: str | None = None,
        job_id: str | None = None,
        timeout_s: int | None = None,
        retries: int | None = None,
    ) -> str:
        """Validate and enqueue a synthesize job.

        Args:
            request: the request (shared schema); its ``request_id``, if any, becomes the job id.
            queue: queue name (default: the first configured queue).
            job_id: explicit job id (default: ``request_id`` or a random hex id).
            timeout_s: job timeout (default ``config.synth_timeout_s``).
            retries: RQ retries after a failure or a dead worker (default ``config.retries``).

        Returns:
            The job id (also the request id and the stream's name). For an id that already names
            the identical request's job, that job's id: nothing new is enqueued (:meth:`submit` says
            which happened).

        Raises:
            InvalidRequest: the request (or ``job_id``) does not validate.
            RequestIdInUse: the id names a job of another request that still exists.
        """
        return self.submit(request, queue=queue, job_id=job_id, timeout_s=timeout_s, retries=retries).job_id

    def submit(
        self,
        request: Mapping[str, Any],
        *,
        queue: str | None = None,
        job_id: str | None = None,
        timeout_s: int | None = None,
        retries: int | None = None,
    ) -> Claim:
        """:meth:`enqueue`, saying whether a job was created (``created``) or the identical request's
        job already existed under that id (``outcome`` ``same``)."""
        req = parse_request(request)
        payload = req.model_dump(mode="json", exclude_defaults=True, exclude={"request_id"})
        jid = check_request_id(job_id, "job_id") if job_id is not None else req.request_id or uuid.uuid4().hex
        timeout = timeout_s or self.config.synth_timeout_s
        ttl = claim_ttl_s(
            timeout_s=timeout,
            result_ttl_s=self.config.result_ttl_s,
            failure_ttl_s=self.config.failure_ttl_s,
            stream_ttl_s=max(self.config.stream.ttl_s, self.config.stream.live_ttl_s),
        )
        claimed = claim(self.redis, jid, SYNTHESIZE, payload, ttl_s=ttl)
        if not claimed.created:
            return claimed
        self._enqueue(
            SYNTHESIZE,
            payload,
            queue=queue,
            job_id=jid,
            timeout_s=timeout,
            retries=self.config.retries if retries is None else retries,
            description=f"synthesize {len(req.text)} chars",
        )
        return claimed

    def register_voice(
        self,
        audio: bytes | None = None,
        *,
        audio_key: str | None = None,
        ref_text: str | None = None,
        x_vector_only: bool = False,
        queue: str | None = None,
    ) -> str:
        """Enqueue a register_voice job (inline audio or a blob-store key); returns the job id."""
        payload: dict[str, Any] = {"x_vector_only": x_vector_only}
        if audio is not None:
            payload["audio_b64"] = base64.b64encode(audio).decode("ascii")
        if audio_key is not None:
            payload["audio_key"] = audio_key
        if ref_text is not None:
            payload["ref_text"] = ref_text
        return self._enqueue(
            REGISTER_VOICE, payload, queue=queue, timeout_s=self.config.voice_timeout_s, retries=0,
            description="register_voice",
        )  # fmt: skip

    def prerender(
        self,
        manifest: str,
        *,
        library: str,
        manifest_format: str | None = None,
        queue: str | None = None,
        **options: Any,
    ) -> str:
        """Enqueue a prerender_library job.

        Args:
            manifest: the manifest text (CSV, JSON or YAML).
            library: library name (objects go under ``libraries/<library>/``).
            manifest_format: ``csv``, ``json`` or ``yaml`` (default: detected).
            queue: queue name.
            **options: other :class:`~voxcast.prerender.library.PrerenderJob` fields (presets,
                loudness_lufs, pad_ms, defaults, force...).

        Returns:
            The job id.
        """
        from voxcast.prerender.library import PrerenderJob

        payload = {"manifest": manifest, "library": library, "manifest_format": manifest_format, **options}
        payload = {k: v for k, v in payload.items() if v is not None}
        PrerenderJob.from_payload(payload)  # validate before enqueueing
        return self._enqueue(
            PRERENDER, payload, queue=queue, timeout_s=self.config.prerender_timeout_s, retries=0,
            description=f"prerender {library}",
        )  # fmt: skip

    def _enqueue(
        self,
        func: str,
        payload: dict[str, Any],
        *,
        queue: str | None,
        timeout_s: int,
        retries: int,
        description: str,
        job_id: str | None = None,
    ) -> str:
        job = self.queue(queue).enqueue(
            func,
            payload,
            job_id=job_id,
            job_timeout=timeout_s,
            result_ttl=self.config.result_ttl_s,
            failure_ttl=self.config.failure_ttl_s,
            description=description,
            retry=Retry(max=retries) if retries > 0 else None,
            on_failure=Callback(ON_FAILURE),
            meta={"enqueued_ts": time.time()},
        )
        return str(job.id)

    # -- follow / inspect -----------------------------------------------------------------------
    def follow(
        self, job_id: str, *, from_id: str = "0-0", idle_timeout_s: float | None = 120.0, block_ms: int = 1000
    ) -> Iterator[StreamEntry]:
        """Entries of a synthesize job's stream, replayed from ``from_id`` and then live, up to and
        including the terminal entry (see :func:`voxcast.serving.rq.stream.follow`)."""
        return follow(
            self.redis, stream_key(job_id), from_id=from_id, idle_timeout_s=idle_timeout_s, block_ms=block_ms
        )

    def job(self, job_id: str) -> Job:
        """The RQ job (raises ``rq.exceptions.NoSuchJobError`` if unknown or expired)."""
        return Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer)

    def status(self, job_id: str) -> dict[str, Any]:
        """``{"status", "meta", "result", "error", "exc"}`` of a job (``status: "unknown"`` if gone).

        A prerender library job is the whole library: ``started`` while its chunks render, then the
        final step's status and result (the library's summary); ``meta.progress`` covers the library.
        """
        try:
            job = self.job(job_id)
        except NoSuchJobError:
            return self._library_status(job_id) or _UNKNOWN
        if _is_library(job):
            library = self._library_status(job_id)
            if library is not None:
                return library
        return self._job_status(job)

    def _library_status(self, job_id: str) -> dict[str, Any] | None:
        """The status of a fanned-out library (its final step), or None before the fan-out."""
        try:
            final = self.job(final_job_id(job_id))
        except NoSuchJobError:
            return None
        st = self._job_status(final)
        if st["status"] in _WAITING:
            st["status"] = JobStatus.STARTED.value
        st["meta"] = {"progress": self.progress(job_id), "final_job_id": final.id}
        return st

    def _job_status(self, job: Job) -> dict[str, Any]:
        status = job.get_status(refresh=False)
        latest = job.latest_result()
        failed = status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)
        result = latest.return_value if latest is not None and not failed else None
        name = str(status.value if status is not None else "unknown")
        # One word for a cancelled job, whether it was cancelled queued (RQ: canceled) or running
        # (RQ: finished, with a result that says cancelled).
        if status is JobStatus.CANCELED or (
            status is JobStatus.FINISHED and isinstance(result, dict) and result.get("status") == CANCELLED
        ):
            name = CANCELLED
        exc = latest.exc_string if latest is not None and failed else None
        error = job.meta.get("error")
        if failed and not error:
            error = self._stream_error(job.id) or _error_of_exception(exc, job)
        return {"status": name, "meta": dict(job.meta), "result": result, "error": error, "exc": exc}

    def _stream_error(self, job_id: str) -> dict[str, Any] | None:
        """The structured error a synthesize job's stream ended with (``worker_lost``, ``timeout``,
        ``storage_error``...: written by the worker or on its behalf), or None."""
        try:
            last: Any = self.redis.xrevrange(stream_key(job_id), "+", "-", count=1)
        except redis.ResponseError:  # not a stream
            return None
        if not last:
            return None
        try:
            entry = StreamEntry.decode(*last[0])
        except ValueError:
            return None
        return dict(entry.info) if entry.type is EntryType.ERROR and entry.info.get("code") else None

    def exists(self, job_id: str) -> bool:
        """Whether the job or its stream is still in Redis (a stream can outlive its job's result)."""
        return self.status(job_id)["status"] != "unknown" or bool(self.redis.exists(stream_key(job_id)))

    def unserved_queue(self, job_id: str) -> str | None:
        """The queue of a job that waits there while no worker listens on it, else None (the job
        runs, has ended, is unknown, or a worker serves its queue)."""
        from rq import Worker

        try:
            job = self.job(job_id)
        except NoSuchJobError:
            return None
        if job.get_status(refresh=False) is not JobStatus.QUEUED:
            return None
        queue = self.queue(job.origin)
        return None if Worker.all(connection=self.redis, queue=queue) else job.origin

    def wait(self, job_id: str, timeout_s: float = 300.0, poll_s: float = 0.05) -> dict[str, Any]:
        """Block until the job ends; return its result.

        Raises:
            JobFailed: the job failed, was cancelled or stopped.
            TimeoutError: still running after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status(job_id)
            if st["status"] == JobStatus.FINISHED.value:
                return dict(st["result"] or {})
            if st["status"] == CANCELLED:
                return dict(st["result"] or {"job_id": job_id, "status": CANCELLED})
            if st["status"] in (JobStatus.FAILED.value, JobStatus.STOPPED.value):
                raise JobFailed(job_id, st["status"], st["error"], st["exc"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {st['status']} after {timeout_s:.0f} s")
            time.sleep(poll_s)

    # -- cancel ---------------------------------------------------------------------------------
    def cancel(self, job_id: str) -> str:
        """Ask a job to stop.

        A running job sees the flag between two chunks and ends its stream with ``cancelled``; a
        queued job is removed from its queue and its stream is ended here. A prerender library job
        cancels the whole library: every chunk stops at its next prompt (queued ones end when they
        start), and the final step writes the manifest of what was done.

        Returns:
            What the cancel did: ``cancelled`` (it was waiting: it will not run), ``cancelling`` (it
            is running: it stops within a chunk), the job's status when it had already ended
            (``finished``, ``failed``, ``cancelled``), or ``unknown`` (no such job, or expired).

        Only a job that has not ended gets the flag: cancelling what has ended leaves nothing behind
        (a later job under the same id is not cancelled by it).
        """
        try:
            job = self.job(job_id)
        except NoSuchJobError:
            return self._cancel_library(job_id) if self._library_status(job_id) else "unknown"
        status = job.get_status(refresh=False)
        if status is JobStatus.FINISHED and _is_library(job):
            return self._cancel_library(job_id)
        if status in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED, JobStatus.STARTED):
            # the flag first: a worker that dequeues the job in the meantime sees it at its start
            self.redis.set(cancel_key(job_id), b"1", ex=self.config.cancel_ttl_s)
            now = job.get_status(refresh=True)
            if now is JobStatus.STARTED:
                return "cancelling"
            if now not in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED):  # ended meanwhile
                self.redis.delete(cancel_key(job_id))
                return str(self.status(job_id)["status"])
            job.cancel()
            StreamPublisher(self.redis, stream_key(job_id), self.config.stream).cancelled(
                "cancelled before start"
            )
            return CANCELLED
        return str(self.status(job_id)["status"])

    def _cancel_library(self, job_id: str) -> str:
        """Cancel a fanned-out library (its chunks read the flag): ``cancelling`` or its end status
        (a library that has ended gets no flag)."""
        st = self._library_status(job_id) or _UNKNOWN
        if st["status"] != JobStatus.STARTED.value:
            return str(st["status"])
        self.redis.set(cancel_key(job_id), b"1", ex=self.config.cancel_ttl_s)
        return "cancelling"

    def progress(self, job_id: str) -> dict[str, Any]:
        """Progress of a prerender library job: ``total``, ``done``, ``rendered``, ``skipped``,
        ``failed``, ``workers`` (name -> prompts) across all its chunks (``{}`` before it is planned)."""
        library = library_progress(self.redis, job_id)
        if library is not None:
            return library
        try:
            return dict(self.job(job_id).get_meta(refresh=True).get("progress") or {})
        except NoSuchJobError:
            return {}

    def wait_all(self, job_ids: Sequence[str], timeout_s: float = 300.0) -> dict[str, str]:
        """Statuses of ``job_ids`` once none is queued or started (or at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            statuses = {j: self.status(j)["status"] for j in job_ids}
            pending = [j for j, s in statuses.items() if s in ("queued", "started", "deferred", "scheduled")]
            if not pending or time.monotonic() > deadline:
                return statuses
            time.sleep(0.1)
