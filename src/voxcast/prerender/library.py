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
(still hitting the audio cache). The manifest is rewritten every :data:`MANIFEST_EVERY` prompts and at
the end, so a crashed job loses at most that much bookkeeping (the next run re-checks the objects).

Bad rows are reported (``errors``) and skipped; the other rows are rendered. One job per library at a
time (the RQ job takes a Redis lock): two concurrent runs would race on ``manifest.json``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from voxcast.audio.formats import NATIVE_SAMPLE_RATE
from voxcast.audio.pcm import int16_to_float
from voxcast.audio.stretch import METHOD as STRETCH_METHOD
from voxcast.errors import InvalidRequest, StorageError
from voxcast.prerender.gate import GateSettings, check_render
from voxcast.prerender.levels import Leveled, encode_leveled
from voxcast.prerender.manifest import NAME_RE, Manifest, Prompt, RowError, parse_manifest
from voxcast.prerender.presets import (
    DEFAULT_LOUDNESS_LUFS,
    DEFAULT_PRESETS,
    PRESETS,
    PostProcess,
    Preset,
    postprocess,
)
from voxcast.storage.base import BlobNotFound
from voxcast.storage.keys import canonical_json, sha256_hex, validate_key
from voxcast.watermark import mark

if TYPE_CHECKING:
    from voxcast.engine.request import SynthesisRequest
    from voxcast.service import Service

__all__ = ["MANIFEST_SCHEMA", "PrerenderJob", "library_prefix", "prerender"]

log = logging.getLogger(__name__)

MANIFEST_SCHEMA = 2
"""Version of the output manifest layout and of the render-hash recipe (2: loudness set and measured
per preset file, quality gate; libraries of schema 1 are rendered again)."""

MANIFEST_EVERY = 25
"""Rendered prompts between two intermediate manifest writes."""

_PAYLOAD_FIELDS = {
    "library", "manifest", "manifest_key", "manifest_format", "presets", "loudness_lufs",
    "peak_dbfs", "trim", "pad_ms", "defaults", "force", "gate", "highpass_hz",
}  # fmt: skip


def library_prefix(library: str) -> str:
    """``libraries/<library>/`` (validated)."""
    if not isinstance(library, str) or not NAME_RE.match(library):
        raise InvalidRequest(f"library name must match {NAME_RE.pattern}", field="library")
    return f"libraries/{library}/"


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
        )


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


def render_hash(
    model_identity: str, prompt: Prompt, post: PostProcess, gate: GateSettings, watermark: str | None = None
) -> str:
    """Identity of one prompt's rendering (see the module docstring); ``watermark``: the one put
    on the files, if any."""
    recipe: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "model": model_identity,
        "prompt": prompt.fields,
        "post": post.to_dict(),
        "gate": gate.to_dict(),
    }
    if watermark is not None:
        recipe["watermark"] = watermark
    if prompt.request.speed != 1.0:
        recipe["stretch"] = STRETCH_METHOD
    return sha256_hex(canonical_json(recipe))


def object_key(prefix: str, preset: Preset, prompt_id: str) -> str:
    return validate_key(f"{prefix}{preset.name}/{prompt_id}.{preset.extension}")


