"""Mirror a RunPod job's chunks to a Redis Stream, for listeners that need lower latency.

RunPod's own ``/stream/{id}`` is polled by clients about once a second; a listener that reads the
Redis Stream ``voxcast:stream:<job id>`` gets each chunk within a millisecond of its emission. The
entries follow the RQ worker's protocol (:mod:`voxcast.serving.rq.stream`): ``start``, ``chunk``
(raw bytes, engine ``seq``), then ``eos`` / ``error`` / ``cancelled``.

Redis is a side channel here: if it fails, the mirror logs once and stops publishing for that job;
the RunPod output is unaffected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from voxcast.engine.request import SynthesisRequest
from voxcast.errors import Cancelled, VoxcastError
from voxcast.serving.drain import SHUTDOWN, WorkerShutdown
from voxcast.serving.rq.stream import StreamPublisher, StreamSettings, new_run, stream_key

if TYPE_CHECKING:
    from voxcast.service import EncodedChunk

__all__ = ["RedisMirror", "mirror_key"]

log = logging.getLogger(__name__)


def mirror_key(job_id: str) -> str:
    """The Redis Stream key of a RunPod job: ``voxcast:stream:<request id of the job>``."""
    return stream_key(job_id)


class RedisMirror:
    """Publishes one job's stream; every method is blocking (call it off the event loop).

    Args:
        client: Redis client (``decode_responses=False``).
        job_id: the RunPod job id (the stream key is :func:`mirror_key` of it).
        settings: stream bounds and TTLs.
    """

    def __init__(self, client: Any, job_id: str, settings: StreamSettings | None = None) -> None:
        self.job_id = job_id
        self.key = mirror_key(job_id)
        self._pub = StreamPublisher(client, self.key, settings, run=new_run())
        self.failed = False

    def start(self, request: SynthesisRequest) -> None:
        info = {
            "request_id": request.request_id,
            "job_id": self.job_id,
            "attempt": 1,
            "format": str(request.response_format),
            "sample_rate": request.sample_rate,
            "source": "runpod",
        }
        # A RunPod job id names one run here: a second run with the same id (every local one-shot run
        # is ``local-test``; a job RunPod retries) replaces what the stream held, so no follower
        # replays the earlier run's audio as this one's.
        self._safe(self._pub.start, info, reset=True)

    def chunk(self, chunk: EncodedChunk) -> None:
        """Publish one :class:`~voxcast.service.EncodedChunk` (called on the engine pump thread)."""
        self._safe(self._pub.publish_chunk, chunk)

    def eos(self, result: Mapping[str, Any]) -> None:
        self._safe(self._pub.eos, result)

    def end(self, exc: BaseException) -> None:
        """Terminal entry for a job that did not finish: ``cancelled`` or ``error``."""
        if self._pub.ended is not None:
            return
        if isinstance(exc, WorkerShutdown):
            self._safe(self._pub.cancelled, exc.message, code=SHUTDOWN)
        elif isinstance(exc, asyncio.CancelledError | GeneratorExit | Cancelled):
            self._safe(self._pub.cancelled, "job cancelled")
        elif isinstance(exc, VoxcastError):
            self._safe(self._pub.error, exc.to_dict())
        else:
            self._safe(self._pub.error, {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"})

    def _safe(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        if self.failed:
            return
        try:
            fn(*args, **kwargs)
        except Exception as e:  # Redis is a side channel: never fail the job for it
            self.failed = True
            log.warning(
                "job %s: Redis stream %s failed (%s); not mirroring this job any more",
                self.job_id,
                self.key,
                e,
            )
