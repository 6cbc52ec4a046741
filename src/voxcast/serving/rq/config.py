"""Configuration of the queue side (RQ worker, job defaults, Redis streams), built from env vars.

Every field has an env var (``VOXCAST_*``) and a CLI flag of the same name in ``voxcast worker``.

Recovery from a dead worker: RQ marks a running job abandoned when its entry in the
StartedJobRegistry expires, and only a worker running *maintenance* notices. Stock SimpleWorker
sets that expiry to ``job_timeout + 60`` s once, at start. :class:`~voxcast.serving.rq.worker.VoxcastWorker`
instead uses a short lease (``heartbeat_ttl_s``) that the running job renews between chunks (every
``heartbeat_interval_s``), so a SIGKILLed worker's job expires ``heartbeat_ttl_s`` after its last
renewal regardless of how long the job may legitimately run. With the defaults, the worst case
until another worker fails (or retries) it is::

    heartbeat_ttl_s (30) + maintenance_interval_s (15) + dequeue block (worker_ttl_s - 15 = 15) = 60 s

(an idle worker checks for maintenance each time its blocking dequeue returns). The first worker
that starts after a crash also runs maintenance at once. Keep ``heartbeat_ttl_s`` well above the
longest gap between two chunks of one job (one chunk is a fraction of a second of audio).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from voxcast.envvars import env_float, env_int
from voxcast.serving.drain import DEFAULT_DRAIN_S, drain_seconds
from voxcast.serving.rq.stream import (
    DEFAULT_LIVE_TTL_S,
    DEFAULT_MAXLEN,
    DEFAULT_TTL_S,
    StreamSettings,
)

__all__ = ["QueueConfig", "connect"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_QUEUES = ("voxcast",)

DEFAULT_SYNTH_TIMEOUT_S = 300
"""Hard limit of one synthesize job (SIGALRM; fires between Python calls)."""

DEFAULT_VOICE_TIMEOUT_S = 120
"""Hard limit of one register_voice job."""

DEFAULT_PRERENDER_TIMEOUT_S = 4 * 3600
"""Hard limit of one prerender job: the planning job, each chunk job (at most 32 prompts: minutes) and
the final step (a library is spread over chunk jobs, so its size never comes near it)."""

DEFAULT_RESULT_TTL_S = 3600
"""Seconds a finished job's result stays in Redis."""

DEFAULT_FAILURE_TTL_S = 7 * 24 * 3600
"""Seconds a failed job stays in the FailedJobRegistry (RQ's default is a year)."""

DEFAULT_RETRIES = 0
"""RQ retries of a failed or abandoned job. 0: a crash fails the job (a crash loop stays contained)."""

DEFAULT_WORKER_TTL_S = 30
"""Worker key TTL; RQ's blocking dequeue waits ``worker_ttl - 15`` s between maintenance checks."""

DEFAULT_MAINTENANCE_INTERVAL_S = 15
"""How often a worker cleans registries (fails abandoned jobs). RQ's default is 600."""

DEFAULT_HEARTBEAT_TTL_S = 30
"""Lease of a running job in the StartedJobRegistry, renewed by the job between chunks."""

DEFAULT_HEARTBEAT_INTERVAL_S = 5.0
"""Minimum seconds between two lease renewals (one small Redis pipeline each)."""

DEFAULT_CANCEL_TTL_S = 3600
"""Lifetime of a ``voxcast:cancel:<job id>`` flag."""

DEFAULT_FOLLOW_IDLE_TIMEOUT_S = 120.0
"""How long ``voxcast enqueue --follow`` / ``listen`` wait without a new stream entry before they give up
(saying why: no worker serves the queue, or the job's status)."""

DEFAULT_REDIS_RETRIES = 20
"""Retries of a Redis command on connection errors (jittered backoff up to 1 s: ~10-15 s outage)."""

DEFAULT_STORAGE_RETRY_S = 60.0
"""How long a prompt library's store calls (its files, the manifest, the reads before them) are
retried with backoff after their first failure, so an outage of the object store of up to about a
minute is waited out (:mod:`voxcast.storage.retry`); past it the library ends with ``storage_error``."""


_int = env_int
_float = env_float


