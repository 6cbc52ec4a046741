"""Render prompts of a library: one prompt -> checked, levelled, stored files and a manifest entry.

:class:`PromptRenderer` renders one prompt (synthesis with its seed, post-processing, watermark,
per-preset encoding at the target loudness, the quality gate with re-renders on the next seeds,
atomic puts) and returns an :class:`Outcome`. :func:`render_prompts` keeps several prompts in flight
at once, each on its own thread, so the engine's scheduler decodes them together in one batched step
(continuous batching); each prompt's audio depends only on its own request and seed, so the files are
the same as rendering the prompts one by one.

The calling thread never renders: it hands finished outcomes to ``commit`` and calls ``tick`` about
four times a second (an RQ job renews its lease and checks for cancellation there; a job timeout's
SIGALRM lands there too). Stopping (cancel, an exception) cancels the prompts in flight within one
engine frame; their files are not written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from voxcast.audio.formats import NATIVE_SAMPLE_RATE
from voxcast.audio.pcm import int16_to_float
from voxcast.errors import InvalidRequest
from voxcast.prerender.gate import GateSettings, check_render
from voxcast.prerender.levels import Leveled, encode_leveled
from voxcast.prerender.manifest import Prompt, RowError
from voxcast.prerender.presets import PostProcess, Preset, postprocess
from voxcast.storage.keys import sha256_hex
from voxcast.storage.retry import RetryPolicy, StoreGaveUp, retry_call
from voxcast.watermark import mark

if TYPE_CHECKING:
    from voxcast.engine.request import SynthesisRequest
    from voxcast.service import Service

__all__ = ["COUNTS", "Outcome", "PromptRenderer", "Work", "render_prompts"]

log = logging.getLogger(__name__)

COUNTS = ("rendered", "failed", "cache_hits", "objects", "rerenders", "gate_failed")
"""What an outcome adds to a library's counts (``skipped`` is decided before rendering)."""

_TICK_S = 0.25

_T = TypeVar("_T")


@dataclass
class Outcome:
    """What rendering one prompt produced.

    Attributes:
        prompt_id: the prompt.
        entry: its manifest entry (rendered, or the record of a quality-gate failure); None when the
            row failed before rendering (e.g. an unknown voice).
        error: the row error, if it failed.
        counts: its contribution to the library's counts (:data:`COUNTS`).
    """

    prompt_id: str
    entry: dict[str, Any] | None = None
    error: RowError | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.prompt_id,
            "entry": self.entry,
            "error": self.error.to_dict() if self.error is not None else None,
            "counts": self.counts,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        err = d.get("error")
        return cls(
            prompt_id=str(d["id"]),
            entry=d.get("entry"),
            error=RowError(err["row"], err.get("id"), err["field"], err["message"]) if err else None,
            counts={k: int(v) for k, v in (d.get("counts") or {}).items()},
        )


class _Stopped(Exception):
    """The render was stopped (cancel, shutdown, another prompt's failure) before it was stored."""


