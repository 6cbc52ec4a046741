"""A prompt library fanned out over every worker: plan job -> chunk jobs -> one final step.

RQ's own mechanisms carry it (no scheduler of ours)::

    prerender_library (the library job, id L)     parse the manifest, take the library's lock, decide
          |                                        what is done, cut the rest into chunks
          +-- Group L: prerender_chunk L-c00000 ... L-cNNNNN   (any worker; Retry(max=2) each)
          +-- prerender_finish L-final, depends_on every chunk with allow_failure=True: RQ enqueues
              it once every chunk has ended, finished or failed; it writes manifest.json, frees the
              lock and returns the library's summary

A chunk renders its prompts with several in flight (:func:`~voxcast.prerender.render.render_prompts`)
and commits each prompt's outcome as it is stored: ``HSETNX`` of the prompt id in the run's outcome
hash, counts added in the same Lua call. A prompt is committed once: a chunk that runs again (its
worker was killed; RQ's abandoned-job handling requeues it) skips the committed prompts, and a
second outcome of one prompt is never recorded. Progress is those counts (one ``HGETALL``); cancel is
the library job's cancel flag, which every chunk checks about four times a second (queued chunks end
at once when they start; the final step still writes the manifest of what was done).

Keys (expire after ``failure_ttl_s``; the final step shortens them to ``result_ttl_s``)::

    voxcast:prerender:<L>:plan       the PlanRecord (JSON) and the chunks' prompt ids
    voxcast:prerender:<L>:outcomes   prompt id -> Outcome (JSON); dropped by the final step
    voxcast:prerender:<L>:counts     rendered, failed, ... and worker:<name> -> prompts it rendered
    voxcast:lock:library:<name>      the library job holding the library (one run at a time)
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.group import Group
from rq.job import Dependency, Job, JobStatus, Retry
from rq.serializers import JSONSerializer

from voxcast.errors import InvalidRequest, VoxcastError
from voxcast.serving.drain import WorkerShutdown
from voxcast.serving.rq.names import PRERENDER_CHUNK, PRERENDER_FINISH, cancel_key

if TYPE_CHECKING:
    from voxcast.prerender.library import PrerenderJob
    from voxcast.prerender.plan import PlanRecord
    from voxcast.prerender.render import Outcome, Work
    from voxcast.serving.rq.context import JobContext

__all__ = [
    "CHUNK_RETRIES",
    "LIBRARY_LOCK_PREFIX",
    "LibraryBusy",
    "LibraryLock",
    "chunk_job_id",
    "final_job_id",
    "finish_library",
    "library_progress",
    "plan_library",
    "render_chunk",
]

log = logging.getLogger(__name__)

LIBRARY_LOCK_PREFIX = "voxcast:lock:library:"
CHUNK_RETRIES = 2
"""RQ retries of a chunk (and of the final step) whose worker died or that failed: both are
idempotent (committed prompts are skipped), so retrying is always safe."""

_PENDING = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED)
_COMMIT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  for i = 3, #ARGV, 2 do redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1]) end
  return 1
end
return 0
"""


def _key(library_job: str, part: str) -> str:
    return f"voxcast:prerender:{library_job}:{part}"


def chunk_job_id(library_job: str, index: int) -> str:
    """Job id of chunk ``index`` of library job ``library_job``."""
    return f"{library_job}-c{index:05d}"


def final_job_id(library_job: str) -> str:
    """Job id of the final step of library job ``library_job``."""
    return f"{library_job}-final"


# -- the lock ------------------------------------------------------------------------------------------
class LibraryBusy(VoxcastError):
    """Another prerender job holds the library (two runs would race on its manifest)."""

    code = "library_busy"


