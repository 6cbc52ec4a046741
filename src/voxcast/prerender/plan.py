"""Plan and assemble a library run: what needs rendering, in which chunks, and the one manifest.

A run is planned once (:func:`plan_library`: one read of the previous manifest, one listing of the
library prefix): a prompt whose previous entry has the same render hash and whose every requested
object exists is *skipped*; the others become :class:`~voxcast.prerender.render.Work`, cut into chunks
(:func:`chunk_work`) that any number of workers may render. What the plan decided is a JSON-able
:class:`PlanRecord`; once every chunk has ended, :func:`assemble` writes ``manifest.json`` from the
record, the outcomes of the rendered prompts and the previous entries of the skipped ones, and returns
the library's summary.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from voxcast.errors import StorageError
from voxcast.prerender.gate import GateSettings
from voxcast.prerender.identity import MANIFEST_SCHEMA, library_prefix, object_key, render_hash
from voxcast.prerender.manifest import Manifest, Prompt
from voxcast.prerender.presets import PRESETS, PostProcess, Preset
from voxcast.prerender.render import COUNTS, Outcome, Work
from voxcast.storage.base import BlobNotFound, BlobStore
from voxcast.storage.keys import validate_key

if TYPE_CHECKING:
    from voxcast.service import Service

__all__ = [
    "DEFAULT_CHUNK_CHARS",
    "DEFAULT_CHUNK_PROMPTS",
    "ManifestNotWritten",
    "PlanRecord",
    "assemble",
    "chunk_work",
    "load_previous",
    "plan_library",
    "work_for",
]


class PrerenderJob(Protocol):
    """What planning reads of a validated job (:class:`voxcast.prerender.library.PrerenderJob`)."""

    @property
    def library(self) -> str: ...

    @property
    def presets(self) -> tuple[str, ...]: ...

    @property
    def post(self) -> PostProcess: ...

    @property
    def gate(self) -> GateSettings: ...

    @property
    def force(self) -> bool: ...


log = logging.getLogger(__name__)

DEFAULT_CHUNK_PROMPTS = 32
"""Prompts per chunk job. A prompt takes seconds (GPU) to tens of seconds (2-core CPU, 0.6B), so a
chunk takes minutes at most, far from any job limit, and a library of N prompts spreads over up to
N / 32 workers."""

DEFAULT_CHUNK_CHARS = 4000
"""Characters of text per chunk (long prompts take longer): a chunk closes at either limit."""


class ManifestNotWritten(StorageError):
    """The store failed while the manifest was read back or written; ``summary`` is the library's
    summary all the same (what was rendered, ``manifest_written: false``). Its cause is the store's
    error."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary = summary


@dataclass
class PlanRecord:
    """What a run decided, JSON-able (the final step of a fanned-out run reads it back).

    Attributes:
        library: library name.
        manifest_key: key of ``manifest.json``.
        model: identity of the planning worker's model (the manifest's ``model``).
        presets: preset names.
        post: post-processing settings (``PostProcess.to_dict``).
        order: the valid prompts' ids, in manifest order.
        rows: prompt id -> row number.
        row_errors: the manifest's bad rows (``RowError.to_dict``).
        skipped: ids of prompts already done (their previous entries are kept).
        orphans: ids of the previous manifest no longer listed.
        total: rows of the manifest (valid and bad).
        started_ts: wall-clock start of the run (epoch seconds).
    """

    library: str
    manifest_key: str
    model: str
    presets: list[str]
    post: dict[str, Any]
    order: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    row_errors: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    total: int = 0
    started_ts: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> PlanRecord:
        return cls(**json.loads(text))


def load_previous(store: BlobStore, manifest_key: str, library: str) -> dict[str, Any]:
    """The previous manifest's prompt entries (``{}`` when there is none or it is unreadable)."""
    try:
        data = json.loads(store.get_bytes(manifest_key))
    except BlobNotFound:
        return {}
    except ValueError as e:
        log.warning("library %s: unreadable previous manifest ignored: %s", library, e)
        return {}
    prompts = data.get("prompts") if isinstance(data, dict) else None
    return prompts if isinstance(prompts, dict) else {}


def work_for(service: Service, spec: PrerenderJob, prompts: Iterable[Prompt]) -> list[Work]:
    """Each prompt with its render hash (this worker's model) and object keys."""
    prefix, model = library_prefix(spec.library), str(service.engine.identity)
    watermark = service.watermarker.identity if service.watermarker is not None else None
    presets = [PRESETS[n] for n in spec.presets]
    return [
        Work(
            p,
            render_hash(model, p, spec.post, spec.gate, watermark),
            {s.name: object_key(prefix, s, p.id) for s in presets},
        )
        for p in prompts
    ]


def plan_library(
    service: Service, spec: PrerenderJob, manifest: Manifest, *, store: BlobStore | None = None
) -> tuple[PlanRecord, list[Work]]:
    """Decide what to render (see the module docstring): the record and the work, in manifest order.

    ``store``: where the previous manifest and the library's objects are read (default: the
    service's; a queue job passes one that retries, :class:`~voxcast.storage.retry.RetryingStore`).

    Raises:
        StorageError: the store failed.
    """
    store = store if store is not None else service.store
    prefix = library_prefix(spec.library)
    manifest_key = validate_key(prefix + "manifest.json")
    previous = load_previous(store, manifest_key, spec.library)
    existing = set(store.list_keys(prefix))
    record = PlanRecord(
        library=spec.library,
        manifest_key=manifest_key,
        model=str(service.engine.identity),
        presets=list(spec.presets),
        post=spec.post.to_dict(),
        order=[p.id for p in manifest.prompts],
        rows={p.id: p.row for p in manifest.prompts},
        row_errors=[e.to_dict() for e in manifest.errors],
        orphans=sorted(set(previous) - {p.id for p in manifest.prompts}),
        total=len(manifest.prompts) + len(manifest.errors),
    )
    todo = []
    for w in work_for(service, spec, manifest.prompts):
        if not spec.force and _done(previous.get(w.prompt.id), w.render_hash, w.keys, existing):
            record.skipped.append(w.prompt.id)
        else:
            todo.append(w)
    return record, todo