class _GateFailed(Exception):
    """Every attempt of a prompt failed the quality gate; ``entry`` is its manifest record."""

    def __init__(self, message: str, entry: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.entry = entry


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class PromptRenderer:
    """Renders one prompt of a library (thread-safe: holds no per-prompt state).

    Attributes:
        service: the loaded service (engine, store, cache, watermarker).
        library: library name (for log lines).
        presets: the presets to write.
        post: trim/loudness settings.
        gate: the quality gate.
        model: the engine's identity (recorded per entry).
        retry: how a store failure is retried (:mod:`voxcast.storage.retry`): a file's put, or the
            synthesis (a registered voice read, a cached render read); None: not. A render stopped
            while it waits for the store is not stored.
    """

    service: Service
    library: str
    presets: tuple[Preset, ...]
    post: PostProcess
    gate: GateSettings
    model: str
    retry: RetryPolicy | None = None

    def render(self, prompt: Prompt, h: str, keys: Mapping[str, str], stop: threading.Event) -> Outcome:
        """Render, check and store ``prompt`` (``h``: its render hash; ``keys``: preset -> key).

        Raises:
            _Stopped: ``stop`` was set while it rendered. StorageError: a write failed.
        """
        counts = dict.fromkeys(COUNTS, 0)
        try:
            entry = self._render(prompt, h, keys, stop, counts)
            counts["rendered"] = 1
            return Outcome(prompt.id, entry=entry, counts=counts)
        except _GateFailed as e:
            counts.update(failed=1, gate_failed=1)
            log.warning(
                "library %s: prompt %s failed the quality gate: %s", self.library, prompt.id, e.message
            )
            return Outcome(prompt.id, e.entry, RowError(prompt.row, prompt.id, "quality", e.message), counts)
        except InvalidRequest as e:
            counts["failed"] = 1
            log.info("library %s: prompt %s failed: %s", self.library, prompt.id, e.message)
            return Outcome(
                prompt.id, None, RowError(prompt.row, prompt.id, e.field or "row", e.message), counts
            )

    def _retried(self, fn: Callable[[], _T], what: str, stop: threading.Event) -> _T:
        """``fn()``, retried while the store fails, up to the window (:attr:`retry`). Raises _Stopped
        when ``stop`` was set while it waited, StorageError when the store failed for the window."""
        if self.retry is None:
            return fn()
        try:
            return retry_call(fn, self.retry, what=what, wait=stop.wait)
        except StoreGaveUp:
            if stop.is_set():
                raise _Stopped(what) from None
            raise

    def _synthesize(self, request: SynthesisRequest, stop: threading.Event) -> tuple[np.ndarray, Any]:
        """The prompt's audio; a store failure on the way (a registered voice not yet loaded, a
        cached render read) renders it again from the start once the store answers."""
        return self._retried(
            lambda: self._synthesize_once(request, stop), f"synthesize {request.request_id}", stop
        )

    def _synthesize_once(self, request: SynthesisRequest, stop: threading.Event) -> tuple[np.ndarray, Any]:
        # unmarked (the cache entry too): the files are marked after post-processing (_render)
        stream = self.service.synthesize(
            request, store=False, entry="prerender", watermark=False, realtime=False
        )
        parts = []
        try:
            for chunk in stream:
                parts.append(chunk.data)
                if stop.is_set():
                    raise _Stopped(request.request_id)
        except BaseException:
            stream.cancel()
            raise
        pcm = int16_to_float(np.frombuffer(b"".join(parts), dtype="<i2"))
        return pcm, stream.result

    def _attempts(self, prompt: Prompt) -> list[SynthesisRequest]:
        """The request, then the same with the next seeds (a greedy row gets one attempt)."""
        req = prompt.request
        if not self.gate.enabled or req.sampling.greedy or req.sampling.seed is None:
            return [req]
        return [
            req.model_copy(
                update={"sampling": req.sampling.model_copy(update={"seed": (req.sampling.seed + i) % 2**63})}
            )
            for i in range(self.gate.max_attempts)
        ]

    def _render(
        self,
        prompt: Prompt,
        h: str,
        keys: Mapping[str, str],
        stop: threading.Event,
        counts: dict[str, int],
    ) -> dict[str, Any]:
        post, gate = self.post, self.gate
        tried: list[dict[str, Any]] = []
        quality: dict[str, Any] = {}
        for attempt, request in enumerate(self._attempts(prompt), start=1):
            counts["rerenders"] += int(attempt > 1)
            pcm, result = self._synthesize(request, stop)
            if len(pcm) == 0:
                raise InvalidRequest("the model produced no audio for this prompt", field="text")
            processed, facts = postprocess(pcm, post)
            if self.service.watermarker is not None:
                processed = mark(self.service.watermarker, processed, NATIVE_SAMPLE_RATE)
                facts["watermark"] = self.service.watermarker.name
            files = {
                p.name: encode_leveled(processed, p, post.loudness_lufs, post.peak_dbfs) for p in self.presets
            }
            verdict = check_render(
                settings=gate,
                text=request.text,
                finish_reason=result.timing.finish_reason if result is not None else "",
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
                if stop.is_set():
                    raise _Stopped(prompt.id)
                return self._store(prompt, request, h, keys, files, facts, quality, result, counts, stop)
            tried.append({"attempt": attempt, "seed": request.sampling.seed, "failed": verdict.failed})
            log.info(
                "library %s: prompt %s attempt %d failed: %s",
                self.library,
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

    def _put(
        self, key: str, data: bytes, content_type: str, meta: dict[str, str], stop: threading.Event
    ) -> None:
        """Store one file (retried, see :meth:`_retried`)."""
        store = self.service.store
        self._retried(
            lambda: store.put_bytes(key, data, content_type=content_type, metadata=meta), f"put {key}", stop
        )

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
        counts: dict[str, int],
        stop: threading.Event,
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
            self._put(keys[preset.name], data, preset.content_type, meta, stop)
            objects[preset.name] = {
                "key": keys[preset.name],
                "bytes": len(data),
                "sha256": sha256_hex(data),
                "content_type": preset.content_type,
                **preset.to_dict(),
                **files[preset.name].facts(),
            }
            counts["objects"] += 1
        cache_hit = bool(result is not None and result.timing.cache_hit)
        counts["cache_hits"] += int(cache_hit)
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


@dataclass(frozen=True)
class Work:
    """One prompt to render: the prompt, its render hash and its object keys (preset -> key)."""

    prompt: Prompt
    render_hash: str
    keys: Mapping[str, str]


def render_prompts(
    renderer: PromptRenderer,
    work: Iterable[Work],
    *,
    in_flight: int,
    commit: Callable[[Outcome], None],
    tick: Callable[[], bool] = lambda: False,
    done: Callable[[str], bool] = lambda _: False,
) -> bool:
    """Render ``work`` with up to ``in_flight`` prompts at once (see the module docstring).

    Args:
        renderer: renders one prompt.
        work: the prompts, in order (taken lazily, as slots free up).
        in_flight: prompts rendered at the same time (>= 1).
        commit: called on the calling thread with each outcome, as prompts finish.
        tick: called on the calling thread about every 0.25 s and after each commit; True asks to
            stop (cancel). It may raise to stop too (shutdown, lost lease): the exception propagates.
        done: prompts for which it returns True are skipped (committed by an earlier attempt).

    Returns:
        True when it stopped early because ``tick`` asked to (cancelled), else False.

    Raises:
        Whatever a render raised (StorageError...) or ``tick`` raised, after stopping the others.
    """
    stop = threading.Event()
    pending = iter(work)
    running: set[Future[Outcome]] = set()
    with ThreadPoolExecutor(max_workers=max(1, in_flight), thread_name_prefix="prerender") as pool:
        try:
            while True:
                while len(running) < in_flight and not stop.is_set():
                    item = next(pending, None)
                    if item is None:
                        break
                    if not done(item.prompt.id):
                        running.add(
                            pool.submit(renderer.render, item.prompt, item.render_hash, item.keys, stop)
                        )
                if not running:
                    return stop.is_set()
                finished, running = wait(running, timeout=_TICK_S, return_when=FIRST_COMPLETED)
                for f in finished:
                    _commit(f, commit)
                if tick():
                    stop.set()
        except BaseException:
            stop.set()
            raise
        finally:
            stop.set()
            for f in wait(running).done:  # stopped within a frame: discard, unless it got stored
                if f.exception() is None:
                    commit(f.result())


def _commit(f: Future[Outcome], commit: Callable[[Outcome], None]) -> None:
    try:
        outcome = f.result()
    except _Stopped:
        return
    commit(outcome)