@dataclass(frozen=True)
class QueueConfig:
    """Queue-side settings (see the module docstring for the timing defaults).

    Attributes:
        redis_url: ``VOXCAST_REDIS_URL``.
        queues: ``VOXCAST_QUEUES`` (comma-separated), first = highest priority and the enqueue default.
        stream: ``VOXCAST_STREAM_MAXLEN``, ``VOXCAST_STREAM_TTL_S``, ``VOXCAST_STREAM_LIVE_TTL_S``.
        synth_timeout_s / voice_timeout_s / prerender_timeout_s: ``VOXCAST_JOB_TIMEOUT_S``,
            ``VOXCAST_VOICE_JOB_TIMEOUT_S``, ``VOXCAST_PRERENDER_TIMEOUT_S``.
        result_ttl_s / failure_ttl_s: ``VOXCAST_RESULT_TTL_S``, ``VOXCAST_FAILURE_TTL_S``.
        retries: ``VOXCAST_JOB_RETRIES``.
        worker_ttl_s / maintenance_interval_s: ``VOXCAST_WORKER_TTL_S``, ``VOXCAST_MAINTENANCE_INTERVAL_S``.
        heartbeat_ttl_s / heartbeat_interval_s: ``VOXCAST_JOB_HEARTBEAT_TTL_S``,
            ``VOXCAST_JOB_HEARTBEAT_INTERVAL_S``.
        cancel_ttl_s: ``VOXCAST_CANCEL_TTL_S``.
        redis_retries: ``VOXCAST_REDIS_RETRIES``.
        storage_retry_s: ``VOXCAST_STORAGE_RETRY_S`` (0: a library's store calls are not retried).
        drain_s: ``VOXCAST_DRAIN_S``.
        follow_idle_timeout_s: ``VOXCAST_FOLLOW_IDLE_TIMEOUT_S`` (clients: ``enqueue --follow``, ``listen``).
    """

    redis_url: str = DEFAULT_REDIS_URL
    queues: tuple[str, ...] = DEFAULT_QUEUES
    stream: StreamSettings = field(default_factory=StreamSettings)
    synth_timeout_s: int = DEFAULT_SYNTH_TIMEOUT_S
    voice_timeout_s: int = DEFAULT_VOICE_TIMEOUT_S
    prerender_timeout_s: int = DEFAULT_PRERENDER_TIMEOUT_S
    result_ttl_s: int = DEFAULT_RESULT_TTL_S
    failure_ttl_s: int = DEFAULT_FAILURE_TTL_S
    retries: int = DEFAULT_RETRIES
    worker_ttl_s: int = DEFAULT_WORKER_TTL_S
    maintenance_interval_s: int = DEFAULT_MAINTENANCE_INTERVAL_S
    heartbeat_ttl_s: int = DEFAULT_HEARTBEAT_TTL_S
    heartbeat_interval_s: float = DEFAULT_HEARTBEAT_INTERVAL_S
    cancel_ttl_s: int = DEFAULT_CANCEL_TTL_S
    redis_retries: int = DEFAULT_REDIS_RETRIES
    storage_retry_s: float = DEFAULT_STORAGE_RETRY_S
    drain_s: float = DEFAULT_DRAIN_S
    follow_idle_timeout_s: float = DEFAULT_FOLLOW_IDLE_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.queues or any(not q for q in self.queues):
            raise ValueError("VOXCAST_QUEUES must name at least one queue")
        if self.worker_ttl_s < 16:
            raise ValueError("VOXCAST_WORKER_TTL_S must be >= 16 (RQ blocks worker_ttl - 15 s per dequeue)")
        if self.heartbeat_interval_s <= 0 or self.heartbeat_ttl_s <= 2 * self.heartbeat_interval_s:
            raise ValueError("VOXCAST_JOB_HEARTBEAT_TTL_S must exceed twice the heartbeat interval")
        if min(self.synth_timeout_s, self.voice_timeout_s, self.prerender_timeout_s) < 1:
            raise ValueError("job timeouts must be >= 1 s")
        if self.retries < 0 or self.maintenance_interval_s < 1 or self.redis_retries < 0:
            raise ValueError("retries and redis retries must be >= 0, maintenance interval >= 1 s")
        if self.drain_s < 0:
            raise ValueError("VOXCAST_DRAIN_S must be >= 0")
        if self.storage_retry_s < 0:
            raise ValueError("VOXCAST_STORAGE_RETRY_S must be >= 0")
        if self.follow_idle_timeout_s <= 0:
            raise ValueError("VOXCAST_FOLLOW_IDLE_TIMEOUT_S must be > 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> QueueConfig:
        """Build from ``VOXCAST_*`` variables (missing or empty = the documented default).

        Raises:
            ValueError: a malformed or out-of-range value, naming the variable.
        """
        queues = tuple(q.strip() for q in env.get("VOXCAST_QUEUES", "").split(",") if q.strip())
        stream = StreamSettings(
            maxlen=_int(env, "VOXCAST_STREAM_MAXLEN", DEFAULT_MAXLEN),
            ttl_s=_int(env, "VOXCAST_STREAM_TTL_S", DEFAULT_TTL_S),
            live_ttl_s=_int(env, "VOXCAST_STREAM_LIVE_TTL_S", DEFAULT_LIVE_TTL_S),
        )
        return cls(
            redis_url=env.get("VOXCAST_REDIS_URL", "").strip() or DEFAULT_REDIS_URL,
            queues=queues or DEFAULT_QUEUES,
            stream=stream,
            synth_timeout_s=_int(env, "VOXCAST_JOB_TIMEOUT_S", DEFAULT_SYNTH_TIMEOUT_S),
            voice_timeout_s=_int(env, "VOXCAST_VOICE_JOB_TIMEOUT_S", DEFAULT_VOICE_TIMEOUT_S),
            prerender_timeout_s=_int(env, "VOXCAST_PRERENDER_TIMEOUT_S", DEFAULT_PRERENDER_TIMEOUT_S),
            result_ttl_s=_int(env, "VOXCAST_RESULT_TTL_S", DEFAULT_RESULT_TTL_S),
            failure_ttl_s=_int(env, "VOXCAST_FAILURE_TTL_S", DEFAULT_FAILURE_TTL_S),
            retries=_int(env, "VOXCAST_JOB_RETRIES", DEFAULT_RETRIES),
            worker_ttl_s=_int(env, "VOXCAST_WORKER_TTL_S", DEFAULT_WORKER_TTL_S),
            maintenance_interval_s=_int(
                env, "VOXCAST_MAINTENANCE_INTERVAL_S", DEFAULT_MAINTENANCE_INTERVAL_S
            ),
            heartbeat_ttl_s=_int(env, "VOXCAST_JOB_HEARTBEAT_TTL_S", DEFAULT_HEARTBEAT_TTL_S),
            heartbeat_interval_s=_float(
                env, "VOXCAST_JOB_HEARTBEAT_INTERVAL_S", DEFAULT_HEARTBEAT_INTERVAL_S
            ),
            cancel_ttl_s=_int(env, "VOXCAST_CANCEL_TTL_S", DEFAULT_CANCEL_TTL_S),
            redis_retries=_int(env, "VOXCAST_REDIS_RETRIES", DEFAULT_REDIS_RETRIES),
            storage_retry_s=_float(env, "VOXCAST_STORAGE_RETRY_S", DEFAULT_STORAGE_RETRY_S),
            drain_s=drain_seconds(env),
            follow_idle_timeout_s=_float(env, "VOXCAST_FOLLOW_IDLE_TIMEOUT_S", DEFAULT_FOLLOW_IDLE_TIMEOUT_S),
        )

    def with_overrides(self, **changes: Any) -> QueueConfig:
        """A copy with some fields replaced (CLI flags); None values are ignored."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def worst_case_recovery_s(self) -> int:
        """Upper bound on how long a killed worker's job stays STARTED while another worker is idle."""
        return self.heartbeat_ttl_s + self.maintenance_interval_s + max(1, self.worker_ttl_s - 15)


def connect(config: QueueConfig, **kwargs: Any) -> redis.Redis:
    """A Redis client for ``config.redis_url`` (bytes replies, retries on connection errors).

    Args:
        config: queue settings (URL and retry budget).
        **kwargs: passed to :meth:`redis.Redis.from_url` (e.g. ``socket_timeout``).
    """
    retry = Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), config.redis_retries)
    kwargs.setdefault("health_check_interval", 30)
    return redis.Redis.from_url(config.redis_url, decode_responses=False, retry=retry, **kwargs)
