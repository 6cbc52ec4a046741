"""Prometheus metrics with the same names in every process type (HTTP server, RQ worker, RunPod handler).

The service records every request at its end (:meth:`Metrics.request_ended`) and every chunk; the
engine's gauges (streams active and waiting, batched steps, load and warm-up time, state) are read at
scrape time, so nothing on the frame loop pays for them. Exposed at ``/metrics`` by the HTTP server
and on ``VOXCAST_METRICS_PORT`` by the RQ worker and the RunPod handler (:meth:`Metrics.serve`).

Metric names (all prefixed ``voxcast_``):

- ``requests_total{entry, model, outcome}``: outcome ``ok``, ``cache_hit``, ``cancelled``,
  ``runaway`` or an error code (``invalid_request``, ``voice_not_found``, ``storage_error``, ...);
- histograms ``time_to_first_audio_seconds``, ``request_seconds``, ``real_time_factor``,
  ``queue_wait_seconds``, ``stall_seconds`` (per request, ``{entry}``) and ``chunk_frames``;
- counters ``frames_generated_total``, ``audio_seconds_total``, ``audio_cache_lookups_total{result}``,
  ``voice_cache_lookups_total{result}``, ``voice_builds_total``, ``storage_errors_total``,
  ``websocket_invalid_utf8_total`` (connections closed with 1007 for a text frame not valid UTF-8);
- gauges ``streams_active``, ``streams_prefilling``, ``streams_waiting``, ``engine_state{state}``
  (1 for the current one of loading, warming, ready, failed, draining), ``load_seconds``,
  ``warmup_seconds``, ``startup_seconds{part}`` (``ready``: process start to ready; ``before_load``,
  ``load``, ``kernels``, ``warmup``); counters ``engine_steps_total`` and ``engine_step_rows_total``
  (their ratio is the mean batch size), ``engine_skipped_rows_total`` (rows that skipped a round for a
  new request's first chunk) and ``engine_refused_total`` (real-time requests refused over capacity;
  each also counts in ``requests_total{outcome="over_capacity"}``);
- ``http_refused_total{reason, status}``: HTTP requests and WebSocket handshakes the server refused
  before any route ran: ``api_key`` (401, a missing or wrong key), ``host`` (400, a ``Host`` not
  served), ``origin`` (403, a browser origin not allowed). They are not in ``requests_total``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from voxcast.startup import Startup

__all__ = ["CONTENT_TYPE", "STATES", "Metrics", "outcome"]

log = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
STATES = ("loading", "warming", "ready", "unloaded", "failed", "draining")

_SECONDS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
_LONG = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
_RTF = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0)
_FRAMES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


class _EngineCollector(Collector):
    """Gauges read from the engine (and the process state) when Prometheus scrapes."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        m = self.metrics
        state = GaugeMetricFamily(
            "voxcast_engine_state", "1 for the engine's current state", labels=["state"]
        )
        current = m.phase
        for s in STATES:
            state.add_metric([s], 1.0 if s == current else 0.0)
        yield state
        engine = m.engine
        if engine is None:
            return
        yield CounterMetricFamily(
            "voxcast_engine_loads", "model loads (1 + reloads after idle unloads)", value=engine.loads
        )
        yield CounterMetricFamily("voxcast_engine_unloads", "idle unloads", value=engine.unloads)
        stats = engine.stats()
        for name, key, text in (
            ("streams_active", "active", "streams generating frames"),
            ("streams_prefilling", "prefilling", "admitted streams still in their prefill"),
            ("streams_waiting", "waiting", "streams waiting for a batch slot"),
        ):
            yield GaugeMetricFamily(f"voxcast_{name}", text, value=stats[key])
        yield CounterMetricFamily("voxcast_engine_steps", "batched model steps", value=stats["steps"])
        yield CounterMetricFamily("voxcast_engine_step_rows", "rows in those steps", value=stats["step_rows"])
        yield CounterMetricFamily(
            "voxcast_engine_skipped_rows",
            "rows that skipped a round, ahead of playback, so a new request's first chunk came sooner",
            value=stats["skipped_rows"],
        )
        yield CounterMetricFamily(
            "voxcast_engine_refused",
            "real-time requests refused over capacity (admission control)",
            value=getattr(engine, "refused", 0),
        )
        yield GaugeMetricFamily("voxcast_load_seconds", "model load time", value=engine.load_ms / 1000)
        yield GaugeMetricFamily("voxcast_warmup_seconds", "warm-up time", value=engine.warmup_ms / 1000)
        if m.startup is not None:
            parts = GaugeMetricFamily(
                "voxcast_startup_seconds",
                "the process's cold start: ready (process start to ready) and its parts",
                labels=["part"],
            )
            for part, ms in m.startup.to_dict().items():
                parts.add_metric([part.removesuffix("_ms")], ms / 1000)
            yield parts


