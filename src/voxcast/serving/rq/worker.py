"""The RQ worker: a SimpleWorker that loads and warms the service once, then serves allow-listed jobs.

Why SimpleWorker: RQ's default Worker forks a work-horse per job, and a CUDA context (or any loaded
model) does not survive fork; SimpleWorker runs jobs in the worker process, so the model is loaded
exactly once, in :meth:`VoxcastWorker.work`, before the first dequeue (a loading worker is not yet
registered, so it is never handed a job it cannot serve).

Safety: the serializer is always :class:`rq.serializers.JSONSerializer` (pickle would let anyone who
can write to Redis run code here), and :class:`VoxcastJob` refuses any function outside
:data:`~voxcast.serving.rq.jobs.ALLOWED_FUNCTIONS` (JSON alone is no allow-list: ``os.makedirs`` is
JSON-serialisable), any callback outside :data:`~voxcast.serving.rq.jobs.ALLOWED_CALLBACKS`, instance
methods, and webhooks. A refused or undecodable job fails with a clear message; the worker keeps serving.

Dead workers: see :mod:`voxcast.serving.rq.config`: a running job holds a short lease
(``heartbeat_ttl_s``) renewed between chunks, so another worker's maintenance fails (or retries) the
job of a SIGKILLed worker within about a minute, whatever the job's timeout.

Graceful stop: SIGTERM/SIGINT is RQ's warm shutdown (no new job is taken; the worker exits 0 after
the running one) with a deadline: the running job may go on for ``VOXCAST_DRAIN_S`` (30) more seconds,
then it is cancelled (see :class:`~voxcast.serving.drain.Drain`): a synthesis job with retries left is
requeued, any other fails with :class:`~voxcast.serving.drain.WorkerShutdown` ("the worker is shutting
down ...") and its stream ends ``cancelled`` with code ``shutdown``. Voice writes still queued reach
the store before the process exits. A second signal is RQ's cold shutdown (exit at once).

Readiness: the worker's RQ hash carries ``voxcast_state`` (``ready``, ``unloaded`` after an idle
unload, ``draining``), rewritten at every heartbeat; ``/metrics`` (``VOXCAST_METRICS_PORT``) also
reports ``loading`` and ``warming``, before the worker registers.

Also usable through RQ's own CLI (it passes ``--worker-ttl``/``--maintenance-interval`` defaults of
420/600 s; those exact values are treated as unset and the ``VOXCAST_*`` values apply)::

    rq worker -w voxcast.serving.rq.worker.VoxcastWorker -S rq.serializers.JSONSerializer \\
        --url redis://127.0.0.1:6379/0 voxcast
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis
from rq import Queue, SimpleWorker, worker_registration
from rq.defaults import DEFAULT_MAINTENANCE_TASK_INTERVAL, DEFAULT_RESULT_TTL, DEFAULT_WORKER_TTL
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import JOB_ID_PATTERN, Job
from rq.serializers import JSONSerializer

from voxcast.logs import bind_request_id
from voxcast.serving.drain import Drain
from voxcast.serving.metrics_port import serve_metrics
from voxcast.serving.rq.config import QueueConfig
from voxcast.serving.rq.dead_letter import MalformedJob, VoxcastQueue
from voxcast.serving.rq.jobs import ALLOWED_CALLBACKS, ALLOWED_FUNCTIONS, JobContext, bind_context

if TYPE_CHECKING:
    from voxcast.service import Service, ServiceConfig

__all__ = ["STATE_FIELD", "JobRejected", "VoxcastJob", "VoxcastWorker", "worker_service_config"]

log = logging.getLogger(__name__)

STATE_FIELD = "voxcast_state"
"""Field of the worker's RQ hash (``rq:worker:<name>``) that holds its state."""


class JobRejected(Exception):
    """A job this worker will not run (function or callback not allow-listed)."""