class LibraryLock:
    """``voxcast:lock:library:<name>`` = the library job that holds it, for the whole run (plan,
    chunks, final step). A holder whose library job and final step have both ended or vanished (its
    worker died, Redis lost the jobs) is stale and is replaced; otherwise a second run fails with
    :class:`LibraryBusy`."""

    def __init__(self, client: redis.Redis, library: str, library_job: str, ttl_s: int) -> None:
        self.client, self.key, self.job_id, self.ttl_s = (
            client,
            LIBRARY_LOCK_PREFIX + library,
            library_job,
            ttl_s,
        )

    def acquire(self) -> None:
        """Raises LibraryBusy while another run holds the library."""
        for _ in range(5):
            if self.client.set(self.key, self.job_id, nx=True, ex=self.ttl_s):
                return
            raw = self.client.get(self.key)
            holder = raw.decode() if isinstance(raw, bytes) else raw
            if holder == self.job_id:  # this job again (retried)
                return
            if holder is not None and _run_pending(self.client, holder):
                raise LibraryBusy(f"library is being rendered by job {holder!r}", field="library")
            if holder is not None and self._replace(raw):
                log.warning("library lock %s: replaced the stale holder %s", self.key, holder)
                return
        raise LibraryBusy("library lock is contended; try again", field="library")

    def _replace(self, expected: Any) -> bool:
        with self.client.pipeline() as p:
            try:
                p.watch(self.key)
                if p.get(self.key) != expected:
                    return False
                p.multi()
                p.set(self.key, self.job_id, ex=self.ttl_s)
                p.execute()
                return True
            except redis.WatchError:
                return False

    def release(self) -> None:
        with contextlib.suppress(redis.RedisError):
            if self.client.get(self.key) == self.job_id.encode():
                self.client.delete(self.key)


def _run_pending(client: redis.Redis, library_job: str) -> bool:
    """The library job, or its final step, is still waiting or running."""
    for jid in (library_job, final_job_id(library_job)):
        try:
            if Job.fetch(jid, connection=client, serializer=JSONSerializer).get_status() in _PENDING:
                return True
        except (NoSuchJobError, ValueError):
            continue
    return False


# -- plan ----------------------------------------------------------------------------------------------
def plan_library(ctx: JobContext, job: Job, payload: Any) -> dict[str, Any]:
    """The library job: plan the run and enqueue its chunks and final step (see the module docstring).

    Raises:
        InvalidRequest: bad payload or unreadable manifest. LibraryBusy: another run holds the library.
    """
    from voxcast.prerender.library import PrerenderJob, read_manifest
    from voxcast.prerender.plan import chunk_work
    from voxcast.prerender.plan import plan_library as plan

    spec = PrerenderJob.from_payload(payload)
    manifest = read_manifest(ctx.service, spec)
    lock = LibraryLock(ctx.redis, spec.library, job.id, ctx.config.failure_ttl_s)
    lock.acquire()
    try:
        record, work = plan(ctx.service, spec, manifest)
        chunks = chunk_work(work, spec.chunk_prompts or _default_chunk())
        _save_plan(ctx, job.id, record, chunks)
        _enqueue(ctx, job, spec, chunks)
    except BaseException:
        lock.release()
        raise
    log.info(
        "library %s: %d prompts, %d skipped, %d to render in %d chunks (job %s)",
        spec.library, len(record.order), len(record.skipped), len(work), len(chunks), job.id,
    )  # fmt: skip
    return {
        "job_id": job.id,
        "library": spec.library,
        "status": "fanned_out",
        "total": record.total,
        "to_render": len(work),
        "chunks": len(chunks),
        "final_job_id": final_job_id(job.id),
    }


def _default_chunk() -> int:
    from voxcast.prerender.plan import DEFAULT_CHUNK_PROMPTS

    return DEFAULT_CHUNK_PROMPTS


def _save_plan(ctx: JobContext, library_job: str, record: PlanRecord, chunks: list[list[Work]]) -> None:
    ids = [[w.prompt.id for w in c] for c in chunks]
    ttl = ctx.config.failure_ttl_s
    with ctx.redis.pipeline() as p:
        p.hset(_key(library_job, "plan"), mapping={"record": record.to_json(), "chunks": json.dumps(ids)})
        p.delete(_key(library_job, "outcomes"), _key(library_job, "counts"))
        p.hset(_key(library_job, "counts"), "rendered", 0)
        for part in ("plan", "counts"):
            p.expire(_key(library_job, part), ttl)
        p.execute()


