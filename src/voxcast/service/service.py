"""Bootstrap and request flow shared by every entry point: config -> engine -> store -> voices -> cache.

``Service.load(config)`` loads and warms the engine and opens the blob store, the voice registry and
the rendered-audio cache. ``service.synthesize(request)`` returns a lazy :class:`ServiceStream` of
:class:`EncodedChunk` (bytes in the requested format and rate); after iteration ``stream.result``
holds the :class:`SynthesisResult` (timing, blob key of the complete file). Adapters (CLI, RunPod,
RQ) only translate to and from this.

A deterministic request (seeded or greedy) whose rendering is in the cache is streamed from storage
without touching the model (``timing.cache_hit``); a miss renders and then fills the cache once the
stream has ended, so the first chunk is never delayed. Storage failures never fail a synthesis: they
are reported in ``result.cache_error``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from voxcast.audio.av_stream import unfinalize_flac
from voxcast.audio.encode import StreamEncoder, stream_to_file
from voxcast.audio.formats import AudioFormat, file_content_type, file_extension, stream_content_type
from voxcast.audio.stretch import TimeStretch
from voxcast.audio.wav import WavCodec, data_span, stream_header
from voxcast.audio.word_times import estimate_word_times, file_word_times
from voxcast.cache import AudioCache, CachedStream
from voxcast.engine.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.engine.request import SynthesisRequest, parse_open_request, parse_request
from voxcast.engine.stream import SynthesisStream
from voxcast.engine.text_feed import TextFeed, require_feed
from voxcast.engine.timing import Timing
from voxcast.envvars import env_bool, env_float, env_int
from voxcast.errors import InvalidRequest, StorageError, VoiceNotFound
from voxcast.metrics import Metrics, outcome
from voxcast.request_log import log_request
from voxcast.startup import Startup, process_start_unix
from voxcast.storage.base import BlobStore
from voxcast.storage.config import StorageConfig
from voxcast.storage.factory import open_store
from voxcast.storage.guard import GuardSettings, StoreGuard, StoreSkipped, StoreTimeout
from voxcast.storage.keys import is_voice_id, validate_key
from voxcast.text.normalize import normalize_text
from voxcast.voices import VoiceRegistry
from voxcast.voices.aliases import parse_aliases, parse_voice_name
from voxcast.voices.defaults import effective_aliases
from voxcast.voices.registry import VoiceLabel
from voxcast.watermark import check_watermark, load_watermarker, mark_file, watermark_from_env
from voxcast.watermark.perth import PerthWatermarker

__all__ = ["EncodedChunk", "Service", "ServiceConfig", "ServiceStream", "SynthesisResult"]

log = logging.getLogger(__name__)

CACHE_READ_CHUNK_BYTES = 32 * 1024
"""Chunk size when a cache hit is streamed from storage."""

#: Longest presigned URL lifetime S3 accepts (7 days).
MAX_URL_EXPIRES_S = 7 * 24 * 3600
#: How long ``Service.close`` waits for voices still being written to the store.
_CLOSE_WRITES_S = 30.0
_RAW_G711 = frozenset({AudioFormat.MULAW, AudioFormat.ALAW})
"""Formats streamed as raw bytes but stored as WAV files."""


@dataclass(frozen=True)
class ServiceConfig:
    """Everything a process needs to serve. Build with :meth:`from_env`.

    Attributes:
        engine: the engine configuration (``VOXCAST_MODEL``, ``VOXCAST_DEVICE``, ...).
        storage: the blob store configuration (``VOXCAST_S3_*``, ``VOXCAST_STORAGE_DIR``).
        store_audio: store every complete rendering (``VOXCAST_STORE_AUDIO``, on); the final message
            then carries its key instead of the audio.
        url_expires_s: lifetime of presigned URLs (``VOXCAST_URL_EXPIRES_S``, 3600; at most 604800,
            the 7 days S3 allows).
        store_guard: deadlines and circuit breaker of the store calls on a request's path
            (:mod:`voxcast.storage.guard`): ``VOXCAST_CACHE_LOOKUP_MS`` (100: then generation starts
            and the lookup counts as a miss), ``VOXCAST_STORE_WRITE_S`` (10: then the final message
            reports the write unconfirmed), ``VOXCAST_STORE_BREAKER_FAILURES`` (3 in a row open it),
            ``VOXCAST_STORE_BREAKER_COOLDOWN_S`` (30 s skipped, then one probe).
        watermark: the watermark on stored renders (``VOXCAST_WATERMARK``: ``off``, the default, or
            ``perth``; :mod:`voxcast.watermark`): the stored copy and a file returned whole are
            marked, live streams are not (a cache hit streams the stored, marked copy).
        watermark_model: the watermark's weights (``VOXCAST_WATERMARK_MODEL``; default: the installed
            resemble-perth package's).
        voice_aliases: names for voices (``VOXCAST_VOICE_ALIASES``, e.g. ``alloy=ryan,nova=vivian``;
            :mod:`voxcast.voices.aliases`), keys in lower case; they replace OpenAI's names below.
        openai_voices: OpenAI's voice names (``alloy``, ``nova``, ...) are aliases of the model's
            speakers out of the box (``VOXCAST_OPENAI_VOICES``, on; :mod:`voxcast.voices.defaults`).
        default_voice: the voice of a request that names none and brings no reference audio
            (``VOXCAST_DEFAULT_VOICE``: a speaker, alias or registered voice id; unset: ``alloy``'s
            speaker on a model with named speakers that clones no voices, else none).
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    store_audio: bool = True
    url_expires_s: int = 3600
    store_guard: GuardSettings = field(default_factory=GuardSettings)
    watermark: str = "off"
    watermark_model: str | None = None
    voice_aliases: Mapping[str, str] = field(default_factory=dict)
    openai_voices: bool = True
    default_voice: str | None = None

    def __post_init__(self) -> None:
        check_watermark(self.watermark)
        if not 1 <= self.url_expires_s <= MAX_URL_EXPIRES_S:
            raise ValueError(f"VOXCAST_URL_EXPIRES_S must be 1..{MAX_URL_EXPIRES_S} (S3 allows 7 days)")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ServiceConfig:
        watermark, watermark_model = watermark_from_env(env)
        return cls(
            engine=EngineConfig.from_env(env),
            storage=StorageConfig.from_env(env),
            store_audio=env_bool(env, "VOXCAST_STORE_AUDIO", True),
            url_expires_s=env_int(env, "VOXCAST_URL_EXPIRES_S", 3600, lo=1, hi=MAX_URL_EXPIRES_S),
            store_guard=GuardSettings(
                lookup_s=env_float(env, "VOXCAST_CACHE_LOOKUP_MS", 100.0, positive=True) / 1000,
                write_s=env_float(env, "VOXCAST_STORE_WRITE_S", 10.0, positive=True),
                failures=env_int(env, "VOXCAST_STORE_BREAKER_FAILURES", 3, positive=True),
                cooldown_s=env_float(env, "VOXCAST_STORE_BREAKER_COOLDOWN_S", 30.0, lo=0.0),
            ),
            watermark=watermark,
            watermark_model=watermark_model,
            voice_aliases=parse_aliases(env.get("VOXCAST_VOICE_ALIASES")),
            openai_voices=env_bool(env, "VOXCAST_OPENAI_VOICES", True),
            default_voice=parse_voice_name(env.get("VOXCAST_DEFAULT_VOICE"), "VOXCAST_DEFAULT_VOICE"),
        )


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """Audio bytes of one chunk in the response format.

    ``t_ms`` is the time since the request started (for the first chunk: time to first audio).
    """

    seq: int
    data: bytes
    format: AudioFormat
    sample_rate: int
    frames: int
    t_ms: float


