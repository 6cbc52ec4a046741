"""The engine: one loaded, warmed model owned by one scheduler thread, many concurrent streams.

``Engine.load(config)`` loads the checkpoint, warms every path a request can take
(:mod:`voxcast.engine.warmup`) and starts the scheduler (:mod:`voxcast.engine.scheduler`: admission,
prefill in parts, one batched frame step per round, chunks decoded and delivered).
``engine.synthesize(request)`` returns a lazy :class:`SynthesisStream`. The engine keeps the model's
lifecycle: it releases the weights after ``idle_unload_s`` without activity and loads and warms them
again for the next request.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from voxcast.audio.reference import load_reference_audio
from voxcast.engine.config import EngineConfig
from voxcast.engine.model_info import ModelInfo
from voxcast.engine.pacing import over_capacity
from voxcast.engine.precision import Precision, log_fallbacks, native_bfloat16, resolve_precision
from voxcast.engine.request import SynthesisRequest, parse_open_request, parse_request
from voxcast.engine.runtime_info import runtime_choices
from voxcast.engine.scheduler import Scheduler
from voxcast.engine.stream import SynthesisStream
from voxcast.engine.text_feed import TextFeed
from voxcast.engine.threads import on_fresh_thread
from voxcast.engine.warmup import calibrate, warm
from voxcast.errors import EngineUnavailable, InvalidRequest, OverCapacity
from voxcast.memory import rss_mb, trim_heap
from voxcast.models.base import Capabilities, LoadOptions, TTSModel
from voxcast.models.registry import load_model

__all__ = ["Engine"]

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _close_at_exit(ref: weakref.ref[Engine]) -> None:
    """``Engine.close`` of a still-living engine at interpreter exit.

    The scheduler and decode threads are daemon threads. At exit Python ends a daemon thread that
    takes the GIL back by unwinding its stack; a torch operation releases the GIL in C++ and takes it
    back in a destructor that must not throw, so a thread inside one aborts the whole process (exit
    status 134, seen whenever a script or worker ended while a stream was generating). ``atexit``
    hooks run before that.
    """
    engine = ref()
    if engine is not None:
        engine.close()


class Engine:
    """A warmed model plus its scheduler thread. Thread-safe: call ``synthesize`` from anywhere."""

    def __init__(
        self,
        model: TTSModel,
        config: EngineConfig,
        *,
        load_ms: float = 0.0,
        options: LoadOptions | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._model: TTSModel | None = model
        self.config = config
        #: How the model was loaded (to load it again after an idle unload).
        self.options = options
        #: The checkpoint's constants, kept while the weights are unloaded.
        self._info = ModelInfo.of(model)
        #: Idle unload (``config.idle_unload_s``): the lock under which the model is (re)loaded and
        #: released, the calls using it off the scheduler thread, and hooks.
        self._load_lock = threading.RLock()
        self._users_lock = threading.Lock()  # guards ``model`` going away, ``_users`` and queueing
        self._users = 0
        self.loads = 1
        self.unloads = 0
        #: RSS before/after the last unload (MB), and what the last reload took.
        self.last_unload: dict[str, float] | None = None
        self.on_phase: Callable[[str], None] | None = None
        """Called with ``loading``, ``warming``, ``ready`` or ``unloaded`` around an idle unload/reload."""
        self.load_ms = load_ms
        self.warmup_ms = 0.0
        #: The warm-up's parts in ms (``prepare``: recorded steps per batch size; ``requests``: the
        #: warm-up requests; ``prefixes``: the named speakers' prompt prefixes; ``calibration``).
        self.warmup_parts: dict[str, float] = {}
        self.warmed = False
        on_cpu = options is None or torch.device(options.device).type == "cpu"
        handoff_s = config.handoff_ms / 1000 if on_cpu else 0.0
        self._scheduler = Scheduler(
            config, self._info, lambda: self.model, self._maybe_unload, handoff_s, clock=clock
        )
        #: Held while a refusable stream is checked and queued (admission: no two pass on one slot).
        self._admission_lock = threading.Lock()
        #: Real-time requests refused by admission control (:meth:`over_capacity`).
        self.refused = 0
        #: ``decode_thread=auto``: the warm-up's timings of both modes (see calibrate_decode_thread).
        self.decode_calibration: dict[str, Any] | None = None
        #: The dtypes in use (bfloat16 settings fall back to float32 where it is not native).
        self.precision: Precision | None = None
        #: RSS before/after returning free heap memory at the end of start-up (None: not done/possible).
        self.heap_trim: dict[str, float] | None = None
        self._scheduler.start()
        atexit.register(_close_at_exit, weakref.ref(self))  # see _close_at_exit

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        config: EngineConfig,
        on_warmup: Callable[[], None] | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> Engine:
        """Load ``config.model``, start the scheduler and (unless disabled) warm every path;
        ``on_warmup`` is called when loading is done and warm-up begins (readiness reporting);
        ``clock``: what pacing measures slack and step times with (tests pass a fake one)."""
        if config.threads > 0:
            torch.set_num_threads(config.threads)
        t0 = time.perf_counter()
        device = config.resolved_device()
        precision = resolve_precision(
            config.resolved_dtype(), config.codec_dtype, native_bfloat16(device), config.quant
        )
        log_fallbacks(precision, device)
        options = LoadOptions(
            device=device,
            dtype=_DTYPES[precision.model],
            codec_dtype=_DTYPES[precision.codec],
            quant=config.quant,
            prefix_cache=config.prefix_cache,
            compile=config.resolved_compile(),
            trace_steps=config.trace_steps and device == "cpu",
            settings=tuple(config.settings.items()),
        )
        # see voxcast.engine.threads: no lasting OpenMP team on this thread
        model = on_fresh_thread(lambda: load_model(config.model, options))
        load_ms = (time.perf_counter() - t0) * 1000
        engine = cls(model, config, load_ms=load_ms, options=options, clock=clock)
        engine.precision = precision
        log.info("loaded %s (%s) in %.0f ms", config.model, model.model_type, load_ms)
        if config.warmup:
            if on_warmup is not None:
                on_warmup()
            engine.warmup()
        else:
            engine.heap_trim = trim_heap()
        return engine

    @property
    def model_type(self) -> str:
        return self._info.model_type

    @property
    def identity(self) -> str:
        return self._info.identity

    @property
    def sample_rate(self) -> int:
        return self._info.sample_rate

    @property
    def render_settings(self) -> dict[str, Any]:
        """What else than the checkpoint changes the model's output (part of the audio cache key;
        empty for Qwen3-TTS; Chatterbox Turbo: its stream settings and built-in voice)."""
        return dict(self._info.capabilities.render_settings)

    @property
    def speakers(self) -> tuple[str, ...]:
        """The model's named speakers (lower case; empty where it has none)."""
        return self._info.speakers

    @property
    def clones_voices(self) -> bool:
        """Whether the model builds voices from reference audio."""
        return self._info.clones_voices

    @property
    def cloning_refusal(self) -> str | None:
        """Why the model builds no voices from reference audio (the message of the error that
        refuses a cloning request; the model's own words), None where it does."""
        return self._info.capabilities.cloning_refusal

    @property
    def capabilities(self) -> Capabilities:
        """The optional parts of the model contract the model implements (read once at load)."""
        return self._info.capabilities

    @property
    def loaded(self) -> bool:
        """False while the weights are released after an idle unload."""
        return self._model is not None

    @property
    def model(self) -> TTSModel:
        """The loaded model.

        Raises:
            EngineUnavailable: it is unloaded (idle); the next request loads it again.
        """
        model = self._model
        if model is None:
            raise EngineUnavailable("the model is unloaded while idle; the next request loads it again")
        return model

    def load_voice(self, data: bytes) -> Any:
        """A stored voice (its ``to_bytes``), checked to belong to this model, primed for use."""
        with self._using() as model:
            return self.prime_voice(model.voice_from_bytes(data))

    # -- idle unload -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _using(self) -> Iterator[TTSModel]:
        """The model, loaded again first if it was unloaded, kept loaded until the block ends."""
        model, _ = self._hold(lambda: None)
        try:
            yield model
        finally:
            with self._users_lock:
                self._users -= 1
                self._scheduler.last_active = time.monotonic()

    def _hold(self, then: Callable[[], None]) -> tuple[TTSModel, bool]:
        """Count one more user of the loaded model (loading it again first if it was unloaded) and
        run ``then`` while an unload cannot happen. Returns the model and whether this call found
        it unloaded (and so waited for a load: a cold request)."""
        cold = False
        while True:
            with self._users_lock:
                model = self._model
                if model is not None:
                    self._users += 1
                    self._scheduler.last_active = time.monotonic()
                    then()
                    return model, cold
            cold = True
            with self._load_lock:  # not loaded: load it (once; others arriving wait here)
                self._ensure_loaded()

    def _ensure_loaded(self) -> bool:
        """Load and warm the model again if it was unloaded (under ``_load_lock``: once, however
        many callers arrive together; they wait for it). True when this call (re)loaded it."""
        if self._model is not None:
            return False
        assert self.options is not None, "an engine built without load options cannot reload"
        options = self.options
        self._phase("loading")
        t0 = time.perf_counter()
        self._model = on_fresh_thread(lambda: load_model(self.config.model, options))
        self.load_ms = (time.perf_counter() - t0) * 1000
        self.loads += 1
        self.warmed = False
        log.info("reloaded %s in %.0f ms after an idle unload", self.config.model, self.load_ms)
        if self.config.warmup:
            self._phase("warming")
            self.warmup()  # trims the heap at its end
        else:
            self.warmup_ms = 0.0
            self.heap_trim = trim_heap()  # what loading freed but the allocator kept
        self._scheduler.last_active = time.monotonic()
        self._phase("ready")
        return True

    def _phase(self, phase: str) -> None:
        if self.on_phase is not None:
            try:
                self.on_phase(phase)
            except Exception:
                log.exception("phase hook failed")

    def _maybe_unload(self) -> None:
        """On the scheduler thread: release the model after ``idle_unload_s`` without activity."""
        idle_s = self.config.idle_unload_s
        if not idle_s or self._model is None or self._scheduler.holding():
            return
        if time.monotonic() - self._scheduler.last_active < idle_s:
            return
        if not self._load_lock.acquire(blocking=False):  # a (re)load is under way
            return
        try:
            with self._users_lock:
                if self._users or self._scheduler.queued() or self._model is None:
                    return
                rss = rss_mb()
                self._model = None  # from here on, users load it again
            self._unload(rss)
        finally:
            self._load_lock.release()

    def _unload(self, rss_loaded_mb: float | None) -> None:
        device = str(self.options.device) if self.options is not None else "cpu"
        self._phase("unloaded")  # hooks drop what they hold of the model (voice prompts)
        gc.collect()
        if device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.last_unload = {"rss_loaded_mb": rss_loaded_mb or 0.0, **(trim_heap() or {})}
        self.unloads += 1
        self.warmed = False
        log.info("idle for %.1f s: model unloaded (%s)", self.config.idle_unload_s, self.last_unload)

    @property
    def decode_threaded(self) -> bool:
        """Whether chunks after the first are decoded on the decode thread."""
        return self._scheduler.decode_threaded

    @property
    def alive(self) -> bool:
        return self._scheduler.alive

    def close(self) -> None:
        """Stop the scheduler and the decode thread; streams still running end with EngineUnavailable."""
        self._scheduler.close()

    # -- the scheduler's counters and switches ---------------------------------------------------
    @property
    def keep_codes(self) -> bool:
        """Keep each stream's codes in its timing (tests, parity checks)."""
        return self._scheduler.keep_codes

    @keep_codes.setter
    def keep_codes(self, value: bool) -> None:
        self._scheduler.keep_codes = value

    @property
    def steps(self) -> int:
        """Batched model steps run."""
        return self._scheduler.steps

    @property
    def step_rows(self) -> int:
        """Rows the batched steps held (rows / steps = the mean batch size)."""
        return self._scheduler.step_rows

    @property
    def handoffs(self) -> int:
        """First chunks handed off (``handoff_ms``)."""
        return self._scheduler.handoffs

    def stats(self) -> dict[str, int]:
        """What the engine holds now (read without a lock: a monitoring snapshot, not a contract):
        ``active`` streams generating, ``prefilling`` admitted streams still in their prefill,
        ``waiting`` streams not yet admitted, ``waiting_text`` admitted streams waiting for text
        (text in pieces), and the ``steps`` / ``step_rows`` counters."""
        return self._scheduler.stats()

    # -- admission -------------------------------------------------------------------------------
    @property
    def frame_s(self) -> float:
        """Seconds of audio in one frame (0.08 at 12.5 Hz)."""
        return self._info.samples_per_frame / self._info.sample_rate

    def over_capacity(self) -> str | None:
        """Why one more real-time stream would not keep every stream viable now (None: it fits, or
        admission control is off): :func:`voxcast.engine.pacing.over_capacity` on the slots held and
        waiting, the measured round times and how busy the decode thread is."""
        c = self.config
        if not c.admission:
            return None
        sched = self._scheduler
        return over_capacity(
            sched.room(), sched.costs, self.frame_s, c.admission_load, c.admission_queue, sched.decode_busy()
        )

    def capacity(self) -> dict[str, Any]:
        """A monitoring snapshot of admission: the measured round ms by batch size, the frame's ms,
        the requests refused so far and why the next one would be (None: it would be admitted)."""
        measured = self._scheduler.costs.measured()
        return {
            "step_ms": {n: round(s * 1000, 3) for n, s in sorted(measured.items())},
            "frame_ms": round(self.frame_s * 1000, 3),
            "decode_busy": round(self._scheduler.decode_busy(), 3),
            "refused": self.refused,
            "over_capacity": self.over_capacity(),
        }

    # -- public API ------------------------------------------------------------------------------
    def synthesize(
        self,
        request: SynthesisRequest | dict[str, Any],
        voice: Any = None,
        *,
        realtime: bool | None = None,
        refusable: bool = False,
    ) -> SynthesisStream:
        """Start (lazily) one synthesis.

        Args:
            request: a validated request or a mapping (validated here).
            voice: a ``VoicePrompt`` for cloning (Base models); when None and the request carries
                ``ref_audio``, the prompt is built from it when iteration starts.
            realtime: someone plays the audio as it arrives (default: the request's ``stream``);
                False: no deadline, so it yields to new requests (prerender, batch jobs).
            refusable: when it starts while the engine is over capacity (:meth:`over_capacity`),
                its first ``next()`` raises :class:`OverCapacity` instead of queueing it.

        Returns:
            A stream: nothing runs until it is iterated.

        Raises:
            InvalidRequest: the request is malformed (also raised later, from iteration, for
                model-dependent problems such as an unknown speaker).
        """
        req = parse_request(request)
        prepare = self._prepare_voice if voice is None and req.ref_audio is not None else None
        return SynthesisStream(
            req,
            voice,
            self._submit,
            lambda: self.alive,
            prepare,
            on_cancel=self._scheduler.wake,
            realtime=req.stream if realtime is None else realtime,
            refusable=refusable,
        )

    def open(
        self,
        request: SynthesisRequest | dict[str, Any],
        voice: Any = None,
        feed: TextFeed | None = None,
        *,
        realtime: bool | None = None,
        refusable: bool = False,
    ) -> SynthesisStream:
        """Start (lazily) a synthesis whose text arrives in pieces (an LLM's tokens).

        ``request`` carries the voice and settings; its ``text`` (optional) is the first piece.
        Push the rest with ``stream.push(delta)`` and end it with ``stream.close_text()``; iterate the
        stream (on another thread, or between pushes) for its chunks. Where the model takes text as it
        comes (Qwen3-TTS's streaming-text layout, the default here for every voice mode), audio
        starts once the text decides the prefill (the first complete word; an ICL clone needs the
        words aligned with its reference), and with the same seed the frames equal those of the whole
        text at once, whatever the pieces. A stream whose next frame needs a word not yet complete
        waits without a frame step; one that gets no text for ``config.text_wait_s`` ends cleanly
        (finish reason "text_timeout"). ``feed``: a caller's own :class:`TextFeed` (the service
        creates it before the stream starts); its text up front comes before ``request``'s text.

        A layout that needs whole text (``non_streaming_text=True``) is spoken sentence by sentence,
        each as soon as the text after it has started. ``realtime`` and ``refusable``: as for
        :meth:`synthesize`.

        Raises:
            InvalidRequest: bad settings (model-dependent problems come from iteration).
        """
        req, initial = parse_open_request(request)
        prepare = self._prepare_voice if voice is None and req.ref_audio is not None else None
        if feed is None:
            feed = TextFeed(text=initial)
        elif initial:
            feed.push(initial)
        feed.on_change = self._scheduler.wake
        return SynthesisStream(
            req,
            voice,
            self._submit,
            lambda: self.alive,
            prepare,
            feed,
            self._scheduler.wake,
            realtime=req.stream if realtime is None else realtime,
            refusable=refusable,
        )

    def create_voice(
        self, audio: bytes, ref_text: str | None, x_vector_only: bool = False, *, prefix: bool = True
    ) -> Any:
        """Build a ``VoicePrompt`` from a reference audio file (any common container/rate), primed
        (:meth:`prime_voice`) so that its first request starts as fast as later ones.

        Args:
            prefix: also compute its prompt prefix (a request that brings its own reference audio
                skips that: its one-pass prefill computes the prefix anyway, at no extra cost).
        """
        if self.cloning_refusal is not None:
            raise InvalidRequest(self.cloning_refusal, field="ref_audio")
        pcm = load_reference_audio(audio)
        with self._using() as model:
            return on_fresh_thread(
                lambda: self._primed(
                    model.make_voice(pcm, self.sample_rate, ref_text, x_vector_only or ref_text is None),
                    prefix,
                )
            )

    def prime_voice(self, voice: Any, *, prefix: bool = True) -> Any:
        """Prepare ``voice``'s per-voice state now (off this thread), not in its first request: its
        audio-decoder state and, with ``prefix`` and the prefix cache on, its prompt prefix's keys and
        values for language "auto".

        :meth:`create_voice` does it for the voices it builds; call it for a voice obtained otherwise
        (e.g. loaded from storage) before its first request. Returns ``voice``.
        """
        with self._using():
            return on_fresh_thread(lambda: self._primed(voice, prefix))

    def _primed(self, voice: Any, prefix: bool = True) -> Any:
        return self.model.prime_voice(voice, prefix=prefix)

    def _prepare_voice(self, stream: SynthesisStream) -> None:
        t0 = time.perf_counter()
        req = stream.request
        audio = req.ref_audio_bytes()
        assert audio is not None
        stream.voice = self.create_voice(audio, req.ref_text, req.x_vector_only, prefix=False)
        stream.timing.voice_ms = (time.perf_counter() - t0) * 1000

    def _submit(self, stream: SynthesisStream) -> None:
        if not self.alive:
            raise EngineUnavailable("the engine is not running")
        if not stream.refusable:
            self._queue(stream)
            return
        with self._admission_lock:  # checked and queued together: two requests never take one slot
            reason = self.over_capacity()
            if reason is not None:
                self.refused += 1
                log.info(
                    "request %s refused: over capacity (%s)",
                    stream.timing.request_id,
                    reason,
                    extra={"request_id": stream.timing.request_id},
                )
                raise OverCapacity(f"over capacity: {reason}; retry later", retry_after_s=1)
            self._queue(stream)

    def _queue(self, stream: SynthesisStream) -> None:
        def queue_it() -> None:  # under the users lock: an unload never happens in between
            stream.timing.load_ms = self.load_ms
            stream.timing.warmup_ms = self.warmup_ms
            self._scheduler.queue(stream)

        stream.timing.cold = not self.warmed
        _, cold = self._hold(queue_it)
        with self._users_lock:
            self._users -= 1  # the queued stream keeps the model loaded from here on
        self._scheduler.wake()
        stream.timing.cold = stream.timing.cold or cold

    # -- warm-up ---------------------------------------------------------------------------------
    def warmup(self) -> float:
        """Run every request path once (greedy and sampled, each voice mode, both chunk sizes).

        Holds the load lock throughout, so no idle unload (``idle_unload_s``) happens in a pause
        between its requests; the idle clock starts again when it ends."""
        with self._load_lock:
            self._warmup()
            self._scheduler.last_active = time.monotonic()
        log.info("runtime choices: %s", runtime_choices(self))
        return self.warmup_ms

    def _warmup(self) -> None:
        done = warm(self)
        if done.calibration is not None:
            self.decode_calibration = done.calibration
        self.warmup_ms = done.ms
        self.warmup_parts = done.parts
        self.warmed = True
        log.info("warm-up done in %.0f ms: %s", self.warmup_ms, done.parts)
        self.heap_trim = trim_heap()  # what loading and warm-up freed but the allocator kept

    def calibrate_decode_thread(
        self, rounds: int = 1, sample: tuple[SynthesisRequest, Any] | None = None
    ) -> bool:
        """Time the same concurrent workload with and without the decode thread; keep the faster
        (:func:`voxcast.engine.warmup.calibrate`). Call it while no other request runs. Returns the
        choice; :attr:`decode_calibration` has the timings."""
        self.decode_calibration = calibrate(self, rounds, sample)
        return bool(self.decode_calibration["decode_thread"])

    def use_decode_thread(self, threaded: bool) -> None:
        """Decode chunks after a stream's first on the decode thread or not (only while no stream runs:
        its jobs would be split)."""
        self._scheduler.use_decode_thread(threaded)