# -- the run ---------------------------------------------------------------------------------------
class _Run:
    """State of one prerender run."""

    def __init__(
        self,
        service: Service,
        spec: PrerenderJob,
        progress: Callable[[Mapping[str, Any]], None] | None,
        heartbeat: Callable[[], None] | None,
    ) -> None:
        self.service = service
        self.spec = spec
        self.store = service.store
        self.prefix = library_prefix(spec.library)
        self.manifest_key = validate_key(self.prefix + "manifest.json")
        self.model = str(service.engine.identity)
        #: The watermark put on every file after post-processing, if the service has one.
        self.watermark = service.watermarker.identity if service.watermarker is not None else None
        self.presets = [PRESETS[n] for n in spec.presets]
        self._progress = progress
        self._heartbeat = heartbeat or (lambda: None)
        self.t0 = time.perf_counter()
        self.previous = self._load_previous()
        self.existing = set(self.store.list_keys(self.prefix))
        self.entries: dict[str, Any] = {}
        self.errors: list[RowError] = []
        self.counts = {
            "rendered": 0, "skipped": 0, "failed": 0, "cache_hits": 0, "objects": 0,
            "rerenders": 0, "gate_failed": 0,
        }  # fmt: skip

    def _load_previous(self) -> dict[str, Any]:
        try:
            data = json.loads(self.store.get_bytes(self.manifest_key))
        except BlobNotFound:
            return {}
        except ValueError as e:
            log.warning("library %s: unreadable previous manifest ignored: %s", self.spec.library, e)
            return {}
        prompts = data.get("prompts") if isinstance(data, dict) else None
        return prompts if isinstance(prompts, dict) else {}

    def run(self, manifest: Manifest) -> dict[str, Any]:
        self.errors.extend(manifest.errors)
        self.counts["failed"] = len(manifest.errors)
        total = len(manifest.prompts) + len(manifest.errors)
        try:
            for i, prompt in enumerate(manifest.prompts):
                self._one(prompt)
                self._report(total, len(manifest.errors) + i + 1, prompt.id)
                if self.counts["rendered"] and self.counts["rendered"] % MANIFEST_EVERY == 0:
                    self._write_manifest(manifest)
        finally:
            self._write_manifest(manifest)
        return self._summary(manifest, total)

    def _one(self, prompt: Prompt) -> None:
        h = render_hash(self.model, prompt, self.spec.post, self.spec.gate, self.watermark)
        prev = self.previous.get(prompt.id)
        keys = {p.name: object_key(self.prefix, p, prompt.id) for p in self.presets}
        if not self.spec.force and self._done(prev, h, keys):
            self.entries[prompt.id] = prev
            self.counts["skipped"] += 1
            return
        try:
            self.entries[prompt.id] = self._render(prompt, h, keys)
            self.counts["rendered"] += 1
        except _GateFailed as e:
            self.errors.append(RowError(prompt.row, prompt.id, "quality", e.message))
            self.entries[prompt.id] = e.entry
            self.counts["failed"] += 1
            self.counts["gate_failed"] += 1
            log.warning(
                "library %s: prompt %s failed the quality gate: %s", self.spec.library, prompt.id, e.message
            )
        except InvalidRequest as e:
            self.errors.append(RowError(prompt.row, prompt.id, e.field or "row", e.message))
            self.counts["failed"] += 1
            log.info("library %s: prompt %s failed: %s", self.spec.library, prompt.id, e.message)

    def _done(self, prev: Any, h: str, keys: Mapping[str, str]) -> bool:
        """The previous run rendered this prompt identically and every requested object exists."""
        if not isinstance(prev, dict) or prev.get("render_hash") != h:
            return False
        return all(k in self.existing for k in keys.values()) and set(keys) <= set(prev.get("objects", {}))

    def _synthesize(self, request: SynthesisRequest) -> tuple[np.ndarray, Any]:
        # unmarked (the cache entry too): the files are marked after post-processing (_render)
        stream = self.service.synthesize(request, store=False, entry="prerender", watermark=False)
        parts = []
        try:
            for chunk in stream:
                parts.append(chunk.data)
                self._heartbeat()
        except BaseException:  # the heartbeat stopped the job (shutdown, lost lease): stop the engine too
            stream.cancel()
            raise
        pcm = int16_to_float(np.frombuffer(b"".join(parts), dtype="<i2"))
        return pcm, stream.result

    def _attempts(self, prompt: Prompt) -> list[SynthesisRequest]:
        """The request, then the same with the next seeds (a greedy row gets one attempt)."""
        req = prompt.request
        gate = self.spec.gate
        if not gate.enabled or req.sampling.greedy or req.sampling.seed is None:
            return [req]
        return [
            req.model_copy(
                update={"sampling": req.sampling.model_copy(update={"seed": (req.sampling.seed + i) % 2**63})}
            )
            for i in range(gate.max_attempts)
        ]

    def _render(self, prompt: Prompt, h: str, keys: Mapping[str, str]) -> dict[str, Any]:
        post, gate = self.spec.post, self.spec.gate
        tried: list[dict[str, Any]] = []
        for attempt, request in enumerate(self._attempts(prompt), start=1):
            if attempt > 1:
                self.counts["rerenders"] += 1
            pcm, result = self._synthesize(request)
            if len(pcm) == 0:
                raise InvalidRequest("the model produced no audio for this prompt", field="text")
            processed, facts = postprocess(pcm, post)
            if self.service.watermarker is not None:
                processed = mark(self.service.watermarker, processed, NATIVE_SAMPLE_RATE)
                facts["watermark"] = self.service.watermarker.name
            files = {
                p.name: encode_leveled(processed, p, post.loudness_lufs, post.peak_dbfs) for p in self.presets
            }
            finish = result.timing.finish_reason if result is not None else ""
            verdict = check_render(
                settings=gate,
                text=request.text,
                finish_reason=finish,
                model_pcm=pcm,
                stored_pcm=processed,
                sample_rate=NATIVE_SAMPLE_RATE,
                files=files,
                target_lufs=post.loudness_lufs,
                ceiling_dbtp=post.peak_dbfs,
                pad_ms=post.pad_ms if post.trim else None,
                speed=request.speed,
            )
            quality = {
                "gate": gate.enabled,
                "passed": verdict.passed,
                "attempt": attempt,
                "seed": request.sampling.seed,
                "checks": verdict.checks,
            }
            if verdict.passed or not gate.enabled:
                return self._store(prompt, request, h, keys, files, facts, quality, result)
            tried.append({"attempt": attempt, "seed": request.sampling.seed, "failed": verdict.failed})
            log.info(
                "library %s: prompt %s attempt %d failed: %s",
                self.spec.library,
                prompt.id,
                attempt,
                verdict.describe(),
            )
        entry = {
            **self._head(prompt),
            "render_hash": None,  # not done: the next run tries again
            "quality": {**quality, "tried": tried},
            "objects": {},
        }
        raise _GateFailed(
            f"failed the quality gate after {len(tried)} attempt(s): {verdict.describe()}", entry
        )

    def _head(self, prompt: Prompt, **used: Any) -> dict[str, Any]:
        """The start of a prompt's manifest entry: id, row, its fields (``used`` overriding), model."""
        return {"id": prompt.id, "row": prompt.row, **prompt.fields, **used, "model": self.model}

    def _store(
        self,
        prompt: Prompt,
        request: SynthesisRequest,
        h: str,
        keys: Mapping[str, str],
        files: Mapping[str, Leveled],
        facts: dict[str, Any],
        quality: dict[str, Any],
        result: Any,
    ) -> dict[str, Any]:
        objects = {}
        for preset in self.presets:
            data = files[preset.name].data
            meta = {
                "voxcast-kind": "prerender",
                "render-hash": h,
                "prompt-id": prompt.id,
                "preset": preset.name,
            }
            self.store.put_bytes(keys[preset.name], data, content_type=preset.content_type, metadata=meta)
            objects[preset.name] = {
                "key": keys[preset.name],
                "bytes": len(data),
                "sha256": sha256_hex(data),
                "content_type": preset.content_type,
                **preset.to_dict(),
                **files[preset.name].facts(),
            }
            self.counts["objects"] += 1
            self._heartbeat()
        cache_hit = bool(result is not None and result.timing.cache_hit)
        self.counts["cache_hits"] += int(cache_hit)
        return {
            **self._head(prompt, sampling=request.sampling.model_dump(mode="json")),
            "render_hash": h,
            **facts,
            "quality": quality,
            "cache_hit": cache_hit,
            "synthesis_ms": round(result.timing.total_ms, 1) if result is not None else None,
            "objects": objects,
            "rendered_at": _now(),
        }

    def _report(self, total: int, done: int, current: str) -> None:
        if self._progress is None:
            return
        elapsed = time.perf_counter() - self.t0
        self._progress(
            {"total": total, "done": done, "current": current, "elapsed_s": round(elapsed, 2), **self.counts}
        )

    def _write_manifest(self, manifest: Manifest) -> None:
        doc = {
            "schema": MANIFEST_SCHEMA,
            "library": self.spec.library,
            "model": self.model,
            "updated_at": _now(),
            "presets": {p.name: p.to_dict() for p in self.presets},
            "post": self.spec.post.to_dict(),
            "prompts": {p.id: self.entries[p.id] for p in manifest.prompts if p.id in self.entries},
            "errors": [e.to_dict() for e in self.errors],
        }
        body = json.dumps(doc, indent=1, sort_keys=False).encode()
        self.store.put_bytes(self.manifest_key, body, content_type="application/json")

    def _summary(self, manifest: Manifest, total: int) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.t0
        done = self.counts["rendered"] + self.counts["skipped"]
        current = {p.id for p in manifest.prompts}
        return {
            "library": self.spec.library,
            "manifest_key": self.manifest_key,
            "total": total,
            **self.counts,
            "errors": [e.to_dict() for e in self.errors],
            "orphans": sorted(set(self.previous) - current),
            "presets": list(self.spec.presets),
            "elapsed_s": round(elapsed, 3),
            "prompts_per_s": round(done / elapsed, 3) if elapsed > 0 else 0.0,
        }