class VoxcastJob(Job):
    """An RQ Job that runs only allow-listed functions and callbacks and sends no webhooks."""

    @property
    def func(self) -> Any:
        self.check_allowed()
        return Job.func.fget(self)  # type: ignore[attr-defined]

    def check_allowed(self) -> None:
        """Raise :class:`JobRejected` unless function and callbacks are allow-listed (no retries)."""
        name = self.func_name
        problem = None
        if name not in ALLOWED_FUNCTIONS:
            problem = f"job function {name!r} is not allowed on a voxcast worker; allowed: {sorted(ALLOWED_FUNCTIONS)}"
        elif self.instance is not None:
            problem = "instance-method jobs are not allowed on a voxcast worker"
        else:
            for cb in (self._success_callback_name, self._failure_callback_name, self._stopped_callback_name):
                if cb and cb not in ALLOWED_CALLBACKS:
                    problem = f"callback {cb!r} is not allowed; allowed: {sorted(ALLOWED_CALLBACKS)}"
        if problem is not None:
            self.retries_left = 0
            raise JobRejected(problem)

    def _deserialize_data(self) -> None:
        try:
            self._func_name, self._instance, self._args, self._kwargs = self.serializer.loads(self.data)
        except Exception as e:
            raise DeserializationError(
                f"job {self.id}: payload is not valid JSON for a voxcast worker "
                f"(enqueue with rq.serializers.JSONSerializer): {type(e).__name__}: {e}"
            ) from e

    @classmethod
    def fetch(cls, id: str, *args: Any, **kwargs: Any) -> Any:
        """Like RQ's, but an id RQ refuses is a missing job (NoSuchJobError), not a crash: RQ's
        registry and intermediate-queue maintenance then drop the entry instead of raising."""
        try:
            return super().fetch(id, *args, **kwargs)
        except (ValueError, TypeError) as e:
            if not isinstance(id, str) or not JOB_ID_PATTERN.fullmatch(id):
                raise NoSuchJobError(f"invalid job id {id!r}: {e}") from e
            raise

    def restore(self, raw_data: Any) -> Any:
        """Like RQ's, but a malformed job hash raises :class:`MalformedJob` (a NoSuchJobError: RQ's
        maintenance skips it; :class:`VoxcastQueue` moves it to the dead-letter list)."""
        try:
            return super().restore(raw_data)
        except NoSuchJobError:
            raise
        except Exception as e:
            raise MalformedJob(f"malformed job hash: {type(e).__name__}: {e}") from e

    def _callback_or_none(self, name: str | None, attr: str) -> Any:
        if name and name not in ALLOWED_CALLBACKS:
            log.warning("job %s: ignoring callback %r (not allow-listed)", self.id, name)
            return None
        return getattr(Job, attr).fget(self)

    @property
    def success_callback(self) -> Any:
        return self._callback_or_none(self._success_callback_name, "success_callback")

    @property
    def failure_callback(self) -> Any:
        return self._callback_or_none(self._failure_callback_name, "failure_callback")

    @property
    def stopped_callback(self) -> Any:
        return self._callback_or_none(self._stopped_callback_name, "stopped_callback")

    def send_webhooks(self, status: Any, *, exc_string: str | None = None) -> None:
        """Webhooks are disabled (a job must not make the worker call arbitrary URLs)."""
        return None


