"""Warm-up: every path of a freshly loaded model run once, and the decode-thread calibration.

Each path a real request can take runs once at load, so the first user pays no first-call costs
(allocator growth, kernel selection, lazy initialisation): greedy and sampled decoding, every voice
mode the model type supports, and the codec decoder at both the first and the later chunk size.
With ``decode_thread=auto`` warm-up then times a short concurrent workload with and without the
decode thread (or recalls that measurement, :mod:`.calibration_cache`) and keeps the faster.

These functions drive the engine only through :class:`Warmable` (its public calls), so this module
does not import :mod:`voxcast.engine.engine`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from voxcast.audio.reference import synthetic_reference_audio
from voxcast.engine import calibration_cache
from voxcast.engine.active import ramp_frames
from voxcast.engine.config import EngineConfig
from voxcast.engine.request import SynthesisRequest
from voxcast.engine.stream import SynthesisStream
from voxcast.engine.threads import on_fresh_thread
from voxcast.models.base import Capabilities, LoadOptions, TTSModel

__all__ = [
    "Warmable",
    "Warmed",
    "calibrate",
    "calibrate_or_recall",
    "calibration_requests",
    "warm",
    "warmup_requests",
]

log = logging.getLogger(__name__)


class Warmable(Protocol):
    """What warm-up uses of an engine (:class:`~voxcast.engine.engine.Engine`)."""

    config: EngineConfig
    options: LoadOptions | None

    @property
    def model(self) -> TTSModel: ...

    @property
    def identity(self) -> str: ...

    @property
    def sample_rate(self) -> int: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def synthesize(
        self, request: SynthesisRequest | dict[str, Any], voice: Any = None
    ) -> SynthesisStream: ...

    def use_decode_thread(self, threaded: bool) -> None: ...


WARMUP_TEXT = "Hello, this is a short warm-up sentence."
REFERENCE_TEXT = "This is a reference recording."


def warmup_requests(engine: Warmable) -> Iterator[tuple[SynthesisRequest, Any]]:
    """Yield (request, voice prompt or None) pairs covering the model's paths."""
    cfg = engine.config
    frames = ramp_frames(cfg.first_chunk_frames, cfg.chunk_frames)  # every chunk size the ramp uses
    base: dict[str, Any] = {"text": WARMUP_TEXT, "max_frames": frames, "request_id": "warmup"}
    # The ramp's chunk sizes need the whole ramp once (greedy); the sampled path, two frames (its
    # samplers in the talker and the code predictor run at every frame): about 1 s less on 0.6B int8.
    variants: list[dict[str, Any]] = [{"greedy": True}, {"seed": 0, "max_frames": min(2, frames)}]
    for case in engine.model.warmup_cases(synthetic_reference_audio(engine.sample_rate), REFERENCE_TEXT):
        for v in variants if case.sampled else variants[:1]:
            yield SynthesisRequest.model_validate({**base, **case.fields, **v}), case.voice


def calibration_requests(
    engine: Warmable, sample: tuple[SynthesisRequest, Any] | None = None
) -> list[tuple[SynthesisRequest, Any]]:
    """The concurrent workload that ``decode_thread=auto`` times: ``min(2, max_active)`` streams.

    Each is ``sample`` (default: the first warm-up request; warm-up passes the one it already built,
    so no voice prompt is computed twice) run through the chunk ramp and two more full-size chunks
    (with the defaults 1, 1, 1, 1, 2, 3, 4, 4, 4), so most of its audio is decoded where the decode
    thread would take it.
    """
    cfg = engine.config
    frames = ramp_frames(cfg.first_chunk_frames, cfg.chunk_frames) + 2 * cfg.chunk_frames
    request, voice = sample if sample is not None else next(iter(warmup_requests(engine)))
    n = min(2, cfg.max_active)
    return [
        (request.model_copy(update={"max_frames": frames, "request_id": f"calibrate-{i}"}), voice)
        for i in range(n)
    ]


@dataclass(frozen=True)
class Warmed:
    """What a warm-up took: ``ms`` in all, its ``parts`` in ms (``prepare``: recorded steps per batch
    size; ``requests``: the warm-up requests; ``prefixes``: the named speakers' prompt prefixes;
    ``calibration``), and the decode-thread ``calibration`` record (None: not ``auto``)."""

    ms: float
    parts: dict[str, float]
    calibration: dict[str, Any] | None