class _GateFailed(Exception):
    """Every attempt of a prompt failed the quality gate; ``entry`` is its manifest record."""

    def __init__(self, message: str, entry: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.entry = entry


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def prerender(
    service: Service,
    spec: PrerenderJob,
    *,
    progress: Callable[[Mapping[str, Any]], None] | None = None,
    heartbeat: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Render ``spec``'s library (see the module docstring).

    Args:
        service: the loaded service (engine, store, cache).
        spec: the validated job.
        progress: called after every prompt with ``{total, done, rendered, skipped, failed, ...}``.
        heartbeat: called often while rendering (the RQ job renews its lease with it).

    Returns:
        The summary: counts, ``errors`` (row, id, field, message), ``orphans`` (ids of the previous
        manifest no longer listed; their objects are kept), ``manifest_key``, throughput.

    Raises:
        InvalidRequest: the manifest as a whole is unreadable. StorageError: the store failed.
    """
    text = spec.manifest
    if text is None:
        assert spec.manifest_key is not None
        try:
            text = service.store.get_bytes(validate_key(spec.manifest_key, field="manifest_key")).decode(
                "utf-8"
            )
        except (StorageError, UnicodeDecodeError) as e:
            raise InvalidRequest(
                f"cannot read manifest {spec.manifest_key!r}: {e}", field="manifest_key"
            ) from e
    fmt = spec.manifest_format or (spec.manifest_key if spec.manifest_key else None)
    manifest = parse_manifest(text, fmt, spec.defaults)
    run = _Run(service, spec, progress, heartbeat)
    summary = run.run(manifest)
    log.info(
        "library %s: %d rendered, %d skipped, %d failed in %.1f s",
        spec.library,
        summary["rendered"],
        summary["skipped"],
        summary["failed"],
        summary["elapsed_s"],
    )
    return summary