@dataclass
class SynthesisResult:
    """What is known once a stream has ended."""

    request_id: str
    format: AudioFormat
    sample_rate: int
    content_type: str
    bytes: int
    duration_s: float
    timing: Timing
    audio_key: str | None = None
    audio_url: str | None = None
    voice_id: str | None = None
    cache_error: str | None = None
    #: With ``word_timestamps``: each word's :meth:`WordTime.to_dict
    #: <voxcast.audio.word_times.WordTime.to_dict>`, in ms from the audio's start (None when not
    #: asked for, or when the text was not spoken to its end: cancelled, cut at ``max_frames``).
    words: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = str(self.format)
        out["timing"] = self.timing.to_dict()
        if self.words is None:  # asked for only
            del out["words"]
        return out


def _wav_samples(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The sample bytes of a WAV file given as chunks (header and RIFF pad byte dropped)."""
    head = b""
    for data in chunks:
        head += data
        if len(head) >= 64:
            break
    offset, length = data_span(head)
    remaining = len(head) - offset if length is None else length
    first = head[offset : offset + remaining]
    remaining -= len(first)
    yield first
    for data in chunks:
        if length is not None:
            data = data[:remaining]
            remaining -= len(data)
        yield data


def _as_streamed(chunks: Iterator[bytes], fmt: AudioFormat, sample_rate: int) -> Iterator[bytes]:
    """A stored file's chunks turned into the bytes a live stream of the same audio sends: raw
    samples for G.711, the streaming header (sizes unknown) for WAV, "length unknown" for FLAC; the
    other formats are stored as streamed."""
    if fmt in _RAW_G711:
        return _wav_samples(chunks)
    if fmt == AudioFormat.WAV:
        return _head_rewritten(
            _wav_samples(chunks), 0, lambda head: stream_header(WavCodec.PCM16, sample_rate) + head
        )
    if fmt == AudioFormat.FLAC:
        return _head_rewritten(chunks, 26, unfinalize_flac)
    return chunks


def _head_rewritten(chunks: Iterator[bytes], size: int, rewrite: Callable[[bytes], bytes]) -> Iterator[bytes]:
    """``chunks`` with their first ``size`` bytes (at least one chunk) passed through ``rewrite``."""
    head = b""
    for data in chunks:
        head += data
        if len(head) >= size:
            break
    yield rewrite(head)
    yield from chunks


def _tee(chunks: Iterator[bytes], into: list[bytes]) -> Iterator[bytes]:
    """``chunks``, each also appended to ``into``."""
    for chunk in chunks:
        into.append(chunk)
        yield chunk


def _words(timing: Timing, estimate: Callable[[], list[Any]]) -> list[dict[str, Any]] | None:
    """The words' times ``estimate()`` gives, as dicts (None when the text was not spoken to its
    end, or the audio cannot be read back); the time it took is ``timing.extra["words_ms"]``."""
    if timing.finish_reason in ("cancelled", "max_frames") or timing.runaway:
        return None
    t0 = time.perf_counter()
    try:
        words = [w.to_dict() for w in estimate()]
    except ValueError as e:  # a cached file that does not decode
        log.warning("request %s: no word timestamps: %s", timing.request_id, e)
        return None
    timing.extra["words_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return words


def _close_late_hit(hit: CachedStream | None) -> None:
    """A cache lookup answered after its deadline: the request went on without it."""
    if hit is not None:
        hit.close()


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


class ServiceStream(Iterator[EncodedChunk]):
    """Lazy iterator of encoded chunks (from the engine or from the cache); see the module docstring."""

    def __init__(
        self,
        service: Service,
        request: SynthesisRequest,
        store: bool,
        entry: str = "python",
        feed: TextFeed | None = None,
        watermark: bool = True,
        keep_file: bool = False,
        realtime: bool | None = None,
        refusable: bool = False,
    ) -> None:
        self.request = request
        #: Played as it arrives (None: the request's ``stream``); refused when the engine is full.
        self.realtime = realtime
        self.refusable = refusable
        #: Text that arrives in pieces (:meth:`Service.open`), else None.
        self.feed = feed
        #: The entry point that opened it (metrics label): http, websocket, runpod, rq, cli, python.
        self.entry = entry
        self.request_id = request.request_id or uuid.uuid4().hex
        self.result: SynthesisResult | None = None
        #: ``time.perf_counter()`` when iteration started: every chunk's ``t_ms`` counts from here.
        self.t_start = 0.0
        self._service = service
        self._store = store
        #: Mark what is stored when the service has a watermark (off: the caller marks its own audio).
        self.watermark = watermark
        #: Keep the complete file in :attr:`file` (what is stored: marked where the watermark is on).
        self.keep_file = keep_file
        #: With ``keep_file``: after iteration, the complete file (None: cancelled, or it failed).
        self.file: bytes | None = None
        self._it: Iterator[EncodedChunk] | None = None
        self._engine_stream: SynthesisStream | None = None
        self._cancelled = False
        self._timing: Timing | None = None
        self._recorded = False

    def __iter__(self) -> ServiceStream:
        return self

    def __next__(self) -> EncodedChunk:
        if self._it is None:
            self._it = self._service._run(self)
        try:
            chunk = next(self._it)
        except StopIteration:
            self._ended(None)
            raise
        except BaseException as e:
            self._ended(e)
            raise
        self._service.metrics.chunk(chunk.frames)
        return chunk

    def _ended(self, error: BaseException | None) -> None:
        """Record the request in the metrics and the request log, once."""
        if self._recorded:
            return
        self._recorded = True
        try:  # bookkeeping never turns a served request into a failed one
            metrics = self._service.metrics
            metrics.request_ended(self.entry, self._timing, error)
            log_request(
                self.request_id,
                self.entry,
                metrics.model,
                self.request,
                self._timing,
                outcome(self._timing, error),
            )
        except Exception:
            log.exception("request %s: recording its metrics or log line failed", self.request_id)

    def push(self, delta: str | bytes) -> None:
        """Add text to a stream from :meth:`Service.open` (thread-safe; before or while iterating).

        Raises:
            InvalidRequest: not an open stream, its text is complete, or it grew too long ("text").
        """
        require_feed(self.feed).push(delta)

    def close_text(self) -> None:
        """The text of a stream from :meth:`Service.open` is complete (thread-safe, idempotent)."""
        require_feed(self.feed).close()

    def cancel(self) -> None:
        """Stop (thread-safe): the engine stops within one frame; a cache read stops at its next chunk."""
        self._cancelled = True
        if self._engine_stream is not None:
            self._engine_stream.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def ended(self) -> bool:
        """True once it can speak no more text: the engine ended or failed it, or iteration ended."""
        engine = self._engine_stream
        return self._recorded or (engine is not None and engine.done)


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

    def _resolve_voice(
        self, req: SynthesisRequest, timing: Timing
    ) -> tuple[Any, str, str | None, str | None]:
        """(voice prompt or None, the voice's cache-key part, registered voice id or None, the
        built-in speaker the engine speaks or None)."""
        t0 = time.perf_counter()
        try:
            name = req.voice
            if name is None and req.ref_audio is None:
                name = self.default_voice()
                if name is not None:
                    timing.extra["voice_default"] = name
            if name is not None:
                return self._named_voice(name, timing)
            audio = req.ref_audio_bytes()
            if audio is not None:
                if self.engine.cloning_refusal is not None:
                    raise InvalidRequest(self.engine.cloning_refusal, field="ref_audio")
                reg = self.voices.ensure(audio, ref_text=req.ref_text, x_vector_only=req.x_vector_only)
                timing.voice_cache_hit = reg.cache_hit
                if reg.storage_error is not None:  # the prompt is usable; only persisting it failed
                    timing.extra["voice_storage_error"] = str(reg.storage_error)
                return reg.prompt, reg.voice_id, reg.voice_id, None
            if self.engine.clones_voices and not self.engine.speakers:
                raise InvalidRequest(
                    f"voice: this {self.engine.model_type} model has no built-in speakers; give "
                    "ref_audio, or a registered voice id (POST /v1/audio/voices), or set "
                    "VOXCAST_DEFAULT_VOICE to one",
                    field="voice",
                )
            return None, "", None, None
        finally:
            timing.voice_ms = (time.perf_counter() - t0) * 1000

    def default_voice(self) -> str | None:
        """The voice of a request that names none (``config.default_voice``; unset: ``alloy``'s
        speaker on a model with named speakers that clones no voices, whose requests need one)."""
        if self.config.default_voice is not None:
            return self.config.default_voice
        if self.engine.speakers and not self.engine.clones_voices:
            return "alloy" if "alloy" in self.voice_aliases else self.engine.speakers[0]
        return None

    def _named_voice(self, given: str, timing: Timing) -> tuple[Any, str, str | None, str | None]:
        """:meth:`_resolve_voice` of a voice named by the request: an alias, a speaker or a voice id."""
        name = self.voice_aliases.get(given.lower(), given)
        if name != given:
            timing.extra["voice_alias"] = given
        if name.lower() in self.engine.speakers:
            return None, name.lower(), None, name.lower()
        alias = f" (an alias of {name!r})" if name != given else ""
        if not self.engine.clones_voices:
            raise VoiceNotFound(
                f"unknown speaker {given!r}{alias}; this model has {list(self.engine.speakers)}",
                field="voice",
            )
        try:
            prompt, lru_hit = self.voices.lookup(name)
        except VoiceNotFound as e:
            hint = ""
            if not self.engine.speakers and not alias and not is_voice_id(given):  # a name, not an id
                hint = (
                    "; this model has no built-in speakers: register a voice (POST /v1/audio/voices) "
                    f"and name it with VOXCAST_VOICE_ALIASES={given.lower()}=<voice id>"
                )
            raise VoiceNotFound(f"{e.message}{alias}{hint}", field="voice") from None
        timing.voice_cache_hit = lru_hit
        return prompt, name, name, None

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
        try:
            req = parse_request(request)
        except InvalidRequest as e:
            self.metrics.request_ended(entry, None, e)
            log_request("", entry, self.metrics.model, None, None, e.code)
            raise
        store = self.config.store_audio if store is None else store
        return ServiceStream(
            self,
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
        try:
            req, initial = parse_open_request(request)
        except InvalidRequest as e:
            self.metrics.request_ended(entry, None, e)
            log_request("", entry, self.metrics.model, None, None, e.code)
            raise
        store = self.config.store_audio if store is None else store
        return ServiceStream(self, req, store, entry, TextFeed(text=initial), refusable=refusable)

    def _run(self, s: ServiceStream) -> Iterator[EncodedChunk]:
        t0 = s.t_start = time.perf_counter()
        req = s.request
        timing = s._timing = Timing(request_id=s.request_id)
        startup = self.metrics.startup  # set once :meth:`load` is done
        if startup is not None and self._startup_told.acquire(blocking=False):  # the first request
            timing.extra["startup"] = startup.to_dict()
        voice, voice_key, voice_id, speaker = self._resolve_voice(req, timing)
        if speaker is not None and speaker != req.voice:  # an alias or the default: the engine speaks it
            req = s.request = req.model_copy(update={"voice": speaker})
        key = None
        if s.feed is None and req.cache and self.cache.cacheable(req):
            key = self.cache.key_for(
                req,
                model_identity=self.engine.identity,
                voice=voice_key or None,
                extra=self._render_settings(s.watermark),
            )
            hit = self._cache_open(key, timing)
            if hit is not None:
                yield from self._from_cache(s, key, hit, timing, t0, voice_id)
                return
        yield from self._from_engine(s, voice, key, timing, t0, voice_id)

    def _render_settings(self, watermark: bool) -> dict[str, Any] | None:
        """What besides the request changes a stored render: the model's stream settings and the
        watermark (the cache key's ``extra``)."""
        settings = dict(self.engine.render_settings or {})
        if watermark and self.watermarker is not None:
            settings["watermark"] = self.watermarker.identity
        return settings or None

    def _cache_open(self, key: str, timing: Timing) -> CachedStream | None:
        """The cached file, or None: a miss, or a store that failed, was too slow or is skipped (the
        outcome is ``timing.extra["cache_lookup"]``; generation never waits past the deadline)."""
        try:
            hit = self.store_guard.lookup(lambda: self.cache.open(key), on_late=_close_late_hit)
        except StorageError as e:
            outcome = (
                "skipped"
                if isinstance(e, StoreSkipped)
                else "timeout"
                if isinstance(e, StoreTimeout)
                else "error"
            )
            timing.extra["cache_lookup"] = outcome
            timing.extra["cache_lookup_error"] = str(e)
            if outcome != "skipped":
                log.warning("cache lookup %s for %s: %s", outcome, key, e)
            return None
        timing.extra["cache_lookup"] = "hit" if hit is not None else "miss"
        return hit

    def _from_cache(
        self, s: ServiceStream, key: str, hit: CachedStream, timing: Timing, t0: float, voice_id: str | None
    ) -> Iterator[EncodedChunk]:
        req = s.request
        seq, total = 0, 0
        kept: list[bytes] = []
        with hit:
            body = hit.iter_chunks(CACHE_READ_CHUNK_BYTES)
            if s.keep_file or req.word_timestamps:
                body = _tee(body, kept)
            body = _as_streamed(body, req.response_format, req.sample_rate)  # the bytes a live stream sends
            for data in body:
                if s.cancelled:
                    break
                if not data:
                    continue
                t_ms = (time.perf_counter() - t0) * 1000
                if seq == 0:
                    timing.ttfa_ms = t_ms
                total += len(data)
                yield EncodedChunk(seq, data, req.response_format, req.sample_rate, 0, t_ms)
                seq += 1
        meta = hit.audio.metadata
        if s.keep_file and not s.cancelled:
            s.file = b"".join(kept)
        if meta.get("watermark"):
            timing.extra["watermark"] = meta["watermark"]
        timing.cache_hit = True
        timing.chunks = seq
        timing.total_ms = (time.perf_counter() - t0) * 1000
        timing.finish_reason = "cancelled" if s.cancelled else "cache"
        duration_s = float(meta.get("duration_s", meta.get("audio_s", 0.0)) or 0.0)  # what was stored
        timing.audio_s = duration_s * s.request.speed  # the model's, as a request that rendered it reports
        if s.request.speed != 1.0:
            timing.extra["speed"] = s.request.speed
        timing.frames = int(meta.get("frames", 0) or 0)
        s.result = self._result(s, timing, total, duration_s, self.cache.blob_key(key), voice_id, None)
        if req.word_timestamps:
            file = b"".join(kept)
            s.result.words = _words(
                timing, lambda: file_word_times(req.text, file, req.response_format, req.sample_rate)
            )

    def _from_engine(
        self, s: ServiceStream, voice: Any, key: str | None, timing: Timing, t0: float, voice_id: str | None
    ) -> Iterator[EncodedChunk]:
        req = s.request
        encoder = StreamEncoder(req.response_format, req.sample_rate, self.engine.sample_rate)
        stretcher = TimeStretch(req.speed, self.engine.sample_rate) if req.speed != 1.0 else None
        flags: dict[str, Any] = {"realtime": s.realtime, "refusable": s.refusable}
        es = (
            self.engine.synthesize(req, voice, **flags)
            if s.feed is None
            else self.engine.open(req, voice, s.feed, **flags)
        )
        es.timing = timing
        es.t_origin = t0  # first audio and total count from the request's arrival, voice included
        s._engine_stream = es
        if s.cancelled:
            es.cancel()
        parts: list[bytes] = []
        persist = s._store or key is not None
        whole = persist or s.keep_file  # the complete file is needed
        marked: list[np.ndarray] | None = [] if whole and s.watermark and self.watermarker else None
        heard: list[np.ndarray] | None = [] if req.word_timestamps else None  # what the words are timed in
        seq = held = 0
        for chunk in es:
            pcm = chunk.pcm if stretcher is None else stretcher.process(chunk.pcm)
            if marked is not None:
                marked.append(pcm)
            if heard is not None:
                heard.append(pcm)
            data = encoder.encode(pcm)
            held += chunk.frames
            if not data:  # the encoder holds these samples (resampler or MP3 look-ahead): count them later
                continue
            parts.append(data)
            yield EncodedChunk(
                seq,
                data,
                req.response_format,
                req.sample_rate,
                held,
                (chunk.t_emit - t0) * 1000,
            )
            seq += 1
            held = 0
        # the stretcher's held-back end (not after a cancel: nobody wants the rest)
        rest = stretcher.finish() if stretcher is not None and not s.cancelled else None
        for kept in (marked, heard):
            if rest is not None and kept is not None:
                kept.append(rest)
        try:
            tail = (encoder.encode(rest) if rest is not None and len(rest) else b"") + encoder.finish()
        except ValueError:  # flac/opus of a stream that produced no audio (e.g. cancelled)
            tail = b""
        if tail:
            parts.append(tail)
            yield EncodedChunk(
                seq, tail, req.response_format, req.sample_rate, held, (time.perf_counter() - t0) * 1000
            )
        streamed = b"".join(parts)
        if s.feed is not None:  # the text as spoken, for the request log and the result
            s.request = req = req.model_copy(update={"text": normalize_text(s.feed.snapshot()[0])})
        audio_s = timing.audio_s
        if stretcher is not None:  # the audio delivered, not the model's
            timing.extra["speed"] = req.speed
            audio_s = round(timing.audio_s / req.speed, 4)
        audio_key, error = None, None
        if timing.finish_reason != "cancelled" and whole:
            whole_file, error = self._stored_file(streamed, encoder, marked, timing)
            s.file = whole_file if s.keep_file else None
            # a runaway is never cached, so a request that does not store (synth) keeps it nowhere
            if (s._store or (key is not None and not timing.runaway)) and whole_file is not None:
                audio_key, error = self._persist(s, key, whole_file, timing, audio_s)
        error = error or timing.extra.get("cache_lookup_error")
        s.result = self._result(s, timing, len(streamed), audio_s, audio_key, voice_id, error)
        if heard is not None:
            audio = np.concatenate(heard) if heard else np.zeros(0, np.float32)
            s.result.words = _words(
                timing, lambda: estimate_word_times(req.text, audio, self.engine.sample_rate)
            )

    def _stored_file(
        self, streamed: bytes, encoder: StreamEncoder, marked: list[np.ndarray] | None, timing: Timing
    ) -> tuple[bytes | None, str | None]:
        """``(file, None)``: the complete file to store, the stream's bytes or the watermarked audio
        encoded alike; ``(None, error)`` when marking failed (the audio already went out: the request
        stands, nothing is stored, the error is reported like a storage failure)."""
        fmt, rate = encoder.format, encoder.sample_rate
        if marked is None or self.watermarker is None or not any(len(p) for p in marked):
            return stream_to_file(fmt, rate, streamed, encoder.samples), None
        t0 = time.perf_counter()
        try:
            data = mark_file(self.watermarker, marked, self.engine.sample_rate, fmt, rate)
        except Exception as e:
            log.exception("marking the stored copy failed; nothing stored")
            return None, f"watermark failed, nothing stored: {e}"
        timing.extra["watermark"] = self.watermarker.name
        timing.extra["watermark_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        return data, None

    def _persist(
        self, s: ServiceStream, key: str | None, data: bytes, timing: Timing, audio_s: float
    ) -> tuple[str | None, str | None]:
        """Fill the cache (deterministic requests) or store the rendering (``audio_s`` long), within
        the store guard's write deadline; returns ``(key, None)`` or ``(None, error)``, never raises
        StorageError."""
        meta = {
            "duration_s": f"{audio_s:.3f}",
            "frames": str(timing.frames),
            "request_id": s.request_id,
        }
        if "watermark" in timing.extra:  # a cache hit reports it from here
            meta["watermark"] = str(timing.extra["watermark"])
        try:
            return self.store_guard.write(lambda: self._write(s, key, data, meta, timing)), None
        except StoreTimeout as e:
            log.warning("request %s: storing the audio is not confirmed: %s", s.request_id, e)
            return None, f"{e}; the write goes on in the background"
        except StorageError as e:
            if not isinstance(e, StoreSkipped):
                log.warning("request %s: storing the audio failed: %s", s.request_id, e)
            return None, str(e)

    def _write(
        self, s: ServiceStream, key: str | None, data: bytes, meta: dict[str, str], timing: Timing
    ) -> str:
        """Fill the cache or store the render; returns the object's key. Raises StorageError."""
        fmt = s.request.response_format
        content_type = file_content_type(fmt)
        if key is not None and not timing.runaway:
            self.cache.fill(key, data, meta, content_type=content_type)
            return self.cache.blob_key(key)
        # Create-once: a render is never replaced by another request's. A request id seen before
        # (a caller reusing one, a retried job) gets a key with a unique part instead.
        ext = file_extension(fmt)
        metadata = {k.replace("_", "-"): str(v) for k, v in meta.items()}
        for blob_key in (
            f"renders/{s.request_id}.{ext}",
            f"renders/{s.request_id}-{uuid.uuid4().hex[:12]}.{ext}",
        ):
            if self.store.put_bytes(
                validate_key(blob_key), data, content_type=content_type, metadata=metadata, if_none_match=True
            ):
                return blob_key
        raise StorageError(f"renders/{s.request_id}: no free key")  # two random keys taken: not expected

    def _result(
        self,
        s: ServiceStream,
        timing: Timing,
        nbytes: int,
        duration_s: float,
        audio_key: str | None,
        voice_id: str | None,
        error: str | None,
    ) -> SynthesisResult:
        req = s.request
        url = None
        if audio_key is not None:
            try:
                url = self.store.presigned_url(audio_key, self.config.url_expires_s)
            except StorageError as e:
                error = error or str(e)
        return SynthesisResult(
            request_id=s.request_id,
            format=req.response_format,
            sample_rate=req.sample_rate,
            content_type=stream_content_type(req.response_format, req.sample_rate),
            bytes=nbytes,
            duration_s=duration_s,
            timing=timing,
            audio_key=audio_key,
            audio_url=url,
            voice_id=voice_id,
            cache_error=error,
        )
