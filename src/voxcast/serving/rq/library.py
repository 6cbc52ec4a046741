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

Store calls (the plan's reads, every file, the manifest) are retried with backoff for
``storage_retry_s`` (:mod:`voxcast.storage.retry`), so an outage of the object store shorter than
that is waited out. A chunk that gives up on the store marks the run (``storage_error`` in its plan
hash) and fails without RQ retries; later chunks render nothing while the store still fails; the final
step then fails with ``{"code": "storage_error", "message", "summary"}`` in its meta (what the client
shows), and a re-run renders the rest.

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
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.group import Group
from rq.job import Dependency, Job, JobStatus, Retry
from rq.serializers import JSONSerializer

from voxcast.errors import InvalidRequest, StorageError, VoxcastError
from voxcast.serving.drain import WorkerShutdown
from voxcast.serving.rq.names import PRERENDER_CHUNK, PRERENDER_FINISH, cancel_key
from voxcast.storage.retry import RetryingStore, RetryPolicy

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


# -- the store ---------------------------------------------------------------------------------------
def _retry_policy(ctx: JobContext) -> RetryPolicy:
    """Store calls of library jobs are retried for ``VOXCAST_STORAGE_RETRY_S`` (docs/queue.md, Faults)."""
    return RetryPolicy(window_s=ctx.config.storage_retry_s)


def _retrying_store(ctx: JobContext, stop: list[str]) -> RetryingStore:
    """The worker's store, each call retried while it fails (:mod:`voxcast.storage.retry`); while it
    waits, the job's lease is renewed, and the drain deadline (a reason in ``stop``) ends the wait
    with :class:`WorkerShutdown` (a chunk or the final step is then retried on another worker)."""

    def wait(seconds: float) -> bool:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if stop:
                raise WorkerShutdown(stop[0])
            ctx.renew_lease()
            time.sleep(min(0.25, left))
        return False

    return RetryingStore(ctx.service.store, _retry_policy(ctx), wait=wait)


def _fail_for_storage(job: Job, error: dict[str, Any]) -> None:
    """Record ``error`` as the job's structured error, without RQ retries: the retry window is spent
    (a retry at once would only spend another)."""
    job.retries_left = 0
    job.meta["error"] = error
    with contextlib.suppress(redis.RedisError):
        job.save_meta()


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
    stop: list[str] = []
    store = _retrying_store(ctx, stop)
    with ctx.track(stop.append):
        manifest = read_manifest(ctx.service, spec, store=store)
        lock = LibraryLock(ctx.redis, spec.library, job.id, ctx.config.failure_ttl_s)
        lock.acquire()
        try:
            record, work = plan(ctx.service, spec, manifest, store=store)
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
    if _store_still_down(ctx, lib, spec.library):
        return {"chunk": payload.get("index"), "rendered": 0, "status": "storage_error"}
    work = work_for(ctx.service, spec, [prompt_from_row(r) for r in payload["prompts"]])
    commit = _Committer(ctx.redis, lib, job.worker_name or "?")
    stop: list[str] = []

    def tick() -> bool:
        if stop:
            raise WorkerShutdown(stop[0])
        ctx.renew_lease()
        return bool(ctx.redis.exists(cancel_key(lib)))

    try:
        with ctx.track(stop.append):
            cancelled = render_prompts(
                renderer_for(ctx.service, spec, _retry_policy(ctx)),
                work,
                in_flight=in_flight_for(ctx.service, spec),
                commit=commit,
                tick=tick,
                done=commit.is_done,
            )
    except StorageError as e:  # failed for the whole retry window: the run is marked, see _store_still_down
        log.warning("library %s: chunk %s gave up on the store: %s", spec.library, job.id, e.message)
        with contextlib.suppress(redis.RedisError):
            ctx.redis.hset(_key(lib, "plan"), _STORAGE_FIELD, e.message)
        _fail_for_storage(job, e.to_dict())
        raise
    return {
        "chunk": payload.get("index"),
        "rendered": commit.committed,
        "status": "cancelled" if cancelled else "finished",
        "worker": job.worker_name,
    }


_STORAGE_FIELD = "storage_error"
"""Field of a run's plan hash: the store error a chunk gave up on (the run then ends ``storage_error``)."""


def _store_still_down(ctx: JobContext, lib: str, library: str) -> bool:
    """Whether an earlier chunk of this run gave up on the store and the store still fails (one call,
    not retried): then this chunk renders nothing (it would only wait out its own window and lose
    the audio); its prompts are left for the next run."""
    if not ctx.redis.hexists(_key(lib, "plan"), _STORAGE_FIELD):
        return False
    from voxcast.prerender.identity import library_prefix

    try:
        ctx.service.store.head(library_prefix(library) + "manifest.json")
    except StorageError as e:
        log.warning("library %s: the store still fails (%s); chunk not rendered", library, e.message)
        return True
    return False


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
    """The final step: write manifest.json from every committed outcome, free the lock, summarise.

    Its store calls are retried like the chunks'. The library ends ``storage_error`` when the
    manifest could not be written, or when a chunk gave up on the store (its prompts are then not
    rendered; the manifest of what was done is still written if the store answers): the job fails
    with the structured error ``{"code": "storage_error", "message", "summary"}`` (the summary as a
    finished library's, ``status: storage_error``), and a re-run renders the rest.

    Raises:
        StorageError: the library ended ``storage_error`` (above).
    """
    from voxcast.prerender.library import PrerenderJob
    from voxcast.prerender.plan import ManifestNotWritten, PlanRecord, assemble
    from voxcast.prerender.render import Outcome

    lib = str(payload["library_job"])
    spec = PrerenderJob.from_payload(payload["spec"])
    raw = ctx.redis.hgetall(_key(lib, "plan"))
    if not raw:
        raise VoxcastError(f"the plan of library job {lib} is gone (expired or flushed)")
    record = PlanRecord.from_json(raw[b"record"])
    chunks: list[list[str]] = json.loads(raw[b"chunks"])
    gave_up = _text(raw[_STORAGE_FIELD.encode()]) if _STORAGE_FIELD.encode() in raw else None
    outcomes = {
        _text(k): Outcome.from_dict(json.loads(v))
        for k, v in ctx.redis.hgetall(_key(lib, "outcomes")).items()
    }
    cancelled = bool(ctx.redis.exists(cancel_key(lib)))
    lost = {} if cancelled else _lost(ctx.redis, lib, chunks, outcomes)
    shares = {k[len("worker:") :]: v for k, v in _counts(ctx.redis, lib).items() if k.startswith("worker:")}
    status = "cancelled" if cancelled else "storage_error" if gave_up else "finished"
    stop: list[str] = []
    failure: ManifestNotWritten | None = None
    with ctx.track(stop.append):
        try:
            summary = assemble(
                _retrying_store(ctx, stop),
                record,
                outcomes,
                lost=lost,
                status=status,
                extra={"job_id": lib, "chunks": len(chunks), "workers": shares},
            )
        except ManifestNotWritten as e:
            failure, summary = e, {**e.summary, "status": "storage_error"}
    LibraryLock(ctx.redis, spec.library, lib, ctx.config.failure_ttl_s).release()
    with ctx.redis.pipeline() as p:
        p.delete(_key(lib, "outcomes"))
        for part in ("plan", "counts"):
            p.expire(_key(lib, part), ctx.config.result_ttl_s)
        p.execute()
    log.info(
        "library %s: %s, %d rendered, %d skipped, %d failed, %d not rendered in %.1f s over %d workers",
        spec.library, summary["status"], summary["rendered"], summary["skipped"], summary["failed"],
        summary["not_rendered"], summary["elapsed_s"], len(shares),
    )  # fmt: skip
    if failure is not None or gave_up is not None:
        message = _storage_message(summary, failure.message if failure is not None else gave_up)
        _fail_for_storage(job, {"code": StorageError.code, "message": message, "summary": summary})
        raise StorageError(message) from failure
    return summary


def _storage_message(summary: Mapping[str, Any], cause: str | None) -> str:
    done = "the manifest was written" if summary["manifest_written"] else "manifest.json was not written"
    return (
        f"the store failed for longer than the retry window: {cause}; {summary['rendered']} prompts "
        f"rendered, {summary['not_rendered']} not rendered, {done}; run the library again once the "
        "store answers"
    )


def _lost(
    client: redis.Redis, lib: str, chunks: list[list[str]], outcomes: Mapping[str, Outcome]
) -> dict[str, str]:
    """Prompts of chunks that ended without committing them, with the reason (not those of a chunk
    that ended for the store: they are not rendered, not failed)."""
    lost: dict[str, str] = {}
    for i, ids in enumerate(chunks):
        missing = [pid for pid in ids if pid not in outcomes]
        if not missing:
            continue
        jid = chunk_job_id(lib, i)
        try:
            chunk = Job.fetch(jid, connection=client, serializer=JSONSerializer)
            result = chunk.latest_result()
            exc = (result.exc_string or "").strip().splitlines()[-1:] if result is not None else []
        except NoSuchJobError:
            chunk, result, exc = None, None, []
        if chunk is not None and _ended_for_storage(chunk, result):
            continue
        why = f"chunk job {jid} failed: {exc[0] if exc else 'no result'}"
        lost.update(dict.fromkeys(missing, why))
    return lost


def _ended_for_storage(chunk: Job, result: Any) -> bool:
    """A chunk that gave up on the store, or that did not render because the store was still down."""
    error = chunk.meta.get("error")
    if isinstance(error, Mapping) and error.get("code") == StorageError.code:
        return True
    value = getattr(result, "return_value", None)
    return isinstance(value, Mapping) and value.get("status") == StorageError.code


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
