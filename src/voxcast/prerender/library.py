"""Prerender an IVR prompt library: manifest -> one object per prompt and preset, plus a manifest.

Layout in the blob store (``<name>`` = library, ``<id>`` = prompt id)::

    libraries/<name>/<preset>/<id>.<ext>     one file per prompt and preset (see voxcast.prerender.presets)
    libraries/<name>/manifest.json           the output manifest (provenance of every object)

For each prompt: synthesize 24 kHz PCM through :meth:`Service.synthesize` with ``cache`` on and a
forced seed, so identical prompts (in this or any other library, by any worker) are rendered once and
then served from the rendered-audio cache; trim; with the service's watermark on
(``VOXCAST_WATERMARK``), mark the trimmed audio (the cache keeps it unmarked); encode each preset at the target loudness measured on
the encoded file (:mod:`~voxcast.prerender.levels`); check the render (:mod:`~voxcast.prerender.gate`:
a failing prompt is rendered again with the next seed, up to ``max_attempts``, then reported with its
failed checks and not stored); write (atomic puts). The manifest records, per prompt, the checks, the
attempt and seed used, and per file the loudness and true peak measured on it.

Re-runs: a prompt is skipped when the previous output manifest has the same *render hash* (SHA-256
of the model identity, the prompt's effective request incl. seed, the post-processing settings and
the watermark, if any)
and every requested preset object exists (one listing of the library prefix). Editing a row's text,
voice or sampling, or changing loudness/pad, re-renders that prompt; ``force`` re-renders everything
(still hitting the audio cache).

Bad rows are reported (``errors``) and skipped; the other rows are rendered. Several prompts are
rendered at once (``in_flight``, at most the engine's ``max_active``: :mod:`~voxcast.prerender.render`)
so the engine batches them; the files are the same as rendering one by one.

:func:`prerender` renders a whole library in this process (planning: :mod:`~voxcast.prerender.plan`).
On the queue a library is fanned out over every worker instead (chunk jobs and a final step that
writes the manifest: :mod:`voxcast.serving.rq.library`), one run per library at a time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from voxcast.errors import InvalidRequest
from voxcast.prerender.gate import GateSettings
from voxcast.prerender.identity import MANIFEST_SCHEMA, library_prefix, object_key, render_hash
from voxcast.prerender.manifest import Manifest, parse_manifest
from voxcast.prerender.plan import assemble, plan_library
from voxcast.prerender.presets import (
    DEFAULT_LOUDNESS_LUFS,
    DEFAULT_PRESETS,
    PRESETS,
    PostProcess,
)
from voxcast.prerender.render import COUNTS, Outcome, PromptRenderer, render_prompts
from voxcast.storage.base import BlobNotFound, BlobStore
from voxcast.storage.keys import validate_key

if TYPE_CHECKING:
    from voxcast.service import Service
    from voxcast.storage.retry import RetryPolicy

__all__ = [
    "MANIFEST_SCHEMA",
    "PrerenderJob",
    "in_flight_for",
    "library_prefix",
    "object_key",
    "prerender",
    "read_manifest",
    "render_hash",
    "renderer_for",
]

log = logging.getLogger(__name__)

MANIFEST_EVERY = 25
"""Rendered prompts between two intermediate manifest writes of an in-process run (:func:`prerender`;
a fanned-out run commits every prompt to Redis as it is stored and writes the manifest once)."""

_PAYLOAD_FIELDS = {
    "library", "manifest", "manifest_key", "manifest_format", "presets", "loudness_lufs",
    "peak_dbfs", "trim", "pad_ms", "defaults", "force", "gate", "highpass_hz", "in_flight",
    "chunk_prompts",
}  # fmt: skip

MAX_IN_FLIGHT = 64
"""Upper bound of a job's ``in_flight`` (the engine's ``max_active`` bounds it again)."""


@dataclass(frozen=True)
class PrerenderJob:
    """A validated prerender request.

    Attributes:
        library: library name.
        manifest: manifest text (or None when ``manifest_key`` names a stored manifest).
        manifest_key: blob-store key of the manifest.
        manifest_format: csv/json/yaml (or a file name); None = sniffed.
        presets: preset names.
        post: trim/loudness settings.
        defaults: fields applied to rows that do not set them.
        force: re-render prompts even when done.
        gate: the quality gate (:mod:`voxcast.prerender.gate`).
        in_flight: prompts rendered at once by one worker (None: the engine's ``max_active``; never
            more than it). Not part of any render hash: the files are the same either way.
        chunk_prompts: prompts per chunk job when a queue fans the library out (None: the default,
            :data:`~voxcast.prerender.plan.DEFAULT_CHUNK_PROMPTS`).
    """

    library: str
    manifest: str | None = None
    manifest_key: str | None = None
    manifest_format: str | None = None
    presets: tuple[str, ...] = DEFAULT_PRESETS
    post: PostProcess = field(default_factory=PostProcess)
    defaults: dict[str, Any] = field(default_factory=dict)
    force: bool = False
    gate: GateSettings = field(default_factory=GateSettings)
    in_flight: int | None = None
    chunk_prompts: int | None = None

    @classmethod
    def from_payload(cls, payload: Any) -> PrerenderJob:
        """Validate a job payload.

        Raises:
            InvalidRequest: naming the field at fault.
        """
        if not isinstance(payload, Mapping):
            raise InvalidRequest("payload must be a JSON object", field="payload")
        unknown = sorted(set(payload) - _PAYLOAD_FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown field {unknown[0]!r}", field=unknown[0])
        library_prefix(payload.get("library", ""))
        if (payload.get("manifest") is None) == (payload.get("manifest_key") is None):
            raise InvalidRequest("give exactly one of manifest and manifest_key", field="manifest")
        presets = _presets(payload.get("presets"))
        defaults = payload.get("defaults") or {}
        if not isinstance(defaults, Mapping):
            raise InvalidRequest("defaults must be an object", field="defaults")
        return cls(
            library=payload["library"],
            manifest=_opt_str(payload, "manifest"),
            manifest_key=_opt_str(payload, "manifest_key"),
            manifest_format=_opt_str(payload, "manifest_format"),
            presets=presets,
            post=_post(payload),
            defaults=dict(defaults),
            force=bool(payload.get("force", False)),
            gate=GateSettings.from_payload(payload.get("gate")),
            in_flight=_count(payload, "in_flight", MAX_IN_FLIGHT),
            chunk_prompts=_count(payload, "chunk_prompts", 10_000),
        )

    def to_payload(self) -> dict[str, Any]:
        """The payload of this job with an empty manifest (a chunk carries its own prompts)."""
        return {
            "library": self.library,
            "manifest": "",
            "presets": list(self.presets),
            **{k: v for k, v in self.post.to_dict().items() if k in _POST_FIELDS},
            "defaults": self.defaults,
            "force": self.force,
            "gate": self.gate.to_dict(),
            "in_flight": self.in_flight,
            "chunk_prompts": self.chunk_prompts,
        }


_POST_FIELDS = ("loudness_lufs", "peak_dbfs", "trim", "pad_ms", "highpass_hz")


def _count(payload: Mapping[str, Any], name: str, hi: int) -> int | None:
    v = payload.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
        raise InvalidRequest(f"{name} must be a whole number from 1 to {hi}", field=name)
    return v


def _opt_str(payload: Mapping[str, Any], name: str) -> str | None:
    v = payload.get(name)
    if v is not None and not isinstance(v, str):
        raise InvalidRequest(f"{name} must be a string", field=name)
    return v


def _presets(value: Any) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_PRESETS
    names = [p.strip() for p in value.split(",")] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not names:
        raise InvalidRequest("presets must be a non-empty list of names", field="presets")
    for n in names:
        if n not in PRESETS:
            raise InvalidRequest(f"unknown preset {n!r}; known: {sorted(PRESETS)}", field="presets")
    return tuple(dict.fromkeys(names))


def _setting(
    payload: Mapping[str, Any], name: str, default: float | None, nullable: bool = False
) -> float | None:
    v = payload.get(name, default)
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise InvalidRequest(f"{name} must be a number", field=name)
    try:
        out = float(v)
    except ValueError as e:
        raise InvalidRequest(f"{name} must be a number, not {v!r}", field=name) from e
    if not math.isfinite(out):
        raise InvalidRequest(f"{name} must be a finite number", field=name)
    return out


def _post(payload: Mapping[str, Any]) -> PostProcess:
    trim = payload.get("trim", True)
    if not isinstance(trim, bool):
        raise InvalidRequest("trim must be true or false", field="trim")
    post = PostProcess(
        loudness_lufs=_setting(payload, "loudness_lufs", DEFAULT_LOUDNESS_LUFS, nullable=True),
        peak_dbfs=float(_setting(payload, "peak_dbfs", PostProcess.peak_dbfs) or 0.0),
        trim=trim,
        pad_ms=float(_setting(payload, "pad_ms", PostProcess.pad_ms) or 0.0),
        highpass_hz=_setting(payload, "highpass_hz", PostProcess.highpass_hz, nullable=True),
    )
    if post.loudness_lufs is not None and not -70.0 < post.loudness_lufs < 0.0:
        raise InvalidRequest("loudness_lufs must be between -70 and 0", field="loudness_lufs")
    if not -20.0 <= post.peak_dbfs <= 0.0:
        raise InvalidRequest("peak_dbfs must be between -20 and 0", field="peak_dbfs")
    if not 0.0 <= post.pad_ms <= 5000.0:
        raise InvalidRequest("pad_ms must be between 0 and 5000", field="pad_ms")
    if post.highpass_hz is not None and not 10.0 <= post.highpass_hz <= 300.0:
        raise InvalidRequest("highpass_hz must be between 10 and 300 (or null: off)", field="highpass_hz")
    return post


def in_flight_for(service: Service, spec: PrerenderJob) -> int:
    """Prompts rendered at once: the job's ``in_flight``, else the engine's ``max_active``, never more
    than ``max_active`` (more would only wait in the engine's queue)."""
    config = getattr(service.engine, "config", None)
    max_active = max(1, int(getattr(config, "max_active", 1) or 1))
    return min(spec.in_flight or max_active, max_active)


def read_manifest(service: Service, spec: PrerenderJob, *, store: BlobStore | None = None) -> Manifest:
    """Parse the job's manifest (inline, or read from ``manifest_key`` in ``store``, by default the
    service's).

    Raises:
        InvalidRequest: the manifest as a whole is unreadable, or there is no such object.
        StorageError: the store failed (an outage is not the caller's fault).
    """
    text = spec.manifest
    if text is None:
        assert spec.manifest_key is not None
        store = store if store is not None else service.store
        try:
            text = store.get_bytes(validate_key(spec.manifest_key, field="manifest_key")).decode("utf-8")
        except (BlobNotFound, UnicodeDecodeError) as e:
            raise InvalidRequest(
                f"cannot read manifest {spec.manifest_key!r}: {e}", field="manifest_key"
            ) from e
    fmt = spec.manifest_format or (spec.manifest_key if spec.manifest_key else None)
    return parse_manifest(text, fmt, spec.defaults)


def renderer_for(service: Service, spec: PrerenderJob, retry: RetryPolicy | None = None) -> PromptRenderer:
    """The prompt renderer of ``spec`` on ``service``; ``retry``: how its failed puts are retried
    (None: they are not)."""
    return PromptRenderer(
        service=service,
        library=spec.library,
        presets=tuple(PRESETS[n] for n in spec.presets),
        post=spec.post,
        gate=spec.gate,
        model=str(service.engine.identity),
        retry=retry,
    )


def prerender(
    service: Service,
    spec: PrerenderJob,
    *,
    progress: Callable[[Mapping[str, Any]], None] | None = None,
    heartbeat: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Render ``spec``'s library in this process (see the module docstring); a queue spreads it over
    workers instead (:mod:`voxcast.serving.rq.library`).

    Args:
        service: the loaded service (engine, store, cache).
        spec: the validated job.
        progress: called after every prompt with ``{total, done, rendered, skipped, failed, ...}``.
        heartbeat: called about four times a second while rendering; it may raise to stop the run.

    Returns:
        The summary: counts, ``errors`` (row, id, field, message), ``orphans`` (ids of the previous
        manifest no longer listed; their objects are kept), ``manifest_key``, throughput.

    Raises:
        InvalidRequest: the manifest as a whole is unreadable. StorageError: the store failed.
    """
    record, work = plan_library(service, spec, read_manifest(service, spec))
    outcomes: dict[str, Outcome] = {}
    base = len(record.skipped) + len(record.row_errors)

    def commit(o: Outcome) -> None:
        outcomes[o.prompt_id] = o
        rendered = sum(x.counts.get("rendered", 0) for x in outcomes.values())
        if o.counts.get("rendered") and rendered % MANIFEST_EVERY == 0:
            assemble(service.store, record, outcomes)
        if progress is not None:
            counts = {k: sum(x.counts.get(k, 0) for x in outcomes.values()) for k in COUNTS}
            counts["failed"] += len(record.row_errors)
            progress(
                {
                    "total": record.total,
                    "done": base + len(outcomes),
                    "current": o.prompt_id,
                    "elapsed_s": round(time.time() - record.started_ts, 2),
                    "skipped": len(record.skipped),
                    **counts,
                }
            )

    def tick() -> bool:
        if heartbeat is not None:
            heartbeat()
        return False

    try:
        render_prompts(
            renderer_for(service, spec),
            work,
            in_flight=in_flight_for(service, spec),
            commit=commit,
            tick=tick,
        )
    finally:
        summary = assemble(service.store, record, outcomes)
    log.info(
        "library %s: %d rendered, %d skipped, %d failed in %.1f s",
        spec.library,
        summary["rendered"],
        summary["skipped"],
        summary["failed"],
        summary["elapsed_s"],
    )
    return summary