def _enqueue(ctx: JobContext, job: Job, spec: PrerenderJob, chunks: list[list[Work]]) -> None:
    cfg = ctx.config
    queue = Queue(job.origin, connection=ctx.redis, serializer=JSONSerializer)
    common = {
        "timeout": cfg.prerender_timeout_s,
        "result_ttl": cfg.result_ttl_s,
        "failure_ttl": cfg.failure_ttl_s,
        "retry": Retry(max=CHUNK_RETRIES),
    }
    base = spec.to_payload()
    datas = [
        Queue.prepare_data(
            PRERENDER_CHUNK,
            ({"library_job": job.id, "index": i, "spec": base, "prompts": [w.prompt.to_row() for w in c]},),
            job_id=chunk_job_id(job.id, i),
            description=f"prerender {spec.library} chunk {i + 1}/{len(chunks)}",
            **common,  # type: ignore[arg-type]
        )
        for i, c in enumerate(chunks)
    ]
    chunk_jobs = Group.create(ctx.redis, name=job.id).enqueue_many(queue, datas) if datas else []
    queue.enqueue(
        PRERENDER_FINISH,
        {"library_job": job.id, "spec": base},
        job_id=final_job_id(job.id),
        depends_on=Dependency(jobs=[j.id for j in chunk_jobs], allow_failure=True) if chunk_jobs else None,
        job_timeout=cfg.prerender_timeout_s,
        description=f"prerender {spec.library} manifest",
        **{k: v for k, v in common.items() if k != "timeout"},
    )


# -- chunks ------------------------------------------------------------------------------------------
def render_chunk(ctx: JobContext, job: Job, payload: Any) -> dict[str, Any]:
    """A chunk job: render its prompts with several in flight, committing each as it is stored.

    Raises:
        WorkerShutdown: the worker's drain deadline passed (RQ retries the chunk elsewhere).
    """
    from voxcast.prerender.library import PrerenderJob, in_flight_for, renderer_for
    from voxcast.prerender.manifest import prompt_from_row
    from voxcast.prerender.plan import work_for
    from voxcast.prerender.render import render_prompts

    if not isinstance(payload, Mapping) or not isinstance(payload.get("prompts"), list):
        raise InvalidRequest("a chunk payload is {library_job, index, spec, prompts}", field="payload")
    lib = str(payload["library_job"])
    spec = PrerenderJob.from_payload(payload["spec"])
    if ctx.redis.exists(cancel_key(lib)):
        return {"chunk": payload.get("index"), "rendered": 0, "status": "cancelled"}
    work = work_for(ctx.service, spec, [prompt_from_row(r) for r in payload["prompts"]])
    commit = _Committer(ctx.redis, lib, job.worker_name or "?")
    stop: list[str] = []

    def tick() -> bool:
        if stop:
            raise WorkerShutdown(stop[0])
        ctx.renew_lease()
        return bool(ctx.redis.exists(cancel_key(lib)))

    with ctx.track(stop.append):
        cancelled = render_prompts(
            renderer_for(ctx.service, spec),
            work,
            in_flight=in_flight_for(ctx.service, spec),
            commit=commit,
            tick=tick,
            done=commit.is_done,
        )
    return {
        "chunk": payload.get("index"),
        "rendered": commit.committed,
        "status": "cancelled" if cancelled else "finished",
        "worker": job.worker_name,
    }


class _Committer:
    """Commits outcomes once (HSETNX + counts in one Lua call); knows which prompts are committed."""

    def __init__(self, client: redis.Redis, library_job: str, worker: str) -> None:
        self.client, self.worker = client, worker
        self.outcomes, self.counts = _key(library_job, "outcomes"), _key(library_job, "counts")
        self.script = client.register_script(_COMMIT)
        self.committed = 0

    def is_done(self, prompt_id: str) -> bool:
        return bool(self.client.hexists(self.outcomes, prompt_id))

    def __call__(self, outcome: Outcome) -> None:
        incr: list[Any] = []
        for k, v in {**outcome.counts, f"worker:{self.worker}": 1}.items():
            incr += [k, v]
        args = [outcome.prompt_id, json.dumps(outcome.to_dict()), *incr]
        if self.script(keys=[self.outcomes, self.counts], args=args):
            self.committed += 1
        else:
            log.warning(
                "prompt %s: already committed by another attempt; this one is dropped", outcome.prompt_id
            )