class Metrics:
    """One process's metrics, in a registry of its own (tests and several services do not collide).

    ``phase`` is the process's state (one of :data:`STATES`): ``loading`` until the service is
    assembled (``warming`` during the engine's warm-up), then ``ready``; the HTTP server also sets
    ``failed`` and ``draining``.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.engine: Any = None
        self.model = ""
        #: The process's cold start, once it is ready (``Service.load``); its first request reports it.
        self.startup: Startup | None = None
        self.phase = "loading"
        r = self.registry
        self.requests = Counter(
            "voxcast_requests",
            "requests by entry point, model and outcome",
            ["entry", "model", "outcome"],
            registry=r,
        )
        self.ttfa = Histogram(
            "voxcast_time_to_first_audio_seconds", "first audio", ["entry"], buckets=_SECONDS, registry=r
        )
        self.total = Histogram(
            "voxcast_request_seconds", "whole request", ["entry"], buckets=_LONG, registry=r
        )
        self.rtf = Histogram(
            "voxcast_real_time_factor", "total / audio seconds", ["entry"], buckets=_RTF, registry=r
        )
        self.queue_wait = Histogram(
            "voxcast_queue_wait_seconds",
            "wait for a batch slot (RQ: plus queue)",
            ["entry"],
            buckets=_SECONDS,
            registry=r,
        )
        self.stall = Histogram(
            "voxcast_stall_seconds", "playback stall per request", ["entry"], buckets=_SECONDS, registry=r
        )
        self.chunk_frames = Histogram("voxcast_chunk_frames", "frames per chunk", buckets=_FRAMES, registry=r)
        self.frames = Counter("voxcast_frames_generated", "frames generated", registry=r)
        self.audio = Counter("voxcast_audio_seconds", "audio seconds produced", registry=r)
        self.cache = Counter(
            "voxcast_audio_cache_lookups", "rendered-audio cache lookups", ["result"], registry=r
        )
        self.voice_cache = Counter(
            "voxcast_voice_cache_lookups", "voice cache lookups", ["result"], registry=r
        )
        self.voice_builds = Counter("voxcast_voice_builds", "voices built from reference audio", registry=r)
        self.storage_errors = Counter(
            "voxcast_storage_errors", "failed store calls on a request's path", registry=r
        )
        self.ws_invalid_utf8 = Counter(
            "voxcast_websocket_invalid_utf8",
            "WebSocket connections closed with 1007: a text frame that is not valid UTF-8",
            registry=r,
        )
        self.http_refused = Counter(
            "voxcast_http_refused",
            "HTTP requests and WebSocket handshakes refused before a route ran",
            ["reason", "status"],
            registry=r,
        )
        r.register(_EngineCollector(self))

    def attach(self, engine: Any, model: str) -> None:
        """The engine whose gauges are read at scrape time, and the ``model`` label; ``ready``."""
        self.engine, self.model = engine, model
        self.phase = "ready"

    # -- recording ---------------------------------------------------------------------------------
    def chunk(self, frames: int) -> None:
        if frames:
            self.chunk_frames.observe(frames)

    def request_ended(self, entry: str, timing: Any, error: BaseException | None) -> None:
        """Record one request's outcome and timing (``timing`` None when it failed before one existed)."""
        self.requests.labels(entry, self.model, outcome(timing, error)).inc()
        if timing is None or error is not None:  # a failed request's figures are not latencies
            return
        if timing.chunks:
            self.ttfa.labels(entry).observe(timing.ttfa_ms / 1000)
        self.total.labels(entry).observe(timing.total_ms / 1000)
        self.queue_wait.labels(entry).observe(timing.queue_wait_ms / 1000)
        self.stall.labels(entry).observe(timing.stall_ms / 1000)
        if timing.audio_s > 0:
            self.rtf.labels(entry).observe(timing.rtf)
        if not timing.cache_hit:
            self.frames.inc(timing.frames)
        self.audio.inc(timing.audio_s)
        lookup = timing.extra.get("cache_lookup")
        if lookup in ("hit", "miss"):
            self.cache.labels(lookup).inc()
        elif lookup in ("error", "timeout"):
            self.storage_errors.inc()
        if timing.voice_cache_hit is not None:
            self.voice_cache.labels("hit" if timing.voice_cache_hit else "miss").inc()
        if "voice_storage_error" in timing.extra:
            self.storage_errors.inc()

    # -- exposing ----------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The text format of every metric (what ``/metrics`` answers)."""
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "0.0.0.0") -> Any:
        """Answer ``/metrics`` on ``port`` from a thread of this process (RQ worker, RunPod handler)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on %s:%d/metrics", host, port)
        return server


def outcome(timing: Any, error: BaseException | None) -> str:
    """A request's outcome label: an error's code, or cancelled, runaway, cache_hit, ok."""
    if error is not None:
        return str(getattr(error, "code", "internal_error"))
    if timing is None:
        return "internal_error"
    if timing.finish_reason == "cancelled":
        return "cancelled"
    if timing.runaway:
        return "runaway"
    if timing.cache_hit:
        return "cache_hit"
    return "ok"
