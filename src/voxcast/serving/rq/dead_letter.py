"""Queue entries no worker can run, moved aside instead of stopping every worker on the queue.

RQ's own dequeue raises (and the worker exits) on a queue entry whose id fails RQ's id rule
(``../../x``, ``a:b``, bytes that are not UTF-8) or whose job hash cannot be restored; RQ's
intermediate-queue cleanup then raises on the same entry at the next start, so one bad entry pushed
into ``rq:queue:<name>`` stopped every worker on that queue for good. :class:`VoxcastQueue` dequeues
the same way, but such an entry is removed from the queue (and its intermediate list) and recorded in
``voxcast:dead-letter:<queue>`` (newest first, at most :data:`MAX_ENTRIES`, each a JSON object with
the raw entry, the reason and the time), with one ERROR log line; the worker keeps serving.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from redis import Redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import JOB_ID_PATTERN, Job
from rq.utils import get_version

__all__ = ["MAX_ENTRIES", "MalformedJob", "VoxcastQueue", "dead_letter_key", "read_dead_letters"]

log = logging.getLogger(__name__)

#: Most entries a dead-letter list keeps (the oldest are dropped).
MAX_ENTRIES = 1000


class MalformedJob(NoSuchJobError):
    """A job hash that exists but cannot be restored (RQ's own code treats it as missing)."""


def dead_letter_key(queue_name: str) -> str:
    return f"voxcast:dead-letter:{queue_name}"


def read_dead_letters(connection: Redis, queue_name: str) -> list[dict[str, Any]]:
    """The dead-letter records of ``queue_name``, newest first."""
    return [json.loads(raw) for raw in connection.lrange(dead_letter_key(queue_name), 0, -1)]


def _as_text(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else raw.decode("utf-8", errors="backslashreplace")


class VoxcastQueue(Queue):
    """An RQ Queue whose dequeue moves an unrunnable entry to the dead-letter list and goes on."""

    @classmethod
    def dequeue_any(
        cls,
        queues: Iterable[Queue],
        timeout: int | None,
        connection: Redis,
        job_class: type[Job] | None = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[Job, Queue] | None:
        """RQ's ``dequeue_any`` (same blocking, ordering and intermediate list), except that an entry
        whose id is invalid or whose job cannot be restored is dead-lettered instead of raised."""
        queues = list(queues)
        job_cls = job_class or cls.job_class
        while True:
            keys = [q.key for q in queues]
            if len(keys) == 1 and get_version(connection) >= (6, 2, 0):
                result = cls.lmove(connection, keys[0], timeout)
                moved = True
            else:
                result = cls.lpop(keys, timeout, connection=connection)
                moved = False
            if result is None:
                return None
            queue_key, raw_id = _as_text(result[0]), result[1]
            queue = cls.from_queue_key(
                queue_key,
                connection=connection,
                job_class=job_cls,
                serializer=serializer,
                death_penalty_class=death_penalty_class,
            )
            job_id = _as_text(raw_id)
            if not isinstance(raw_id, (bytes, str)) or not JOB_ID_PATTERN.fullmatch(job_id):
                _bury(connection, queue, raw_id, moved, "job id is not a valid RQ job id ([A-Za-z0-9_-]+)")
                continue
            try:
                job = job_cls.fetch(job_id, connection=connection, serializer=serializer)
            except MalformedJob as e:
                _bury(connection, queue, raw_id, moved, f"job hash cannot be restored: {e}")
                continue
            except NoSuchJobError:
                continue  # deleted after it was queued (RQ skips these too)
            except Exception as e:  # anything else this entry does to RQ's fetch
                _bury(connection, queue, raw_id, moved, f"job cannot be fetched: {type(e).__name__}: {e}")
                continue
            return job, queue


def _bury(connection: Redis, queue: Queue, raw_id: Any, moved: bool, reason: str) -> None:
    """Record ``raw_id`` in the queue's dead-letter list and drop it from the intermediate list."""
    entry = _as_text(raw_id) if isinstance(raw_id, (bytes, str)) else repr(raw_id)
    record = json.dumps({"entry": entry, "queue": queue.name, "reason": reason, "at": time.time()})
    key = dead_letter_key(queue.name)
    with connection.pipeline() as p:
        if moved:
            p.lrem(queue.intermediate_queue_key, 1, raw_id)
        p.lpush(key, record)
        p.ltrim(key, 0, MAX_ENTRIES - 1)
        p.execute()
    log.error("queue %s: entry %r moved to %s: %s", queue.name, entry[:200], key, reason)