def _done(prev: Any, h: str, keys: Mapping[str, str], existing: set[str]) -> bool:
    """The previous run rendered this prompt identically and every requested object exists."""
    if not isinstance(prev, dict) or prev.get("render_hash") != h:
        return False
    return all(k in existing for k in keys.values()) and set(keys) <= set(prev.get("objects", {}))


def chunk_work(
    work: list[Work], max_prompts: int = DEFAULT_CHUNK_PROMPTS, max_chars: int = DEFAULT_CHUNK_CHARS
) -> list[list[Work]]:
    """Cut ``work`` in order into chunks of at most ``max_prompts`` prompts and ``max_chars`` characters
    of text (a longer single prompt is a chunk of its own)."""
    chunks: list[list[Work]] = []
    chars = 0
    for w in work:
        n = len(w.prompt.request.text)
        if not chunks or len(chunks[-1]) >= max_prompts or (chunks[-1] and chars + n > max_chars):
            chunks.append([])
            chars = 0
        chunks[-1].append(w)
        chars += n
    return chunks


def assemble(
    store: BlobStore,
    record: PlanRecord,
    outcomes: Mapping[str, Outcome],
    *,
    lost: Mapping[str, str] | None = None,
    status: str = "finished",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``manifest.json`` and return the library's summary.

    Args:
        store: the blob store.
        record: the plan.
        outcomes: prompt id -> outcome, for the prompts rendered (or failed) in this run.
        lost: prompt id -> why it has no outcome (its chunk failed); each becomes an error. Prompts
            neither skipped, rendered nor lost (a cancelled run) are left out of the manifest.
        status: ``finished``, ``cancelled`` or ``storage_error``.
        extra: more summary fields (job ids, per-worker shares...).

    Returns:
        The summary: counts, ``errors``, ``orphans``, ``manifest_key``, ``manifest_written``,
        throughput, ``status``.

    Raises:
        ManifestNotWritten: the store failed; it carries the summary. A previous manifest that
        cannot be read is never replaced (its skipped prompts' entries would be lost).
    """
    failure: StorageError | None = None
    try:
        previous = load_previous(store, record.manifest_key, record.library) if record.skipped else {}
    except StorageError as e:
        previous, failure = {}, e
    entries, errors, counts = _collect(record, outcomes, previous, lost or {})
    if failure is None:
        try:
            _write_manifest(store, record, entries, errors)
        except StorageError as e:
            failure = e
    elapsed = max(0.0, time.time() - record.started_ts)
    done = counts["rendered"] + counts["skipped"]
    summary = {
        "library": record.library,
        "manifest_key": record.manifest_key,
        "manifest_written": failure is None,
        "status": status,
        "total": record.total,
        **counts,
        "not_rendered": len(record.order)
        - len(record.skipped)
        - sum(1 for p in record.order if p in outcomes)
        - len(lost or {}),
        "errors": errors,
        "orphans": record.orphans,
        "presets": record.presets,
        "elapsed_s": round(elapsed, 3),
        "prompts_per_s": round(done / elapsed, 3) if elapsed > 0 else 0.0,
        **(extra or {}),
    }
    if failure is not None:
        raise ManifestNotWritten(
            f"{record.manifest_key} not written: {failure.message}", summary
        ) from failure
    return summary


def _collect(
    record: PlanRecord, outcomes: Mapping[str, Outcome], previous: Mapping[str, Any], lost: Mapping[str, str]
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, int]]:
    """The manifest's entries and errors and the library's counts, in manifest order."""
    entries: dict[str, Any] = {}
    skipped = set(record.skipped)
    errors = list(record.row_errors)
    counts = dict.fromkeys(("skipped", *COUNTS), 0)
    counts["skipped"] = len(skipped)
    counts["failed"] = len(record.row_errors)
    for pid in record.order:
        if pid in skipped and isinstance(previous.get(pid), dict):
            entries[pid] = previous[pid]
        elif pid in outcomes:
            o = outcomes[pid]
            if o.entry is not None:
                entries[pid] = o.entry
            if o.error is not None:
                errors.append(o.error.to_dict())
            for k, v in o.counts.items():
                counts[k] = counts.get(k, 0) + v
        elif pid in lost:
            errors.append({"row": record.rows.get(pid, 0), "id": pid, "field": "chunk", "message": lost[pid]})
            counts["failed"] += 1
    return entries, errors, counts


def _write_manifest(
    store: BlobStore, record: PlanRecord, entries: Mapping[str, Any], errors: list[dict[str, Any]]
) -> None:
    presets: list[Preset] = [PRESETS[n] for n in record.presets]
    doc = {
        "schema": MANIFEST_SCHEMA,
        "library": record.library,
        "model": record.model,
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "presets": {p.name: p.to_dict() for p in presets},
        "post": record.post,
        "prompts": dict(entries),
        "errors": errors,
    }
    body = json.dumps(doc, indent=1, sort_keys=False).encode()
    store.put_bytes(record.manifest_key, body, content_type="application/json")
