"""Request ids as idempotency keys: one id names one synthesize job while that job or its stream lives.

A client that enqueues with a ``request_id`` claims ``voxcast:request:<id>`` in one Lua call:

- **free** (never claimed, or the claimed job's record and stream have both expired): the claim is
  taken, a stale stream and cancel flag left under that id are deleted, and the job is enqueued;
- **the same request** (the same function and payload, by fingerprint) while the job or its stream
  lives: nothing is enqueued; the caller gets the id of the job that exists (a retried enqueue);
- **another request**: refused with :class:`RequestIdInUse` (``request_id_in_use``, field
  ``request_id``).

The check and the claim are one atomic step, so two clients enqueueing the same id at once get one job
between them. A claim younger than :data:`CLAIM_GRACE_S` counts as live even before its job record
exists (the winner is between its claim and RQ's enqueue). Claims expire on their own after the longest
time a job's records can live (:func:`claim_ttl_s`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis
from rq.job import Job

from voxcast.errors import RequestIdInUse
from voxcast.serving.rq.names import cancel_key
from voxcast.serving.rq.stream import stream_key

__all__ = [
    "CLAIM_GRACE_S",
    "CLAIM_KEY_PREFIX",
    "Claim",
    "ClaimOutcome",
    "RequestIdInUse",
    "claim",
    "claim_key",
]

CLAIM_KEY_PREFIX = "voxcast:request:"

CLAIM_GRACE_S = 60
"""Seconds a fresh claim counts as live without a job record (the claimant enqueues within this)."""


class ClaimOutcome(StrEnum):
    NEW = "new"
    SAME = "same"
    TAKEN = "taken"


@dataclass(frozen=True)
class Claim:
    """What :func:`claim` found: ``new`` (enqueue it), ``same`` (that job exists), ``taken``."""

    job_id: str
    outcome: ClaimOutcome

    @property
    def created(self) -> bool:
        return self.outcome is ClaimOutcome.NEW


def claim_key(job_id: str) -> str:
    return CLAIM_KEY_PREFIX + job_id


def fingerprint(func: str, payload: Any) -> str:
    """SHA-256 of the function and its JSON payload (keys sorted): equal requests, equal prints."""
    blob = json.dumps([func, payload], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


# KEYS: claim, job hash, stream, cancel flag. ARGV: fingerprint, claim TTL (s), grace (s).
# The claim's value is "<fingerprint>|<unix seconds when taken>".
_CLAIM_LUA = """
local now = tonumber(redis.call('TIME')[1])
local cur = redis.call('GET', KEYS[1])
if cur then
  local sep = string.find(cur, '|', 1, true)
  local fp = sep and string.sub(cur, 1, sep - 1) or cur
  local taken_at = sep and tonumber(string.sub(cur, sep + 1)) or 0
  local live = redis.call('EXISTS', KEYS[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 1
    or (now - taken_at) < tonumber(ARGV[3])
  if live then
    if fp == ARGV[1] then return 'same' end
    return 'taken'
  end
elseif redis.call('EXISTS', KEYS[2]) == 1 then
  return 'taken'
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. now, 'EX', tonumber(ARGV[2]))
redis.call('DEL', KEYS[3], KEYS[4])
return 'new'
"""


def claim(client: redis.Redis, job_id: str, func: str, payload: Any, *, ttl_s: int) -> Claim:
    """Claim ``job_id`` for ``func(payload)`` (see the module docstring).

    Raises:
        RequestIdInUse: the id names another request's job, which still exists.
    """
    keys = [claim_key(job_id), Job.key_for(job_id), stream_key(job_id), cancel_key(job_id)]
    raw = client.eval(_CLAIM_LUA, len(keys), *keys, fingerprint(func, payload), ttl_s, CLAIM_GRACE_S)
    outcome = ClaimOutcome(raw.decode() if isinstance(raw, bytes) else str(raw))
    if outcome is ClaimOutcome.TAKEN:
        raise RequestIdInUse(
            f"request_id {job_id!r} names another job (a different request) that still exists; "
            "use a new id, or enqueue the identical request to get that job",
            field="request_id",
        )
    return Claim(job_id, outcome)


def claim_ttl_s(*, timeout_s: int, result_ttl_s: int, failure_ttl_s: int, stream_ttl_s: int) -> int:
    """How long a claim is kept: past the longest any record of its job lives (the liveness check in
    :func:`claim` frees an id whose job and stream have expired before that)."""
    return timeout_s + max(result_ttl_s, failure_ttl_s, stream_ttl_s) + CLAIM_GRACE_S
