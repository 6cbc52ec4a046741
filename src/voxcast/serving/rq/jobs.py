"""RQ job functions: synthesize (streamed to Redis), register_voice, prerender_library (+ its chunks
and final step).

Jobs run inside :class:`~voxcast.serving.rq.worker.VoxcastWorker`, which loads the
:class:`~voxcast.service.Service` once and binds a :class:`JobContext` around every job (RQ calls job
functions with their JSON arguments only, so the loaded service reaches them through that context
variable, the same way RQ exposes ``get_current_job()``). Outside such a worker a job fails with
:class:`~voxcast.errors.EngineUnavailable`.

Only the functions in :data:`ALLOWED_FUNCTIONS` may run (the worker enforces it), and only
:data:`ALLOWED_CALLBACKS` as callbacks.

``synthesize``: the stream key is ``voxcast:stream:<job id>`` and the request id is the job id. The job
writes ``start``, one ``chunk`` entry per encoded chunk, then exactly one terminal entry (``eos`` with
the result, ``error``, or ``cancelled``) before it returns or raises. Between chunks it renews its lease
in the StartedJobRegistry and checks ``voxcast:cancel:<job id>`` (in the same round trip as the XADD).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis
from rq.exceptions import DeserializationError
from rq.job import Job, get_current_job
from rq.timeouts import JobTimeoutException

from voxcast.engine.request import SynthesisRequest, parse_request, request_id_for
from voxcast.errors import EngineUnavailable, InvalidRequest, VoxcastError
from voxcast.serving.drain import SHUTDOWN, WorkerShutdown
from voxcast.serving.rq.context import JobContext, bind_context, current_context
from voxcast.serving.rq.library import LibraryBusy
from voxcast.serving.rq.names import PRERENDER_CHUNK, PRERENDER_FINISH, cancel_key
from voxcast.serving.rq.stream import EntryType, StreamPublisher, StreamSettings, new_run, stream_key

if TYPE_CHECKING:
    pass

__all__ = [
    "ALLOWED_CALLBACKS",
    "ALLOWED_FUNCTIONS",
    "PRERENDER",
    "PRERENDER_CHUNK",
    "PRERENDER_FINISH",
    "REGISTER_VOICE",
    "SYNTHESIZE",
    "JobContext",
    "LibraryBusy",
    "bind_context",
    "cancel_key",
    "current_context",
    "on_failure",
    "prerender_chunk",
    "prerender_finish",
    "prerender_library",
    "register_voice",
    "synthesize",
]

log = logging.getLogger(__name__)

SYNTHESIZE = "voxcast.serving.rq.jobs.synthesize"
REGISTER_VOICE = "voxcast.serving.rq.jobs.register_voice"
PRERENDER = "voxcast.serving.rq.jobs.prerender_library"
ON_FAILURE = "voxcast.serving.rq.jobs.on_failure"

ALLOWED_FUNCTIONS = frozenset({SYNTHESIZE, REGISTER_VOICE, PRERENDER, PRERENDER_CHUNK, PRERENDER_FINISH})
"""Dotted names of the job functions a voxcast worker runs; anything else fails unrun."""

ALLOWED_CALLBACKS = frozenset({ON_FAILURE})
"""Dotted names accepted as on_success/on_failure/on_stopped callbacks."""


def _current_job() -> Job:
    job = get_current_job()
    if job is None:
        raise EngineUnavailable("no RQ job is running")
    return job


def _queue_wait_ms(job: Job) -> float:
    if job.enqueued_at is None or job.started_at is None:
        return 0.0
    return max(0.0, (job.started_at - job.enqueued_at).total_seconds() * 1000)


def _next_attempt(job: Job) -> int:
    attempt = int(job.meta.get("attempt", 0)) + 1
    job.meta["attempt"] = attempt
    job.save_meta()
    return attempt


def _fail_without_retry(job: Job, error: Mapping[str, Any]) -> None:
    """Record a structured error in the job meta; bad input is never retried."""
    job.retries_left = 0
    job.meta["error"] = dict(error)
    with contextlib.suppress(redis.RedisError):
        job.save_meta()


def _merge_payload(request: Any, fields: Mapping[str, Any]) -> Any:
    if request is not None and fields:
        raise InvalidRequest("give the request as one object or as keyword fields, not both", field="request")
    return request if request is not None else dict(fields)


# -- synthesize ---------------------------------------------------------------------------------
def synthesize(request: Any = None, /, **fields: Any) -> dict[str, Any]:
    """Synthesize one request, streaming chunks to ``voxcast:stream:<job id>`` and storing the file.

    Args:
        request: the request object (shared schema); or pass its fields as keyword arguments.

    Returns:
        The JSON result: :meth:`SynthesisResult.to_dict` plus ``job_id``, ``stream_key``, ``status``
        (``"finished"`` or ``"cancelled"``) and ``attempt``.

    Raises:
        InvalidRequest: bad input (also written to the stream as an ``error`` entry).
    """
    ctx, job = current_context(), _current_job()
    return _SynthesisJob(ctx, job).run(_merge_payload(request, fields))


class _SynthesisJob:
    """One run of :func:`synthesize` (split out to keep each step short)."""

    def __init__(self, ctx: JobContext, job: Job) -> None:
        self.ctx = ctx
        self.job = job
        self.key = stream_key(job.id)
        self.publisher = StreamPublisher(
            ctx.redis, self.key, ctx.config.stream, cancel_key=cancel_key(job.id), run=new_run()
        )
        self.stream: Any = None
        self.shutdown: str | None = None

    def run(self, payload: Any) -> dict[str, Any]:
        attempt = _next_attempt(self.job)
        try:
            if self.ctx.redis.exists(cancel_key(self.job.id)):
                return self._cancelled(attempt, before_start=True)
            req = _with_request_id(payload, self.job.id)
            self.stream = self.ctx.service.synthesize(req, store=True, entry="rq")
            self.publisher.start(self._start_info(req, attempt))
            with self.ctx.track(self._stop_for_shutdown):
                cancelled = self._pump()
            if self.shutdown is not None:
                self._interrupted(self.shutdown)
            if cancelled:
                return self._cancelled(attempt)
            return self._finish(attempt)
        except WorkerShutdown:  # its stream was ended (or left open for the retry) by _interrupted
            raise
        except VoxcastError as e:
            if isinstance(e, InvalidRequest):
                _fail_without_retry(self.job, e.to_dict())
            self._end_with_error(e.to_dict())
            raise
        except JobTimeoutException:
            self._end_with_error({"code": "timeout", "message": f"job exceeded {self.job.timeout} s"})
            raise
        except BaseException as e:
            self._end_with_error({"code": "internal_error", "message": f"{type(e).__name__}: {e}"})
            raise
        finally:
            if self.stream is not None and self.publisher.ended is not EntryType.EOS:
                self.stream.cancel()
            if self.publisher.ended in (EntryType.EOS, EntryType.CANCELLED):
                # the job has ended for good: a cancel flag that arrived too late has nothing to stop
                with contextlib.suppress(redis.RedisError):
                    self.ctx.redis.delete(cancel_key(self.job.id))

    def _start_info(self, req: SynthesisRequest, attempt: int) -> dict[str, Any]:
        return {
            "request_id": self.job.id,
            "job_id": self.job.id,
            "attempt": attempt,
            "format": str(req.response_format),
            "sample_rate": req.sample_rate,
            "queue_wait_ms": round(_queue_wait_ms(self.job), 3),
            "worker": self.job.worker_name,
        }

    def _stop_for_shutdown(self, reason: str) -> None:
        """The drain deadline passed (drain thread): stop the engine stream within one frame."""
        self.shutdown = reason
        self.stream.cancel()

    def _interrupted(self, reason: str) -> None:
        """End a job cut at the drain deadline: requeued when it has retries left (its stream then
        restarts on another worker, as after a lost worker), else its stream ends ``cancelled`` with
        code ``shutdown``. Raises :class:`WorkerShutdown` (RQ fails or retries the job with it)."""
        self.job.meta["interrupted"] = reason
        with contextlib.suppress(redis.RedisError):
            self.job.save_meta()
        if self.job.retries_left:
            log.warning("job %s: %s; it will be retried", self.job.id, reason)
        else:
            log.warning("job %s: %s; cancelled", self.job.id, reason)
            self.publisher.cancelled(reason, code=SHUTDOWN)
        raise WorkerShutdown(reason)

    def _pump(self) -> bool:
        """Publish every chunk; True if cancellation was requested (the engine is then stopped)."""
        for chunk in self.stream:
            cancelled = self.publisher.publish_chunk(chunk)
            self.ctx.renew_lease()
            if cancelled:
                self.stream.cancel()
                return True
        return False

    def _finish(self, attempt: int) -> dict[str, Any]:
        result = self.stream.result
        result.timing.queue_wait_ms += _queue_wait_ms(self.job)
        out = result.to_dict()
        out.update(job_id=self.job.id, stream_key=self.key, status="finished", attempt=attempt)
        self.publisher.eos(out)
        log.info(
            "job %s: %d chunks, %.2f s audio, ttfa %.1f ms, key %s",
            self.job.id,
            result.timing.chunks,
            result.duration_s,
            result.timing.ttfa_ms,
            result.audio_key,
        )
        return out

    def _cancelled(self, attempt: int, *, before_start: bool = False) -> dict[str, Any]:
        self.publisher.cancelled("cancelled before start" if before_start else "cancelled by the caller")
        log.info("job %s: cancelled%s", self.job.id, " before start" if before_start else "")
        return {"job_id": self.job.id, "stream_key": self.key, "status": "cancelled", "attempt": attempt}

    def _end_with_error(self, error: Mapping[str, Any]) -> None:
        if self.publisher.ended is not None:
            return
        try:
            self.publisher.error(error)
        except redis.RedisError as e:
            log.warning("job %s: could not write the error entry: %s", self.job.id, e)


def _with_request_id(payload: Any, job_id: str) -> SynthesisRequest:
    """Validate ``payload``; the job id is the request id (so stream key and storage agree)."""
    if not isinstance(payload, Mapping):
        raise InvalidRequest("request must be a JSON object", field="request")
    return parse_request({**payload, "request_id": request_id_for(job_id)})


# -- register_voice ------------------------------------------------------------------------------
def register_voice(payload: Any = None, /, **fields: Any) -> dict[str, Any]:
    """Register reference audio as a voice.

    Args:
        payload: ``{"audio_b64": ...}`` (inline, base64) or ``{"audio_key": ...}`` (an object in the
            blob store), plus optional ``ref_text`` and ``x_vector_only``.

    Returns:
        ``{"voice_id": ..., "ms": ...}``.

    Raises:
        InvalidRequest: malformed payload, unreadable audio, or a model that cannot clone.
    """
    ctx, job = current_context(), _current_job()
    data = _merge_payload(payload, fields)
    t0 = time.perf_counter()
    try:
        audio, ref_text, x_vector_only = _voice_inputs(ctx, data)
        voice_id = ctx.service.register_voice(audio, ref_text=ref_text, x_vector_only=x_vector_only)
    except InvalidRequest as e:
        _fail_without_retry(job, e.to_dict())
        raise
    ms = (time.perf_counter() - t0) * 1000
    log.info("job %s: registered voice %s in %.0f ms", job.id, voice_id, ms)
    return {"voice_id": voice_id, "ms": round(ms, 3), "job_id": job.id}


def _voice_inputs(ctx: JobContext, data: Any) -> tuple[bytes, str | None, bool]:
    if not isinstance(data, Mapping):
        raise InvalidRequest("payload must be a JSON object", field="payload")
    unknown = set(data) - {"audio_b64", "audio_key", "ref_text", "x_vector_only"}
    if unknown:
        raise InvalidRequest(f"unknown fields {sorted(unknown)}", field=sorted(unknown)[0])
    if ("audio_b64" in data) == ("audio_key" in data):
        raise InvalidRequest("give exactly one of audio_b64 and audio_key", field="audio_b64")
    ref_text = data.get("ref_text")
    if ref_text is not None and not isinstance(ref_text, str):
        raise InvalidRequest("ref_text must be a string", field="ref_text")
    x_vector_only = data.get("x_vector_only", False)
    if not isinstance(x_vector_only, bool):
        raise InvalidRequest("x_vector_only must be true or false", field="x_vector_only")
    if "audio_key" in data:
        return _fetch_audio(ctx, data["audio_key"]), ref_text, x_vector_only
    try:
        audio = base64.b64decode(str(data["audio_b64"]), validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequest("audio_b64 is not valid base64", field="audio_b64") from e
    if not audio:
        raise InvalidRequest("audio_b64 is empty", field="audio_b64")
    return audio, ref_text, x_vector_only


def _fetch_audio(ctx: JobContext, key: Any) -> bytes:
    from voxcast.storage.base import BlobNotFound
    from voxcast.storage.keys import validate_key

    if not isinstance(key, str):
        raise InvalidRequest("audio_key must be a string", field="audio_key")
    try:
        return ctx.service.store.get_bytes(validate_key(key, field="audio_key"))
    except BlobNotFound as e:
        raise InvalidRequest(f"no object {key!r} in the blob store", field="audio_key") from e


# -- prerender_library ---------------------------------------------------------------------------
def prerender_library(payload: Any = None, /, **fields: Any) -> dict[str, Any]:
    """Render a prompt library across every worker: plan it, then enqueue its chunk jobs and the final
    step (see :mod:`voxcast.serving.rq.library`). Its job id is the library's: progress, cancel and
    the summary (the final step's result) go by it (:class:`~voxcast.serving.rq.client.QueueClient`).

    Returns:
        ``{"status": "fanned_out", "chunks", "to_render", "final_job_id", ...}``.

    Raises:
        InvalidRequest: a malformed payload or an unreadable manifest.
        LibraryBusy: another job is rendering the same library.
    """
    from voxcast.serving.rq.library import plan_library

    ctx, job = current_context(), _current_job()
    try:
        return plan_library(ctx, job, _merge_payload(payload, fields))
    except VoxcastError as e:
        _fail_without_retry(job, e.to_dict())
        raise


def prerender_chunk(payload: Any) -> dict[str, Any]:
    """One chunk of a fanned-out library (enqueued by :func:`prerender_library`)."""
    from voxcast.serving.rq.library import render_chunk

    ctx, job = current_context(), _current_job()
    try:
        return render_chunk(ctx, job, payload)
    except InvalidRequest as e:
        _fail_without_retry(job, e.to_dict())
        raise


def prerender_finish(payload: Any) -> dict[str, Any]:
    """The final step of a fanned-out library: the manifest and the library's summary."""
    from voxcast.serving.rq.library import finish_library

    return finish_library(current_context(), _current_job(), payload)


# -- callbacks -----------------------------------------------------------------------------------
def on_failure(job: Job, connection: redis.Redis, exc_type: Any, exc_value: Any, tb: Any) -> None:
    """Failure callback: end a synthesize stream that has no terminal entry yet.

    A job that fails inside the worker has already written its ``error`` entry; this matters for a job
    whose worker died (RQ calls it from another worker's maintenance with ``AbandonedJobError``), so a
    reader waiting on the stream is told instead of timing out. Nothing is written when RQ is about
    to retry the job (the next attempt starts the stream again).
    """
    if job.retries_left:
        return
    try:
        if job.func_name != SYNTHESIZE:
            return
        key = stream_key(job.id)
        last: Any = connection.xrevrange(key, "+", "-", count=1)
        if last and _entry_type(last[0][1]) in _TERMINAL:
            return
        name = getattr(exc_type, "__name__", str(exc_type))
        code = "worker_lost" if name == "AbandonedJobError" else "internal_error"
        message = (
            "the worker running this job stopped (killed or crashed)"
            if code == "worker_lost"
            else f"{name}: {exc_value}"
        )
        pub = StreamPublisher(connection, key, StreamSettings())  # default TTLs: no config here
        pub.error({"code": code, "message": message})
        log.warning("job %s: ended its stream with %s", job.id, code)
    except (redis.RedisError, ValueError, DeserializationError) as e:
        log.warning("job %s: failure callback could not end the stream: %s", job.id, e)


_TERMINAL = {t.value for t in EntryType if t.terminal}


def _entry_type(fields: Mapping[Any, Any]) -> str:
    raw = fields.get(b"type", fields.get("type", b""))
    return raw.decode() if isinstance(raw, bytes) else str(raw)