def warm(engine: Warmable) -> Warmed:
    """Run every request path once (greedy and sampled, each voice mode, both chunk sizes), fill the
    named speakers' prompt prefixes and, with ``decode_thread=auto``, settle the decode thread."""
    t0 = t = time.perf_counter()
    parts: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        parts[name] = round((now - t) * 1000, 1)
        t = now

    # e.g. the code predictor's recorded steps for every batch size
    on_fresh_thread(lambda: engine.model.prepare_batches(engine.config.max_active))
    lap("prepare")
    pairs = on_fresh_thread(lambda: list(warmup_requests(engine)))
    for request, voice in pairs:
        for _ in engine.synthesize(request, voice):
            pass
    lap("requests")
    # the named speakers' prompt prefixes, so no first request computes one
    on_fresh_thread(engine.model.fill_speaker_prefixes)
    lap("prefixes")
    calibration = None
    if engine.config.decode_thread == "auto":
        calibration = calibrate_or_recall(engine, pairs[0])
    lap("calibration")
    return Warmed((time.perf_counter() - t0) * 1000, parts, calibration)


def calibrate(
    engine: Warmable, rounds: int = 1, sample: tuple[SynthesisRequest, Any] | None = None
) -> dict[str, Any]:
    """Time the same concurrent workload with and without the decode thread; keep the faster.

    Overlapping audio decoding with generation pays only where the two do not fight over the same
    cores and memory bandwidth, which no core count predicts (on 2 CPU cores it measured 0.8-1.08x
    on one machine and 1.22-1.37x on another). So warm-up measures it: ``min(2, max_active)``
    streams of a warm-up request each, started together, run ``rounds`` times in each mode in the
    order off, on, on, off, ... (drift cancels); the thread stays on only if its total is at least
    5% shorter. A timing may decide this because both ways give the same audio. Costs ``2 * rounds`` such runs (0.6B, int8, 2 CPU cores: about 3.5 s each). Call it
    while no other request runs (warm-up does). ``sample``: the (request, voice) to run (default:
    the first warm-up request, built here). Returns the record (``off_ms``, ``on_ms``,
    ``decode_thread``: the choice).
    """
    requests = on_fresh_thread(lambda: calibration_requests(engine, sample))
    totals = {False: 0.0, True: 0.0}
    for i in range(2 * rounds):
        threaded = i % 4 in (1, 2)
        engine.use_decode_thread(threaded)
        t0 = time.perf_counter()
        streams = [engine.synthesize(r, v) for r, v in requests]
        for stream in streams:
            for _ in stream:
                pass
        totals[threaded] += time.perf_counter() - t0
    choice = totals[True] < 0.95 * totals[False]
    engine.use_decode_thread(choice)
    record = {
        "off_ms": totals[False] / rounds * 1000,
        "on_ms": totals[True] / rounds * 1000,
        "decode_thread": choice,
    }
    log.info(
        "decode thread %s: concurrent warm-up streams took %.0f ms with it, %.0f ms without",
        "on" if choice else "off",
        record["on_ms"],
        record["off_ms"],
    )
    return record


def calibrate_or_recall(engine: Warmable, sample: tuple[SynthesisRequest, Any]) -> dict[str, Any]:
    """``decode_thread=auto``: the choice measured before on this machine for this model and
    these settings (:mod:`voxcast.engine.calibration_cache`), else measure it and remember it."""
    # the model may know better (e.g. its first audio needs more frames than a calibration run has)
    hint = engine.capabilities.decode_thread_hint
    if hint is not None:
        engine.use_decode_thread(bool(hint))
        log.info("decode thread %s: the model's choice", "on" if hint else "off")
        return {"decode_thread": bool(hint), "model_hint": True}
    key = calibration_cache.calibration_key(engine.identity, engine.options, engine.config.max_active)
    cached = calibration_cache.load(key)
    if cached is not None:
        engine.use_decode_thread(bool(cached["decode_thread"]))
        log.info(
            "decode thread %s: as measured before on this machine (%s)",
            "on" if cached["decode_thread"] else "off",
            calibration_cache.cache_dir(),
        )
        return {**cached, "cached": True}
    record = calibrate(engine, sample=sample)
    calibration_cache.store(key, record)
    return record