# -- final step ----------------------------------------------------------------------------------------
def finish_library(ctx: JobContext, job: Job, payload: Any) -> dict[str, Any]:
    """The final step: write manifest.json from every committed outcome, free the lock, summarise."""
    from voxcast.prerender.library import PrerenderJob
    from voxcast.prerender.plan import PlanRecord, assemble
    from voxcast.prerender.render import Outcome

    lib = str(payload["library_job"])
    spec = PrerenderJob.from_payload(payload["spec"])
    raw = ctx.redis.hgetall(_key(lib, "plan"))
    if not raw:
        raise VoxcastError(f"the plan of library job {lib} is gone (expired or flushed)")
    record = PlanRecord.from_json(raw[b"record"])
    chunks: list[list[str]] = json.loads(raw[b"chunks"])
    outcomes = {
        _text(k): Outcome.from_dict(json.loads(v))
        for k, v in ctx.redis.hgetall(_key(lib, "outcomes")).items()
    }
    cancelled = bool(ctx.redis.exists(cancel_key(lib)))
    lost = {} if cancelled else _lost(ctx.redis, lib, chunks, outcomes)
    shares = {k[len("worker:") :]: v for k, v in _counts(ctx.redis, lib).items() if k.startswith("worker:")}
    summary = assemble(
        ctx.service.store,
        record,
        outcomes,
        lost=lost,
        status="cancelled" if cancelled else "finished",
        extra={"job_id": lib, "chunks": len(chunks), "workers": shares},
    )
    LibraryLock(ctx.redis, spec.library, lib, ctx.config.failure_ttl_s).release()
    with ctx.redis.pipeline() as p:
        p.delete(_key(lib, "outcomes"))
        for part in ("plan", "counts"):
            p.expire(_key(lib, part), ctx.config.result_ttl_s)
        p.execute()
    log.info(
        "library %s: %s, %d rendered, %d skipped, %d failed in %.1f s over %d workers",
        spec.library, summary["status"], summary["rendered"], summary["skipped"], summary["failed"],
        summary["elapsed_s"], len(shares),
    )  # fmt: skip
    return summary


def _lost(
    client: redis.Redis, lib: str, chunks: list[list[str]], outcomes: Mapping[str, Outcome]
) -> dict[str, str]:
    """Prompts of chunks that ended without committing them, with the reason."""
    lost: dict[str, str] = {}
    for i, ids in enumerate(chunks):
        missing = [pid for pid in ids if pid not in outcomes]
        if not missing:
            continue
        jid = chunk_job_id(lib, i)
        try:
            result = Job.fetch(jid, connection=client, serializer=JSONSerializer).latest_result()
            exc = (result.exc_string or "").strip().splitlines()[-1:] if result is not None else []
        except NoSuchJobError:
            exc = []
        why = f"chunk job {jid} failed: {exc[0] if exc else 'no result'}"
        lost.update(dict.fromkeys(missing, why))
    return lost


def _counts(client: redis.Redis, lib: str) -> dict[str, int]:
    return {_text(k): int(v) for k, v in client.hgetall(_key(lib, "counts")).items()}


def _text(k: bytes | str) -> str:
    return k.decode() if isinstance(k, bytes) else k


def library_progress(client: redis.Redis, library_job: str) -> dict[str, Any] | None:
    """Progress of a fanned-out library (None before it is planned): ``total``, ``done``, ``rendered``,
    ``skipped``, ``failed``, ``chunks``, ``elapsed_s``, ``workers`` (name -> prompts)."""
    import time

    raw = client.hget(_key(library_job, "plan"), "record")
    if raw is None:
        return None
    record = json.loads(raw)
    counts = _counts(client, library_job)
    shares = {k[len("worker:") :]: v for k, v in counts.items() if k.startswith("worker:")}
    plain = {k: v for k, v in counts.items() if not k.startswith("worker:")}
    failed = plain.pop("failed", 0) + len(record["row_errors"])
    return {
        "total": record["total"],
        "done": len(record["skipped"]) + len(record["row_errors"]) + sum(shares.values()),
        **plain,
        "skipped": len(record["skipped"]),
        "failed": failed,
        "elapsed_s": round(time.time() - record["started_ts"], 2),
        "workers": shares,
    }