class VoxcastWorker(SimpleWorker):
    """SimpleWorker that owns one loaded :class:`~voxcast.service.Service`.

    Args:
        queues: queue names or Queue objects (rebuilt with this worker's job class and serializer).
        service: an already loaded service (tests, benchmarks); otherwise it is loaded in :meth:`work`
            from ``service_config`` (default ``ServiceConfig.from_env(os.environ)``).
        service_config: how to load the service.
        queue_config: queue settings (default ``QueueConfig.from_env(os.environ)``).
        **kwargs: passed to :class:`rq.SimpleWorker` (``connection``, ``name``...).
    """

    def __init__(
        self,
        queues: Sequence[Any],
        *args: Any,
        service: Service | None = None,
        service_config: ServiceConfig | None = None,
        queue_config: QueueConfig | None = None,
        **kwargs: Any,
    ) -> None:
        self.queue_config = queue_config or QueueConfig.from_env(os.environ)
        self._service = service
        self._owns_service = service is None
        self._service_config = service_config
        self._last_renewal = 0.0
        self._ready_ms = 0.0
        self.drain = Drain(self.queue_config.drain_s, on_begin=self._draining)
        _apply_defaults(kwargs, self.queue_config)
        names = [q.name if isinstance(q, Queue) else str(q) for q in queues]
        super().__init__(names, *args, **kwargs)

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def service(self) -> Service:
        if self._service is None:
            raise RuntimeError("the service is not loaded yet (VoxcastWorker.load_service)")
        return self._service

    def load_service(self) -> Service:
        """Load and warm the service (once), recording load and warm-up time."""
        if self._service is None:
            from voxcast.service import Service

            config = self._service_config or worker_service_config(os.environ)
            metrics = serve_metrics(os.environ)
            t0 = time.perf_counter()
            self._service = Service.load(config, metrics)
            self._ready_ms = (time.perf_counter() - t0) * 1000
        return self._service

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """Load the service, then run RQ's work loop (which registers the worker and dequeues)."""
        self.load_service()
        return super().work(*args, **kwargs)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """RQ's bootstrap (logging set up, worker registered), then one line on the loaded model."""
        super().bootstrap(*args, **kwargs)
        self._publish_state()
        engine = self.service.engine
        self.log.info(
            "Worker %s: model ready in %.0f ms (load %.0f ms, warm-up %.0f ms): %s; lease %d s, maintenance every %d s",
            self.name,
            self._ready_ms,
            getattr(engine, "load_ms", 0.0),
            getattr(engine, "warmup_ms", 0.0),
            getattr(engine, "identity", "?"),
            self.queue_config.heartbeat_ttl_s,
            self.maintenance_interval,
        )

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat, plus the worker's state (:data:`STATE_FIELD`); a worker whose registration
        vanished (Redis restarted or flushed) registers again, so it is listed in ``rq:workers`` and
        its queue's worker set while it keeps serving."""
        if pipeline is None and not self.connection.sismember(
            worker_registration.REDIS_WORKER_KEYS, self.key
        ):
            self.log.warning("Worker %s: registration lost (Redis restarted?): registering again", self.name)
            with self.connection.pipeline() as p:
                p.hset(self.key, mapping=self.serialize())
                worker_registration.register(self, p)
                p.execute()
        super().heartbeat(timeout, pipeline)
        self._publish_state()

    @property
    def state(self) -> str:
        """``loading``, ``warming``, ``ready``, ``unloaded`` or ``draining`` (the metrics' phase)."""
        if self.drain.begun:
            return "draining"
        return self._service.metrics.phase if self._service is not None else "loading"

    def _publish_state(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self.connection.hset(self.key, STATE_FIELD, self.state)

    # -- graceful stop ------------------------------------------------------------------------------
    def request_stop(self, signum: Any, frame: Any) -> None:
        """Warm shutdown (RQ) with a deadline: the running job is cancelled ``VOXCAST_DRAIN_S`` later."""
        self.drain.begin()
        super().request_stop(signum, frame)

    def _draining(self) -> None:
        """The drain began (in the signal handler): report it; Redis is written from a thread, since
        the main thread may be inside a Redis call of its own."""
        if self._service is not None:
            self._service.metrics.phase = "draining"
        threading.Thread(target=self._publish_state, name="voxcast-drain-state", daemon=True).start()

    def unsubscribe(self) -> None:
        """RQ's unsubscribe, with the listener told to stop before UNSUBSCRIBE is sent: the reply then
        ends its wait at once. The listener polls every 60 s; in RQ's order (unsubscribe, then stop)
        it was still waiting when ``join(timeout=1)`` gave up (every warm shutdown took 1 s longer),
        and since redis-py 8.2 ``stop()`` itself joins with no timeout (a warm shutdown took 60 s)."""
        thread = self.pubsub_thread
        if thread is None:
            return
        self.log.info("Worker %s: unsubscribing from channel %s", self.name, self.pubsub_channel_name)
        _clear_running(thread)
        with contextlib.suppress(redis.RedisError):
            self.pubsub.unsubscribe()
        thread.join(timeout=5)
        self.pubsub.close()

    def teardown(self) -> None:
        super().teardown()
        if self._owns_service and self._service is not None:
            self._service.close()
            self._service = None

    # -- per job --------------------------------------------------------------------------------
    def execute_job(self, job: Job, queue: Queue) -> None:
        """Run ``job`` with the job context bound (service, config, Redis, lease renewal)."""
        self._last_renewal = time.monotonic()
        ctx = JobContext(
            self.service, self.queue_config, self.connection, lambda: self._renew_lease(job), self.drain
        )
        with bind_context(ctx), bind_request_id(job.id):
            super().execute_job(job, queue)

    def get_heartbeat_ttl(self, job: Job) -> int:
        """The job's lease in the StartedJobRegistry (renewed between chunks), not ``timeout + 60``."""
        return self.queue_config.heartbeat_ttl_s

    def _renew_lease(self, job: Job) -> None:
        now = time.monotonic()
        if now - self._last_renewal < self.queue_config.heartbeat_interval_s:
            return
        self._last_renewal = now
        if self.execution is not None:
            self.maintain_heartbeats(job)


def _clear_running(thread: Any) -> None:
    """Tell redis-py's pub/sub listener thread to stop, without waiting for it (its ``stop()`` joins,
    with no timeout by default, from redis-py 8.2 on; before that it takes no argument)."""
    if "timeout" in inspect.signature(thread.stop).parameters:
        thread.stop(timeout=0)
    else:
        thread.stop()


def worker_service_config(env: Mapping[str, str]) -> ServiceConfig:
    """The service settings of a worker: ``VOXCAST_*`` with one stream at a time by default (a worker
    runs one job at a time, so warm-up records and calibrates batch size 1 only, which cuts its cold
    start; ``VOXCAST_MAX_ACTIVE`` set explicitly still wins)."""
    from voxcast.service import ServiceConfig

    return ServiceConfig.from_env({**env, "VOXCAST_MAX_ACTIVE": env.get("VOXCAST_MAX_ACTIVE") or "1"})


def _apply_defaults(kwargs: dict[str, Any], config: QueueConfig) -> None:
    """Force the JSON serializer, VoxcastJob and VoxcastQueue; fill RQ timing knobs from ``config`` when unset."""
    serializer = kwargs.get("serializer")
    if serializer not in (None, JSONSerializer, "json", "rq.serializers.JSONSerializer"):
        log.warning("ignoring serializer %r: voxcast workers only accept JSON", serializer)
    kwargs["serializer"] = JSONSerializer
    queue_class = kwargs.get("queue_class")
    if not (isinstance(queue_class, type) and issubclass(queue_class, VoxcastQueue)):
        kwargs["queue_class"] = VoxcastQueue
    job_class = kwargs.get("job_class")
    if not (isinstance(job_class, type) and issubclass(job_class, VoxcastJob)):
        kwargs["job_class"] = VoxcastJob
    kwargs.pop("default_worker_ttl", None)
    if kwargs.get("worker_ttl") in (None, DEFAULT_WORKER_TTL):
        kwargs["worker_ttl"] = config.worker_ttl_s
    if kwargs.get("maintenance_interval") in (None, DEFAULT_MAINTENANCE_TASK_INTERVAL):
        kwargs["maintenance_interval"] = config.maintenance_interval_s
    if kwargs.get("default_result_ttl") in (None, DEFAULT_RESULT_TTL):
        kwargs["default_result_ttl"] = config.result_ttl_s
    kwargs.setdefault("log_job_description", False)
