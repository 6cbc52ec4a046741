"""``Service``: the process's loaded engine plus storage, and where every request starts.

:meth:`Service.load` opens the blob store and loads and warms the engine; :meth:`Service.assemble`
builds the voice registry and the rendered-audio cache around them (the request API is described in
:mod:`voxcast.service`). A request starts at its stream's first ``next()`` (:meth:`Service._run`):
its voice (:mod:`.voice_resolution`), then, for a cacheable request, the cache lookup and a hit
streamed from storage (:mod:`.cached`), else the engine's render, encoded as it streams and stored
once it has ended (:mod:`.rendered`). This module holds the lifecycle and that dispatch; each part of
the path lives beside it and takes what it uses as parameters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from voxcast.cache import AudioCache
from voxcast.engine.engine import Engine
from voxcast.engine.request import SynthesisRequest, parse_open_request, parse_request
from voxcast.engine.text_feed import TextFeed
from voxcast.engine.timing import Timing
from voxcast.errors import InvalidRequest, StorageError
from voxcast.metrics import Metrics
from voxcast.request_log import log_request
from voxcast.service.backends import Backends
from voxcast.service.cached import cache_key, from_cache, open_cached
from voxcast.service.config import ServiceConfig
from voxcast.service.rendered import from_engine
from voxcast.service.stream import EncodedChunk, ServiceStream
from voxcast.service.voice_resolution import check_task_type, default_voice, resolve_voice
from voxcast.startup import Startup, process_start_unix
from voxcast.storage.base import BlobStore
from voxcast.storage.factory import open_store
from voxcast.storage.guard import StoreGuard
from voxcast.storage.pending import PendingWrites
from voxcast.voices import VoiceRegistry
from voxcast.voices.defaults import effective_aliases
from voxcast.voices.registry import VoiceLabel
from voxcast.watermark import load_watermarker
from voxcast.watermark.perth import PerthWatermarker

_T = TypeVar("_T")

__all__ = ["Service"]

log = logging.getLogger(__name__)

#: How long ``Service.close`` waits for voices still being written to the store.
_CLOSE_WRITES_S = 30.0

#: How long ``Service.close`` gives the renders kept after a store failure (one more try each).
_CLOSE_PENDING_S = 10.0


def _startup(t_begin: float, engine: Engine) -> Startup:
    """The start of this process up to now (ready)."""
    from voxcast.kernels import native

    t0 = process_start_unix()
    return Startup(
        ready_ms=(time.time() - t0) * 1000,
        before_load_ms=max(0.0, t_begin - t0) * 1000,
        load_ms=engine.load_ms,
        warmup_ms=engine.warmup_ms,
        kernels_ms=native.last_load_s * 1000,
    )


class Service:
    """A loaded engine plus storage. Create with :meth:`load`."""

    def __init__(
        self,
        config: ServiceConfig,
        engine: Engine,
        store: BlobStore,
        voices: VoiceRegistry,
        cache: AudioCache,
        metrics: Metrics | None = None,
        watermarker: PerthWatermarker | None = None,
    ) -> None:
        self.config = config
        self._startup_told = threading.Lock()  # the first request reports the process's cold start
        self.metrics = metrics or Metrics()
        self.metrics.attach(engine, engine.identity)
        engine.on_phase = self._engine_phase
        self.engine = engine
        self.store = store
        self.voices = voices
        self.cache = cache
        self.store_guard = StoreGuard(config.store_guard, inline=not store.remote)
        #: Renders and cache fills the store failed, written once it answers again.
        self.pending_writes = PendingWrites(config.store_pending, on_written=self.store_guard.answered)
        #: Marks stored renders (``config.watermark``; loaded here unless given), or None.
        self.watermarker = watermarker or load_watermarker(config.watermark, config.watermark_model)
        #: Every alias this service answers (lower case): OpenAI's names for the model's speakers
        #: under the configured ones (:func:`voxcast.voices.defaults.effective_aliases`).
        self.voice_aliases = effective_aliases(config.voice_aliases, engine.speakers, config.openai_voices)

    @classmethod
    def load(cls, config: ServiceConfig, metrics: Metrics | None = None) -> Service:
        """Open the store, load and warm the engine (in that order: a bad store fails fast; a
        watermark without its weights fails before the model loads).

        ``metrics``: the process's metrics (made before loading, so they report the loading state).
        """
        t_begin = time.time()
        store = open_store(config.storage)
        watermarker = load_watermarker(config.watermark, config.watermark_model)  # fails fast
        metrics = metrics or Metrics()

        def warming() -> None:
            metrics.phase = "warming"

        engine = Engine.load(config.engine, on_warmup=warming)
        service = cls.assemble(config, engine, store, metrics, watermarker)
        metrics.startup = _startup(t_begin, service.engine)
        log.info("ready %.0f ms after the process started: %s", metrics.startup.ready_ms, metrics.startup)
        return service

    @classmethod
    def assemble(
        cls,
        config: ServiceConfig,
        engine: Engine,
        store: BlobStore,
        metrics: Metrics | None = None,
        watermarker: PerthWatermarker | None = None,
    ) -> Service:
        """Build the voice registry and the audio cache around a loaded engine and an open store."""
        metrics = metrics or Metrics()

        def build_voice(*args: Any, **kwargs: Any) -> Any:
            metrics.voice_builds.inc()
            return engine.create_voice(*args, prefix=False, **kwargs)

        voices: VoiceRegistry[Any] = VoiceRegistry(
            store,
            engine.identity,
            # A request that brings a new reference computes the prompt prefix in its one-pass prefill
            # (measured: building it with the voice added ~58 ms to the voice and saved ~30 of the
            # prefill); register_voice computes it ahead, for the voice's first request.
            build_voice,
            engine.load_voice,
            speakers=engine.speakers,
            max_cache_bytes=int(config.storage.voice_cache_mb * 1024 * 1024),
            recheck_s=config.storage.voice_recheck_s,
            persist_in_background=True,  # a new reference's first audio does not wait for the store
        )
        return cls(config, engine, store, voices, AudioCache(store), metrics, watermarker)

    def _engine_phase(self, phase: str) -> None:
        """The engine's idle unload and reload: report the phase; an unload drops the voice prompts."""
        if phase == "unloaded":
            self.voices.drop_cached()
        self.metrics.phase = phase

    def close(self) -> None:
        self.store_guard.close()
        self.engine.close()
        self.voices.close(timeout=_CLOSE_WRITES_S)  # voices still being written reach the store first
        self.pending_writes.close(_CLOSE_PENDING_S)
        self.store.close()

    # -- voices ---------------------------------------------------------------------------------
    def register_voice(
        self,
        audio: bytes,
        ref_text: str | None = None,
        x_vector_only: bool = False,
        label: VoiceLabel | None = None,
    ) -> str:
        """Register reference audio (+ transcript) and return its voice id (idempotent), with its
        prompt prefix computed (the first request of the voice finds it cached). ``label``: the
        voice's ``(name, consent id)``, kept in its metadata."""
        voice_id = self.voices.register(audio, ref_text=ref_text, x_vector_only=x_vector_only, label=label)
        self.engine.prime_voice(self.voices.get(voice_id))
        return voice_id

    def default_voice(self) -> str | None:
        """The voice of a request that names none (``config.default_voice``; unset: ``alloy``'s
        speaker on a model with named speakers that clones no voices, whose requests need one)."""
        return default_voice(self.config.default_voice, self.engine, self.voice_aliases)

    # -- synthesis ------------------------------------------------------------------------------
    def synthesize(
        self,
        request: Mapping[str, Any] | SynthesisRequest,
        *,
        store: bool | None = None,
        entry: str = "python",
        watermark: bool = True,
        keep_file: bool = False,
        realtime: bool | None = None,
        refusable: bool = False,
    ) -> ServiceStream:
        """Validate ``request`` and return a lazy stream of encoded chunks.

        Args:
            request: a request mapping (the shared schema) or a validated request.
            store: store the complete file (default: ``config.store_audio``).
            entry: the entry point, for the metrics (``http``, ``runpod``, ``rq``, ...).
            watermark: with the service's watermark on, mark the copy it stores (the cache's entry
                included); off, the stored copy and the cache entry are unmarked (a caller that
                post-processes the audio marks the result itself, as prerendering does).
            keep_file: keep the complete file in ``stream.file`` after iteration: the file that is
                (or would be) stored, so marked where the watermark is on (a render returned whole,
                e.g. a RunPod ``stream: false`` job or ``voxcast synth``).
            realtime: someone plays the audio as it arrives (default: the request's ``stream``);
                False: no deadline, it yields to new requests (:mod:`voxcast.engine.pacing`).
            refusable: raise :class:`~voxcast.errors.OverCapacity` from the first ``next()`` when
                the engine is over capacity (HTTP and WebSocket requests); else it waits for room.
                A cache hit is never refused.

        Raises:
            InvalidRequest: the request is malformed (model-dependent errors come from iteration).
        """
        req = self._parsed(parse_request, request, entry)
        store = self.config.store_audio if store is None else store
        return ServiceStream(
            self._run,
            self.metrics,
            req,
            store,
            entry,
            watermark=watermark,
            keep_file=keep_file,
            realtime=realtime,
            refusable=refusable,
        )

    def open(
        self,
        request: Mapping[str, Any] | SynthesisRequest,
        *,
        store: bool | None = None,
        entry: str = "python",
        refusable: bool = False,
    ) -> ServiceStream:
        """A lazy stream whose text arrives in pieces: ``push(delta)`` as it comes, ``close_text()``
        at its end (see :meth:`Engine.open <voxcast.engine.engine.Engine.open>`). ``request`` holds the
        voice and settings; its ``text`` is optional (the first piece). Never served from the audio
        cache (the text is not known up front); the render is stored like any other. ``refusable``:
        as for :meth:`synthesize`.

        Raises:
            InvalidRequest: bad settings (model-dependent errors come from iteration).
        """
        req, initial = self._parsed(parse_open_request, request, entry)
        store = self.config.store_audio if store is None else store
        return ServiceStream(
            self._run, self.metrics, req, store, entry, TextFeed(text=initial), refusable=refusable
        )

    def check_voice(self, request: SynthesisRequest) -> None:
        """Refuse now a voice that ``request`` would be refused for when it starts (an unknown
        speaker or voice id, none where the model needs one), e.g. when a WebSocket is configured
        before any text arrives. Reference audio is not checked here (it is registered as it starts).

        Raises:
            VoiceNotFound, InvalidRequest: as the request would (field ``voice``); a storage error
                is logged, not raised (the request reads the voice again when it starts).
        """
        check_task_type(request, self.engine)
        if request.ref_audio is not None:
            return
        try:
            resolve_voice(
                request,
                Timing(),
                engine=self.engine,
                voices=self.voices,
                aliases=self.voice_aliases,
                default=self.default_voice(),
                url_hosts=self.config.ref_audio_url_hosts,
            )
        except StorageError as e:  # the store is not answering now: the request tries again as it starts
            log.warning("voice %r not checked: %s", request.voice, e)

    def _parsed(self, parse: Callable[[Any], _T], request: Any, entry: str) -> _T:
        """``parse(request)``; a request it refuses is counted and logged as such, then raised."""
        try:
            return parse(request)
        except InvalidRequest as e:
            self.metrics.request_ended(entry, None, e)
            log_request("", entry, self.metrics.model, None, None, e.code)
            raise

    def _run(self, s: ServiceStream) -> Iterator[EncodedChunk]:
        """The chunks of ``s`` (its ``run``): from the cache when it has the request, else from the
        engine; the service's parts are read here, when the request starts."""
        timing = s.begin()
        t0, req = s.t_start, s.request
        startup = self.metrics.startup  # set once :meth:`load` is done
        if startup is not None and self._startup_told.acquire(blocking=False):  # the first request
            timing.extra["startup"] = startup.to_dict()
        voice, voice_key, voice_id, speaker = resolve_voice(
            req,
            timing,
            engine=self.engine,
            voices=self.voices,
            aliases=self.voice_aliases,
            default=self.default_voice(),
            url_hosts=self.config.ref_audio_url_hosts,
        )
        if speaker is not None and speaker != req.voice:  # an alias or the default: the engine speaks it
            req = s.request = req.model_copy(update={"voice": speaker})
        b = Backends(
            self.engine,
            self.store,
            self.cache,
            self.store_guard,
            self.watermarker,
            self.config.url_expires_s,
            self.pending_writes,
        )
        key = None
        if s.feed is None and req.cache and b.cache.cacheable(req):
            key = cache_key(b, req, voice_key, s.watermark)
            hit = open_cached(b, key, timing)
            if hit is not None:
                yield from from_cache(b, s, key, hit, timing, t0, voice_id)
                return
        yield from from_engine(b, s, voice, key, timing, t0, voice_id)
