"""The RunPod serverless adapter: an async generator handler over the voxcast service.

``main()`` (called by the repository's ``handler.py``) loads and warms the service *before*
``runpod.serverless.start()``, so no job ever waits for a model load; if loading fails the process
exits non-zero instead of becoming a worker that takes jobs it cannot serve.

Each job's ``input`` is one of:

* a synthesis request (the shared schema, :func:`voxcast.engine.request.parse_request`), optionally
  with ``"action": "synthesize"``. With ``stream: true`` (the default) every engine chunk is yielded
  as it is produced (see :mod:`voxcast.serving.runpod.messages` for the message protocol), then one
  final message with the timing and the blob key / URL of the complete file. With
  ``stream: false`` only the final message is yielded, with the file inline as base64 when it is
  small (``VOXCAST_RUNPOD_INLINE_MAX_BYTES``).
* ``{"action": "register_voice", "ref_audio": "<base64>", "ref_text": "...", "x_vector_only": false}``
  -> ``{"voice_id": "..."}``.
* ``{"action": "list_voices"}`` -> ``{"voices": [...]}``.

Every bad input ends the job with ``{"error": {"code", "message", "field"}}`` and the worker keeps
serving. The engine stream is iterated on its own thread (:class:`~voxcast.serving.pump.ThreadPump`),
so the SDK's event loop, which also POSTs the messages and runs other jobs, never blocks on the model.
When the platform stops a job it cancels the job's asyncio task; the handler then cancels the engine
stream, which ends within one frame. When the worker itself is stopping (SIGTERM: see
:mod:`voxcast.serving.runpod.main`), a synthesis still running at the drain deadline ends with
``{"error": {"code": "shutdown", ...}}`` (and a ``cancelled`` entry with code ``shutdown`` in its Redis
mirror).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from voxcast.audio.formats import file_content_type
from voxcast.engine.request import MAX_REF_AUDIO_BYTES, SynthesisRequest, parse_request, request_id_for
from voxcast.errors import Cancelled, EngineUnavailable, InvalidRequest, VoxcastError
from voxcast.logs import set_request_id
from voxcast.serving.drain import Drain, WorkerShutdown
from voxcast.serving.pump import ThreadPump
from voxcast.serving.runpod.config import RunpodConfig
from voxcast.serving.runpod.messages import audio_messages, error_message, final_message
from voxcast.serving.runpod.mirror import RedisMirror

if TYPE_CHECKING:
    from voxcast.service import Service

__all__ = ["RunpodHandler"]

log = logging.getLogger(__name__)

AGGREGATE_WARN_BYTES = 16 * 1024 * 1024
"""With aggregation on, a job whose messages' audio passes this is warned of (RunPod: ``/runsync``
output <= 20 MB)."""


class _RegisterVoiceInput(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action: str
    ref_audio: str = Field(..., description="reference audio file, base64 (data: URI ok)")
    ref_text: str | None = Field(None, max_length=2000)
    x_vector_only: bool = False


def _decode_audio(value: str) -> bytes:
    payload = value.split(",", 1)[1] if value.startswith("data:") else value
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequest("ref_audio is not valid base64", field="ref_audio") from e
    if not raw or len(raw) > MAX_REF_AUDIO_BYTES:
        raise InvalidRequest(f"ref_audio must be 1..{MAX_REF_AUDIO_BYTES} bytes", field="ref_audio")
    return raw


def _jsonable(value: Any) -> Any:
    """Best-effort JSON-able view of registry entries (dataclasses, pydantic models, plain values)."""
    for attr in ("to_dict", "model_dump"):
        fn = getattr(value, attr, None)
        if callable(fn):
            return fn()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)


def _origin_unix(stream: Any, pump: ThreadPump[Any]) -> float:
    """Wall clock (Unix s) of the origin of the chunks' ``t_ms``, so that listeners in other processes
    can relate arrival times to emit times. Uses the stream's ``t_start`` (perf_counter) when the
    service exposes it, else the moment the pump began iterating (later than the origin by the voice
    lookup only, so per-chunk delays computed from it are upper bounds)."""
    origin = getattr(stream, "t_start", None) or pump.t_started
    return round(time.time() - (time.perf_counter() - origin), 6)


class RunpodHandler:
    """Turns RunPod jobs into service calls. ``handle`` is the SDK's handler (an async generator).

    Args:
        service: a loaded, warmed :class:`~voxcast.service.Service`.
        config: adapter settings.
        redis_client: a Redis client (``decode_responses=False``) to mirror chunks to Redis Streams;
            None = no mirroring.
    """

    def __init__(self, service: Service, config: RunpodConfig, redis_client: Any = None) -> None:
        self.service = service
        self.config = config
        self.redis_client = redis_client
        self.on_engine_failure: Callable[[], None] | None = None
        """Called (on the loop) after a job hit :class:`EngineUnavailable`; ``main`` exits the worker."""
        self.drain: Drain | None = None
        """The process's drain (``main`` sets it): a synthesis running at its deadline is cancelled."""
        self.on_job: Callable[[], None] | None = None
        """Called (on the loop) when a job starts; ``main`` installs its signal handlers there."""

    async def handle(self, job: Mapping[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Run one job; yields JSON-able messages (chunks, then a final message or an error)."""
        if not isinstance(job, Mapping):
            yield error_message(InvalidRequest("the job must be a JSON object with an input", field="job"))
            return
        if self.on_job is not None:
            self.on_job()
        job_id = str(job.get("id") or "local")
        set_request_id(job_id)  # this job's task: every line it logs carries the job id
        data = job.get("input")
        action = data.get("action", "synthesize") if isinstance(data, Mapping) else "synthesize"
        try:
            if action == "synthesize":
                async for message in self._synthesize(job_id, data):
                    yield message
            elif action == "register_voice":
                yield await self._register_voice(job_id, data)
            elif action == "list_voices":
                voices = await asyncio.to_thread(self.service.voices.list_voices)
                yield {"voices": _jsonable(voices)}
            else:
                raise InvalidRequest(
                    f"unknown action {action!r}; use synthesize, register_voice or list_voices",
                    field="action",
                )
        except VoxcastError as e:
            log.info("job %s: failed: %s", job_id, e.to_dict())
            if isinstance(e, EngineUnavailable) and self.on_engine_failure is not None:
                self.on_engine_failure()
            yield error_message(e)
        except Exception as e:  # a bug: report it, keep serving
            log.exception("job %s: unexpected error", job_id)
            yield error_message({"code": "internal_error", "message": f"{type(e).__name__}: {e}"})

    # ---------------------------------------------------------------- synthesize
    def _parse(self, job_id: str, data: Any) -> SynthesisRequest:
        if isinstance(data, Mapping):
            data = {k: v for k, v in data.items() if k != "action"}
            data.setdefault("request_id", request_id_for(job_id))
        return parse_request(data)

    async def _synthesize(self, job_id: str, data: Any) -> AsyncIterator[dict[str, Any]]:
        t0, started_unix = time.perf_counter(), time.time()
        request = self._parse(job_id, data)
        # stream: false returns the file whole: the stored one (marked where VOXCAST_WATERMARK is on)
        stream = await asyncio.to_thread(
            self.service.synthesize, request, store=True, entry="runpod", keep_file=not request.stream
        )
        mirror = await self._open_mirror(job_id, request)
        pump = ThreadPump(
            stream,
            maxsize=self.config.queue_chunks,
            on_item=mirror.chunk if mirror else None,
            name=f"voxcast-job-{job_id}"[:60],
        ).start()
        unwatch = self._watch_task(job_id, stream, pump, mirror)
        seq, first_ms, aggregated = 0, None, 0
        shutdown: list[str] = []

        def stop_for_shutdown(reason: str) -> None:  # the drain's thread, at its deadline
            shutdown.append(reason)
            stream.cancel()

        tracked = self.drain.track(stop_for_shutdown) if self.drain else contextlib.nullcontext()
        try:
            with tracked:
                async for chunk in pump:
                    if not request.stream:  # the file comes whole, in the final message
                        continue
                    for message in self._chunk_messages(self._coalesce(pump, chunk), seq):
                        if first_ms is None:
                            first_ms = (time.perf_counter() - t0) * 1000
                            log.info("job %s: first message after %.1f ms", job_id, first_ms)
                        if self.config.aggregate:
                            aggregated = self._aggregated(job_id, aggregated, len(message["audio"]))
                        seq += 1
                        message["ts"] = round(time.time(), 6)
                        yield message
            if shutdown:
                raise WorkerShutdown(shutdown[0])
            if stream.result is None:
                raise VoxcastError("the synthesis stream ended without a result")
            result = stream.result.to_dict()
            result["t0_unix"] = _origin_unix(stream, pump)
            if mirror:
                await asyncio.to_thread(mirror.eos, result)
            total_ms = (time.perf_counter() - t0) * 1000
            result["handler"] = {
                "started_unix": round(started_unix, 6),
                "first_message_ms": first_ms,
                "total_ms": total_ms,
            }
            fmt, whole = request.response_format, stream.file
            inline = whole if whole and len(whole) <= self.config.inline_max_bytes else None
            log.info("job %s: done, %d messages, %.1f ms", job_id, seq, total_ms)
            yield final_message(
                result, seq=seq, messages=seq, inline_audio=inline, inline_content_type=file_content_type(fmt)
            )
        except BaseException as e:
            self._abort(job_id, stream, pump, mirror, e)
            raise
        finally:
            unwatch()
            pump.close()

    def _coalesce(self, pump: ThreadPump[Any], chunk: Any) -> list[Any]:
        """``chunk`` plus the chunks already waiting behind it, up to the message size bound."""
        parts, size = [chunk], len(chunk.data)
        while self.config.coalesce and size < self.config.max_message_audio_bytes:
            more = pump.take_ready(1)
            if not more:
                break
            parts.append(more[0])
            size += len(more[0].data)
        return parts

    @staticmethod
    def _aggregated(job_id: str, before: int, size: int) -> int:
        """The job's aggregated audio after a message of ``size`` base64 bytes; warns once, as it
        passes :data:`AGGREGATE_WARN_BYTES`."""
        after = before + size
        if before <= AGGREGATE_WARN_BYTES < after:
            log.warning(
                "job %s: its final output (VOXCAST_RUNPOD_AGGREGATE on) holds over %d MiB of audio; "
                "RunPod caps /runsync output at 20 MB: for long streamed renders turn aggregation off "
                "(clients read /stream) or ask for stream: false (the file is stored, its URL returned)",
                job_id,
                AGGREGATE_WARN_BYTES // (1024 * 1024),
            )
        return after

    def _chunk_messages(self, parts: list[Any], seq: int) -> list[dict[str, Any]]:
        """Messages for consecutive chunks (one unless merged data exceeds the bound); ``t_ms`` is
        the emit time of the newest chunk in them."""
        last = parts[-1]
        return audio_messages(
            b"".join(p.data for p in parts) if len(parts) > 1 else last.data,
            first_seq=seq,
            format=str(last.format),
            sample_rate=last.sample_rate,
            t_ms=last.t_ms,
            frames=sum(p.frames for p in parts),
            max_bytes=self.config.max_message_audio_bytes,
        )

    def _watch_task(
        self, job_id: str, stream: Any, pump: ThreadPump[Any], mirror: RedisMirror | None
    ) -> Callable[[], None]:
        """Cancel the engine stream the moment the job's task ends cancelled; returns the undo.

        The SDK cancels the job's task wherever it is waiting: often in its own ``await`` of a stream
        POST while this generator is suspended at a ``yield``. The generator then only learns of it
        (as GeneratorExit) when the event loop finalises it later; the task's done callback does not wait.
        """
        task = asyncio.current_task()
        if task is None:
            return lambda: None

        def on_done(t: asyncio.Task[Any]) -> None:
            if t.cancelled():
                self._abort(job_id, stream, pump, mirror, asyncio.CancelledError())

        def unwatch() -> None:
            task.remove_done_callback(on_done)

        task.add_done_callback(on_done)
        return unwatch

    def _abort(
        self, job_id: str, stream: Any, pump: ThreadPump[Any], mirror: RedisMirror | None, e: BaseException
    ) -> None:
        """Cancel the engine stream after a failure, a cancelled task or an early close. Never blocks;
        runs once per job (later calls do nothing)."""
        if pump.closed:
            return
        stream.cancel()
        pump.close()
        cancelled = isinstance(e, asyncio.CancelledError | GeneratorExit | Cancelled)
        log.info(
            "job %s: %s; engine stream cancelled", job_id, "cancelled" if cancelled else type(e).__name__
        )
        if mirror:
            # publish the terminal entry from a thread: the loop may be tearing this task down
            threading.Thread(target=mirror.end, args=(e,), name="voxcast-redis-end", daemon=True).start()

    async def _open_mirror(self, job_id: str, request: SynthesisRequest) -> RedisMirror | None:
        if self.redis_client is None:
            return None
        mirror = RedisMirror(self.redis_client, job_id)
        await asyncio.to_thread(mirror.start, request)
        return mirror

    # ------------------------------------------------------------------- voices
    async def _register_voice(self, job_id: str, data: Any) -> dict[str, Any]:
        try:
            req = _RegisterVoiceInput.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or "input"
            raise InvalidRequest(f"{field}: {first.get('msg', 'invalid value')}", field=field) from e
        audio = _decode_audio(req.ref_audio)
        voice_id = await asyncio.to_thread(
            self.service.register_voice, audio, ref_text=req.ref_text, x_vector_only=req.x_vector_only
        )
        log.info("job %s: registered voice %s", job_id, voice_id)
        return {"voice_id": voice_id}
