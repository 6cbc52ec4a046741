"""The context a voxcast job runs in: the worker's loaded service, queue settings, Redis client, lease
renewal and drain, bound by the worker around each job (:func:`bind_context`) and read by the job
functions (:func:`current_context`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from voxcast.errors import EngineUnavailable
from voxcast.serving.drain import Drain
from voxcast.serving.rq.config import QueueConfig

if TYPE_CHECKING:
    from voxcast.service import Service

__all__ = ["JobContext", "bind_context", "current_context"]


@dataclass(frozen=True)
class JobContext:
    """What a job needs from the process that runs it.

    Attributes:
        service: the loaded, warmed service.
        config: queue settings (stream bounds, TTLs).
        redis: the worker's Redis client (bytes replies).
        renew_lease: extends the running job's lease (throttled; cheap to call per chunk).
        drain: the worker's drain (graceful stop): a job registers there what cancels it at the
            drain deadline; None outside a worker (tests).
    """

    service: Service
    config: QueueConfig
    redis: redis.Redis
    renew_lease: Callable[[], None]
    drain: Drain | None = None

    def track(self, cancel: Callable[[str], None]) -> contextlib.AbstractContextManager[None]:
        """Register work the drain deadline cancels (see :meth:`Drain.track`)."""
        return self.drain.track(cancel) if self.drain is not None else contextlib.nullcontext()


_CONTEXT: ContextVar[JobContext | None] = ContextVar("voxcast_job_context", default=None)


@contextlib.contextmanager
def bind_context(ctx: JobContext) -> Iterator[JobContext]:
    """Make ``ctx`` the current job context for the duration of the ``with`` block."""
    token = _CONTEXT.set(ctx)
    try:
        yield ctx
    finally:
        _CONTEXT.reset(token)


def current_context() -> JobContext:
    """The context bound by the running worker.

    Raises:
        EngineUnavailable: called outside a voxcast worker.
    """
    ctx = _CONTEXT.get()
    if ctx is None:
        raise EngineUnavailable("voxcast jobs run only in a VoxcastWorker (no service is loaded here)")
    return ctx
