"""The scheduler: the frame loop that streams every admitted request through one model.

One thread admits new requests (prompt + prefill; at most one per round, prefilled in parts, while
others are playing, so they stall by about one part; all waiting ones at once while none has produced
a frame yet) and advances every active request by one frame per round in one batched step
(continuous batching: the talker and code predictor read their weights once for all rows), so
concurrent users share the cost of a frame instead of queueing behind each other. Text that arrives
in pieces is fed to open prompts here too; long texts are spoken in pieces whose next prefill runs
between frames.
Chunks of codes go to a :class:`~voxcast.engine.decode_stage.DecodeStage`: with a decode thread the
codec decodes them on a second thread while the scheduler generates the next frames; a stream ends
only after its last chunk was decoded and delivered. For a model that
:class:`~voxcast.models.base.DecodesTogether`, later chunks of several streams waiting for the decoder
(queued behind one another; inline: emitted in one round) are decoded in one ``decode_many`` call.

The :class:`~voxcast.engine.engine.Engine` owns the scheduler: it loads, warms and unloads the model
and hands streams to :meth:`Scheduler.queue`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from voxcast.engine.active import Active, fill_final_timing, next_chunk_frames
from voxcast.engine.chunks import AudioChunk
from voxcast.engine.config import EngineConfig, max_frames_for_text
from voxcast.engine.decode_stage import DecodeStage
from voxcast.engine.model_info import ModelInfo
from voxcast.engine.pacing import Room, RoundCosts, Row, Waiting, rows_to_step
from voxcast.engine.stream import SynthesisStream
from voxcast.errors import EngineUnavailable, InvalidRequest
from voxcast.models.base import DecodesTogether, FrameGenerator, LookaheadDecoder, OpenPrompt, TTSModel
from voxcast.text.incremental import SentenceBuffer
from voxcast.text.normalize import normalize_text
from voxcast.text.split import plan_chunks

__all__ = ["HANDOFF_TAKE_S", "Scheduler"]

log = logging.getLogger(__name__)


def _rid(act: Any) -> dict[str, Any]:
    """``extra`` naming an active stream's request on a line the engine thread logs."""
    return {"request_id": act.stream.timing.request_id}


_IDLE_WAIT_S = 0.25
#: How long :meth:`Scheduler.close` waits for each engine thread to end.
_CLOSE_S = 10.0
#: Longest wait for consumers to take the first chunks of a step (:meth:`Scheduler._hand_off`).
HANDOFF_TAKE_S = 0.005
# Intra-op torch threads of the decode thread: torch's default. Measured (scripts/
# bench_decode_threads.py, 2 cores, the full-size codec on the decode thread against matrix-vector
# "generation" on this one, 3 runs): with 1 decode thread each generation step took 4-4.5x longer and
# the run 3.3-3.6x; with OMP_WAIT_POLICY=PASSIVE the gap vanished, i.e. the generating thread's
# OpenMP team spin-waits for a core the single busy decode thread holds. Default (active) was fastest.
_DECODE_TORCH_THREADS = 0


@dataclass
class _Opening:
    """An admitted stream whose text has not yet decided its prefill (text arriving in pieces):
    an open prompt fed token by token, or (a layout that needs whole text) sentences."""

    stream: SynthesisStream
    prompt: OpenPrompt | None
    seen: int = -1
    sentences: _Sentences | None = None


class _Sentences:
    """The complete sentences of a text that arrives in pieces, for layouts that need whole text:
    each one is a piece of the stream as soon as the text after it has started (or the text closed)."""

    def __init__(self) -> None:
        self._buffer = SentenceBuffer()
        self._fed = 0

    def take(self, raw: str, closed: bool) -> list[str]:
        """The sentences of ``raw`` (the whole text so far) completed since the last call, normalised."""
        out = self._buffer.push(raw[self._fed :])
        self._fed = len(raw)
        if closed:
            out += self._buffer.flush()
        return [t for t in (normalize_text(x) for x in out) if t]


class Scheduler:
    """The frame loop of one engine on its own thread (see the module docstring).

    Args:
        config: the engine's settings (chunk sizes, ``max_active``, prefill parts, ...).
        info: the model's constants (sample rate, frame size).
        model: the loaded model (raises :class:`EngineUnavailable` while it is unloaded).
        on_round: called once per round on the scheduler thread (the engine's idle unload).
        handoff_s: the pause after a step that produced streams' first chunks (0: none).
        clock: seconds, monotonic: what pacing measures slack and round costs with (tests inject one).
    """

    def __init__(
        self,
        config: EngineConfig,
        info: ModelInfo,
        model: Callable[[], TTSModel],
        on_round: Callable[[], None],
        handoff_s: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.clock = clock
        #: Measured step times by batch size (admission) and the longest recent rounds (the horizon).
        self.costs = RoundCosts()
        #: Rows that skipped a round so that a new request's first chunk came sooner (pacing).
        self.skipped_rows = 0
        self._info = info
        self._model = model
        self._on_round = on_round
        self.keep_codes = False
        #: When a stream last did something (monotonic s): the engine's idle clock.
        self.last_active = time.monotonic()
        #: Streams waiting for a slot, taken real-time first (:class:`~voxcast.engine.pacing.Waiting`).
        self._pending: Waiting[SynthesisStream] = Waiting()
        self._finishing = 0  # streams ended whose last decode job has not run (admission)
        self._finishing_lock = threading.Lock()
        self._active: list[Active] = []
        self._prefilling: list[Active] = []  # admitted, prefill interleaved with the active frames
        self._ahead: list[Active] = []  # active long texts whose next piece is prefilled between frames
        self._opening: list[_Opening] = []  # text in pieces: admitted, waiting for the prefill's text
        #: Set whenever the scheduler may have work: a request queued, text pushed, a stream cancelled.
        self._wake = threading.Event()
        self._stopping = threading.Event()
        #: Batched model steps run, and the rows they held (rows / steps = the mean batch size).
        self.steps = 0
        self.step_rows = 0
        #: First chunks handed off (see :meth:`_hand_off`; CPU only: a GPU step leaves the cores free).
        self.handoffs = 0
        self._handoffs: list[SynthesisStream] = []
        self._handoff_s = handoff_s
        #: ``decode_many`` calls and the chunks they decoded (rows / batches = the mean batch)
        self.decode_batches = 0
        self.decode_batch_rows = 0
        self._decode = self._stage(config.decode_thread == "on")
        self._thread = threading.Thread(target=self._run, name="voxcast-engine", daemon=True)

    def start(self) -> None:
        """Start the scheduler thread."""
        self._thread.start()

    @property
    def model(self) -> TTSModel:
        return self._model()

    @property
    def sample_rate(self) -> int:
        return self._info.sample_rate

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set() and self._decode.alive

    @property
    def decode_threaded(self) -> bool:
        """Whether chunks after the first are decoded on the decode thread."""
        return self._decode.threaded

    def wake(self) -> None:
        """Tell the scheduler it may have work (text pushed, a stream cancelled)."""
        self._wake.set()

    def queue(self, stream: SynthesisStream) -> None:
        """Queue ``stream`` for admission (the caller wakes the scheduler): behind the waiting
        real-time streams, and ahead of those without a listener if it is real-time."""
        self._pending.put(stream, stream.realtime)

    def queued(self) -> bool:
        """Whether streams wait for admission."""
        return len(self._pending) > 0

    def holding(self) -> bool:
        """Whether admitted streams are in flight (generating, prefilling or waiting for text)."""
        return bool(self._active or self._prefilling or self._ahead or self._opening)

    def close(self) -> None:
        """Stop the scheduler and the decode thread; streams still running end with EngineUnavailable."""
        self._stopping.set()
        self._thread.join(timeout=_CLOSE_S)
        self._decode.join(timeout=_CLOSE_S)
        if self._thread.is_alive():  # inside one long model call (recording a step, a prefill)
            log.warning("engine: the scheduler thread still runs %.0f s after close", _CLOSE_S)

    def use_decode_thread(self, threaded: bool) -> None:
        """Swap the decode stage (only while no stream is running: its jobs would be split)."""
        if threaded == self._decode.threaded:
            return
        old = self._decode
        self._decode = self._stage(threaded)
        old.join(timeout=10)

    def _stage(self, threaded: bool) -> DecodeStage:
        """A decode stage; it batches chunks of several streams where the model decodes them together."""
        together = self._info.capabilities.decodes_together
        batch = self._decode_batch if together else None
        return DecodeStage(threaded, _DECODE_TORCH_THREADS, batch=batch, clock=self.clock)

    # -- scheduler thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stopping.is_set():
                    self._wake.clear()  # before looking: a wake-up from here on is not lost
                    t0 = self.clock()
                    self._admit()
                    self._feed_text()  # after admitting: a new stream's text decides its prefill now
                    self._on_round()
                    self._prefill_part()
                    rows = self._advance_all()
                    self._decode.flush()  # inline: chunks held by a round that stepped nothing
                    self._measure(rows, self.clock() - t0)
                    if not self._runnable() and not self._pending:
                        self._wake.wait(_IDLE_WAIT_S)
        except BaseException:  # the thread must not die silently
            log.exception("engine scheduler crashed")
            raise
        finally:
            self._stopping.set()
            err = EngineUnavailable("the engine stopped")
            for act in self._active + self._prefilling:
                act.fail(err)
            for opening in self._opening:
                opening.stream._fail(err)
            while (waiting := self._pending.take()) is not None:
                waiting._fail(err)
            self._decode.stop()  # streams that already ended generating still get their last chunks

    def _admit(self) -> None:
        """Admit waiting requests, up to ``max_active`` streams.

        Once an admitted stream has produced a frame (someone may be listening), at most one request
        per round, prefilled in parts between the frames (``prefill_chunk``): playing streams stall
        by about one part. Before that (``burst_admit``), every waiting request is admitted and
        prefilled whole at once, so requests that arrive together start together: measured with four
        arriving at once, the last one's first audio came after three earlier streams' first chunks
        and ramp-up chunks otherwise (docs/benchmarks-history.md, burst admission).
        """
        while len(self._active) + len(self._prefilling) < self.config.max_active:
            busy = bool(self._active or self._prefilling)
            playing = busy and not (self.config.burst_admit and self._nobody_playing())
            stream = self._pending.take()
            if stream is None:
                return
            if stream.cancelled:
                self._finish_cancelled(stream)
                continue
            try:
                if stream.feed is not None:
                    self._open(stream)
                elif playing and self.config.prefill_chunk:
                    self._prefilling.append(self._start(stream, prefill=False))
                else:
                    self._active.append(self._start(stream))
            except Exception as e:
                if not isinstance(e, InvalidRequest):
                    log.exception(
                        "request %s failed to start",
                        stream.timing.request_id,
                        extra={"request_id": stream.timing.request_id},
                    )
                stream._fail(e)
            if playing:  # one prefill per round while others play: they stall by one part at most
                return

    def room(self) -> Room:
        """Slots held and streams waiting for one (a snapshot read off the scheduler thread)."""
        held = len(self._active) + len(self._prefilling)
        return Room(held, self._pending.realtime, self.config.max_active, self._finishing)

    def _urgent(self) -> bool:
        """Whether a real-time request waits for its first chunk: prefilling, generating its first
        frames, or queued while a slot is free (admitted next round)."""
        if any(act.stream.realtime for act in self._prefilling):
            return True
        for act in self._active:
            if act.stream.realtime and act.play_end is None and not act.waiting_text:
                return True
        return bool(self._pending) and len(self._active) + len(self._prefilling) < self.config.max_active

    def _horizon_s(self) -> float:
        """The slack beyond which a stream may skip a round: the setting, but at least twice the
        longest recent round (0: pacing off)."""
        horizon = self.config.slack_horizon_ms / 1000
        return max(horizon, 2 * self.costs.recent_max_s()) if horizon > 0 else 0.0

    def _paced(self, acts: list[Active]) -> list[Active]:
        """The rows of ``acts`` that take a frame this round (:func:`~voxcast.engine.pacing.rows_to_step`);
        each row's ``skipping_since`` is set when it starts skipping and cleared when it steps."""
        if len(acts) < 2 and not self._prefilling and not self._pending:
            for act in acts:
                act.skipping_since = None
            return acts  # nobody else to make room for
        now = self.clock()
        rows = [Row(act.stream.realtime, act.play_end, act.skipping_since) for act in acts]
        steps = rows_to_step(rows, now, self._horizon_s(), self._urgent())
        self.skipped_rows += len(acts) - sum(steps)
        for act, step in zip(acts, steps, strict=True):
            if step:
                act.skipping_since = None
            elif act.skipping_since is None:
                act.skipping_since = now
        return [act for act, step in zip(acts, steps, strict=True) if step]

    def decode_busy(self) -> float:
        """The share of the last seconds the decode thread was busy (0 when decoding is inline)."""
        return self._decode.busy.fraction(self.clock())

    def _measure(self, rows: int, seconds: float) -> None:
        """Record a round's time: every round for the horizon; a round that stepped ``rows`` rows
        also as the cost of a frame at that batch size (admission). The whole round, not the model
        call alone: a GPU step may return before its kernels ran (they finish by the round's end,
        where the codes are read), and prefill parts and first-chunk decodes are load too."""
        self.costs.record_round(seconds)
        if rows:
            self.costs.record_step(rows, seconds)

    def _runnable(self) -> bool:
        """Whether the scheduler has work now: a prefill, or a stream that can take a frame step."""
        return bool(self._prefilling or self._ahead or any(not a.waiting_text for a in self._active))

    def _nobody_playing(self) -> bool:
        """Whether no admitted stream has produced a frame yet (all still before their first audio)."""
        return all(act.frames == 0 for act in self._active)

    def _start(
        self, stream: SynthesisStream, prefill: bool = True, pieces: list[str] | None = None
    ) -> Active:
        """An admitted stream: its text planned into pieces (or the given ``pieces`` of a text that
        arrives in sentences), the first one's generator built and, with ``prefill``, prefilled."""
        req, timing = stream.request, stream.timing
        t0 = time.perf_counter()
        if pieces is None:
            timing.queue_wait_ms = (t0 - stream.t_submit) * 1000
            pieces = self._plan(req.text)
        several = len(pieces) > 1 or stream.feed is not None
        timing.pieces = len(pieces)
        gen, max_frames = self._piece_generator(stream, pieces[0], req.sampling, 0, several)
        timing.prompt_ms = (time.perf_counter() - t0) * 1000
        decoder = self.model.new_decoder(stream.voice, seed=gen.seed)
        if gen.seed is not None:
            timing.extra["seed"] = int(gen.seed)
        first = req.first_chunk_frames or self.config.first_chunk_frames
        act = Active(stream, gen, decoder, max_frames, target=first, first=first, pieces=pieces[1:])
        if several:
            act.piece_log.append({"chars": len(pieces[0]), "first_frame": 0})
        if prefill:
            gen.prefill()
            self._prefilled(act)
        return act

    # -- text in pieces --------------------------------------------------------------------------
    def _open(self, stream: SynthesisStream) -> None:
        """Admit a stream whose text arrives in pieces: its prompt waits for the prefill's text."""
        req = stream.request
        prompt = self.model.open_prompt(
            speaker=req.voice if stream.voice is None else None,
            voice=stream.voice,
            language=req.language,
            instruct=req.instruct,
            non_streaming_text=req.non_streaming_text,
        )
        stream.timing.queue_wait_ms = (time.perf_counter() - stream.t_submit) * 1000
        if prompt is None:  # the layout needs whole text: sentence by sentence
            self._opening.append(_Opening(stream, None, sentences=_Sentences()))
            return
        self._opening.append(_Opening(stream, prompt))

    def _feed_text(self) -> None:
        """Hand new text to the prompts that wait for it; start the streams whose prefill it decided;
        end the text of streams that waited longer than ``text_wait_s``."""
        for opening in list(self._opening):
            stream = opening.stream
            try:
                if stream.cancelled:
                    self._opening.remove(opening)
                    self._finish_cancelled(stream)
                    continue
                if opening.sentences is not None:
                    opening.seen, pieces = self._new_sentences(stream, opening.sentences, opening.seen)
                    if pieces:
                        self._opening.remove(opening)
                        act = self._start(stream, prefill=False, pieces=pieces)
                        act.sentences, act.seen = opening.sentences, opening.seen
                        self._prefilling.append(act)
                    elif stream.feed is not None and stream.feed.closed:
                        raise InvalidRequest("text has nothing to speak", field="text")
                    continue
                assert opening.prompt is not None
                opening.seen = self._update_prompt(stream, opening.prompt, opening.seen)
                if opening.prompt.ready:
                    self._opening.remove(opening)
                    self._prefilling.append(self._started(stream, opening.prompt, opening.seen))
            except Exception as e:
                if opening in self._opening:
                    self._opening.remove(opening)
                if not isinstance(e, InvalidRequest):
                    log.exception("request %s failed to start", stream.timing.request_id)
                stream._fail(e)
        for act in self._active + self._prefilling:
            if act.failed or (act.prompt is None and act.sentences is None):
                continue
            try:
                if act.sentences is not None:
                    self._more_sentences(act)
                    continue
                assert act.prompt is not None
                seen = self._update_prompt(act.stream, act.prompt, act.seen)
                if seen != act.seen and act.prompt.closed:  # the whole text's limit, as if given at once
                    act.generator.max_frames = act.max_frames = self._text_limit(act.stream)
                act.seen = seen
            except Exception as e:
                for group in (self._active, self._prefilling):
                    if act in group:
                        group.remove(act)
                act.fail(e)

    def _new_sentences(
        self, stream: SynthesisStream, sentences: _Sentences, seen: int
    ) -> tuple[int, list[str]]:
        """The pieces of the sentences completed since feed version ``seen`` (a whole-text layout)."""
        feed = stream.feed
        assert feed is not None
        self._check_text_wait(stream)
        if feed.version == seen:
            return seen, []
        raw, closed, version = feed.snapshot()
        pieces = [p for sentence in sentences.take(raw, closed) for p in self._plan(sentence)]
        return version, pieces

    def _more_sentences(self, act: Active) -> None:
        """New sentences of a whole-text layout's stream become its next pieces; a stream that waited
        for them goes on, and one whose text closed with nothing left ends."""
        assert act.sentences is not None and act.stream.feed is not None
        act.seen, pieces = self._new_sentences(act.stream, act.sentences, act.seen)
        act.pieces += pieces
        act.stream.timing.pieces += len(pieces)
        if not act.text_wait:
            if pieces:
                self._look_ahead(act)
            return
        if pieces:
            act.text_wait = False
            self._resume(act)
            self._next_piece(act)
        elif act.stream.feed.closed:
            act.text_wait = False
            self._resume(act)
            self._active.remove(act)
            self._finish(act)

    def _check_text_wait(self, stream: SynthesisStream) -> None:
        """Take the text as complete after ``text_wait_s`` without any (it speaks to its end)."""
        feed = stream.feed
        assert feed is not None
        if not feed.closed and time.monotonic() - feed.last_change > self.config.text_wait_s:
            stream.timing.extra["text_timeout"] = True
            log.info(
                "request %s got no text for %.1f s: its text is taken as complete",
                stream.timing.request_id,
                self.config.text_wait_s,
                extra={"request_id": stream.timing.request_id},
            )
            feed.close()

    def _update_prompt(self, stream: SynthesisStream, prompt: OpenPrompt, seen: int) -> int:
        """Feed ``prompt`` the stream's text if it changed (closing it after ``text_wait_s`` without
        text); returns the feed version it has now seen."""
        feed = stream.feed
        assert feed is not None
        self._check_text_wait(stream)
        if feed.version == seen:
            return seen
        raw, closed, version = feed.snapshot()
        text = normalize_text(raw)
        prompt.update(text, closed)
        if closed:
            stream.timing.extra["text_chars"] = len(text)
        return version

    def _text_limit(self, stream: SynthesisStream) -> int:
        """The frame limit of a stream with text in pieces: the caller's ``max_frames``, else the
        whole text's derived limit once it is complete, and ``max_frames_cap`` until then."""
        feed = stream.feed
        if stream.request.max_frames is not None:
            return stream.request.max_frames
        if feed is None or not feed.closed:
            return self.config.max_frames_cap
        return self._frame_limit(normalize_text(feed.snapshot()[0]))

    def _started(self, stream: SynthesisStream, prompt: OpenPrompt, seen: int) -> Active:
        """The admitted stream of an open prompt whose prefill is decided (prefilled between frames);
        ``seen``: the feed version the prompt holds (text pushed since is fed on the next round)."""
        t0 = time.perf_counter()
        req = stream.request
        limit = self._text_limit(stream)
        gen = self.model.new_generator(prompt, req.sampling, limit)
        stream.timing.prompt_ms = (time.perf_counter() - t0) * 1000
        if gen.seed is not None:
            stream.timing.extra["seed"] = int(gen.seed)
        first = req.first_chunk_frames or self.config.first_chunk_frames
        decoder = self.model.new_decoder(stream.voice, seed=gen.seed)
        act = Active(stream, gen, decoder, limit, target=first, first=first)
        act.prompt, act.seen = prompt, seen
        return act

    def _resume(self, act: Active) -> None:
        """``act`` no longer waits for text: count the wait."""
        if act.wait_since is not None:
            act.wait_s += time.monotonic() - act.wait_since
            act.wait_since = None

    def _wait_for_text(self, act: Active) -> None:
        """``act``'s next frame needs text not yet final: no step meanwhile.

        Waiting for a token keeps the chunk schedule (a partial chunk waits with it), so the chunks,
        and the audio decoded from them, are bitwise those of the whole text at once. Waiting for the
        next sentence (a whole-text layout) sends the spoken sentence's last frames at once instead.
        """
        if act.wait_since is None:
            act.wait_since = time.monotonic()
            act.waits += 1
            if act.text_wait and act.pending:
                self._emit(act)
            if act.text_wait and self._info.capabilities.decoder_holds_audio:
                flush = cast(LookaheadDecoder, act.decoder).flush  # audio held back (look-ahead)
                if act.seq == 0:  # as in _emit: inline until the first audio is out (keeps the order)
                    self._flush_decoder(act, flush)
                else:
                    self._decode.run(lambda: self._flush_decoder(act, flush), act.fail)

    def _flush_decoder(self, act: Active, flush: Callable[[], np.ndarray]) -> None:
        """Deliver the audio a look-ahead decoder still holds (the stream waits for its next sentence)."""
        if not (act.failed or act.stream.cancelled):
            self._decode_and_deliver(act, flush)

    def _frame_limit(self, text: str) -> int:
        """The derived frame limit of ``text`` (the runaway guard), in the model's frames: the rule is
        written for 12.5 frames a second (Qwen3-TTS) and scaled for other rates (Chatterbox Turbo: 25)."""
        scale = self._info.sample_rate / self._info.samples_per_frame / 12.5
        return max(2, round(max_frames_for_text(text, self.config.max_frames_cap) * scale))

    def _plan(self, text: str) -> list[str]:
        """The pieces a text is spoken in: itself, or sentence-cut pieces of at most ``piece_chars``."""
        limit = self.config.piece_chars
        if not limit or len(text) <= limit:
            return [text]
        return plan_chunks(text, limit) or [text]

    def _piece_generator(
        self, stream: SynthesisStream, text: str, sampling: Any, frames_so_far: int, several: bool
    ) -> tuple[FrameGenerator, int]:
        """A generator for ``text`` (the stream's text, or one of its ``several`` pieces) and its
        frame limit: the caller's ``max_frames`` for a whole text; for a piece, its own derived limit
        (the runaway guard) within what the caller's ``max_frames`` leaves for the whole text."""
        req = stream.request
        prompt = self.model.build_prompt(
            text,
            speaker=req.voice if stream.voice is None else None,
            voice=stream.voice,
            language=req.language,
            instruct=req.instruct,
            non_streaming_text=req.non_streaming_text,
        )
        limit = self._frame_limit(text)
        if req.max_frames is not None:
            left = req.max_frames - frames_so_far
            limit = min(limit, left) if several else left
        return self.model.new_generator(prompt, sampling, limit), limit

    def _prefilled(self, act: Active) -> None:
        """Record a completed prefill in the request's timing."""
        t, gen = act.stream.timing, act.generator
        t.prefill_ms = gen.prefill_s * 1000
        t.prefill_parts = max(1, t.prefill_parts)
        prefix = gen.prefix_report()
        if prefix is not None:
            t.prefix_cache_hit, t.prefix_positions = prefix
        self._look_ahead(act)

    # -- long texts: the next piece ----------------------------------------------------------------
    def _look_ahead(self, act: Active) -> None:
        """Queue the prefill of ``act``'s next piece, run in parts between frames (:meth:`_prefill_part`).

        Not where the caller set ``max_frames``: the next piece's limit is what the current one
        leaves, known only when it ends (the next piece is then prefilled at the switch).
        """
        if not act.pieces or act.ahead is not None or act.stream.request.max_frames is not None:
            return
        act.ahead, act.ahead_frames = self._next_generator(act)
        act.ahead_ready = False
        self._ahead.append(act)

    def _next_generator(self, act: Active) -> tuple[FrameGenerator, int]:
        return self._piece_generator(act.stream, act.pieces[0], self._piece_sampling(act), act.frames, True)

    def _piece_sampling(self, act: Active) -> Any:
        """One sampler and seed for every piece: the first piece's seed (drawn, when none was asked)."""
        seed = act.stream.timing.extra.get("seed")
        return act.stream.request.sampling.model_copy(update={"seed": seed})

    def _prefill_ahead(self) -> None:
        """One part of the oldest queued next-piece prefill (dropped for a stream no longer active)."""
        act = self._ahead[0]
        if act.failed or act.stream.cancelled or act not in self._active or act.ahead is None:
            self._ahead.pop(0)
            return
        if act.ahead.prefill_part(self.config.prefill_chunk or None):
            act.ahead_ready = True
            self._ahead.pop(0)

    def _next_piece(self, act: Active) -> bool:
        """Continue ``act`` with its next piece after the current one ended; False when there is none
        (or the caller's ``max_frames`` is spent). Same stream, decoder, voice and seed; the pending
        frames carry over into the next chunk, so the audio runs on without a seam."""
        req = act.stream.request
        if not act.pieces or (req.max_frames is not None and act.frames >= req.max_frames):
            return False
        old = act.generator
        act.close_piece(old.finish_reason or "eos")
        for k, v in old.stage_ms().items():
            act.stage_totals[k] = act.stage_totals.get(k, 0.0) + v
        if act.ahead is None:
            act.ahead, act.ahead_frames = self._next_generator(act)
        gen, ahead = act.ahead, act.ahead_ready
        if act in self._ahead:
            self._ahead.remove(act)
        if not ahead:
            gen.prefill_part(None)  # the rest of it (or all of it)
        text = act.pieces.pop(0)
        act.generator, act.max_frames = gen, act.ahead_frames
        act.ahead, act.ahead_ready = None, False
        act.piece_log.append(
            {
                "chars": len(text),
                "first_frame": act.frames,
                "prefill_ms": gen.prefill_s * 1000,
                "ahead": ahead,
            }
        )
        self._look_ahead(act)
        return True

    def _prefill_part(self) -> None:
        """Advance the oldest interleaved prefill by one part (all of it when nothing else decodes);
        with none waiting, one part of a long text's next piece.

        While nobody plays yet (``burst_admit``), every waiting prefill is run whole this round, as
        :meth:`_admit` does for whole texts: streams whose text arrives in pieces (the WebSocket) and
        that open together start together, instead of one after another in parts.
        """
        if not self._prefilling:
            if self._ahead:
                try:
                    self._prefill_ahead()
                except Exception as e:
                    act = self._ahead.pop(0)
                    log.exception(
                        "request %s failed to prefill its next piece",
                        act.stream.timing.request_id,
                        extra=_rid(act),
                    )
                    if act in self._active:
                        self._active.remove(act)
                    act.fail(e)
            return
        if self.config.burst_admit and self._nobody_playing():
            for act in list(self._prefilling):
                self._prefill_one(act, None)
            return
        part = self.config.prefill_chunk or None  # 0: whole prefills
        self._prefill_one(self._prefilling[0], part if self._active else None)

    def _prefill_one(self, act: Active, limit: int | None) -> None:
        """Advance ``act``'s prefill by ``limit`` positions (None: all of it); once done it is active."""
        if act.stream.cancelled:
            self._prefilling.remove(act)
            self._finish_cancelled(act.stream)
            return
        try:
            act.stream.timing.prefill_parts += 1
            if act.generator.prefill_part(limit):
                self._prefilling.remove(act)
                self._prefilled(act)  # may build the next piece's prompt: inside the try too
                self._active.append(act)
        except Exception as e:
            log.exception("request %s failed to prefill", act.stream.timing.request_id, extra=_rid(act))
            if act in self._prefilling:
                self._prefilling.remove(act)
            act.fail(e)

    def _advance_all(self) -> int:
        """One frame for every active request that takes one this round (:meth:`_paced`), in one
        batched model step; returns the rows stepped."""
        acts = []
        for act in list(self._active):
            if act.failed:  # its decode failed on the decode thread: the stream has the error
                self._active.remove(act)
            elif act.stream.cancelled:
                self._active.remove(act)
                self._finish_cancelled(act.stream, act)
            elif act.waiting_text:
                self._wait_for_text(act)
            else:
                self._resume(act)
                acts.append(act)
        acts = self._paced(acts)
        if not acts:
            return 0
        try:
            frames = self._step([act.generator for act in acts])
        except Exception as e:
            log.exception("batched step failed (%d requests)", len(acts))
            for act in acts:
                self._active.remove(act)
                act.fail(e)
            return 0
        for act, codes in zip(acts, frames, strict=True):
            self._advance(act, codes)
        self._decode.flush()  # inline: this round's later chunks, decoded together
        if self._handoffs:
            self._hand_off()
        return len(acts)

    def _hand_off(self) -> None:
        """Let the first chunks of this step reach their clients before the next frames.

        On a CPU the next step's threads take both cores the moment a chunk is out, so the threads
        that carry it on (the consumer, a server's event loop, the socket) wait to be scheduled: a
        few ms of loopback overhead on 2 cores. Once per stream start the scheduler waits until the
        consumers took their chunks (at most :data:`HANDOFF_TAKE_S`), then pauses ``handoff_ms``.
        """
        deadline = time.perf_counter() + HANDOFF_TAKE_S
        for stream in self._handoffs:
            stream._taken.wait(max(0.0, deadline - time.perf_counter()))
        self.handoffs += len(self._handoffs)
        self._handoffs.clear()
        time.sleep(self._handoff_s)

    def _step(self, generators: list[FrameGenerator]) -> list[torch.Tensor | None]:
        self.steps += 1
        self.step_rows += len(generators)
        return list(self.model.step_many(generators))

    def stats(self) -> dict[str, int]:
        """What the engine holds now (read without a lock: a monitoring snapshot, not a contract):
        ``active`` streams generating, ``prefilling`` admitted streams still in their prefill,
        ``waiting`` streams not yet admitted, ``waiting_text`` admitted streams waiting for text
        (text in pieces), and the ``steps`` / ``step_rows`` / ``skipped_rows`` counters."""
        return {
            "active": len(self._active),
            "prefilling": len(self._prefilling),
            "waiting": len(self._pending),
            "waiting_text": len(self._opening) + sum(1 for a in self._active if a.waiting_text),
            "steps": self.steps,
            "step_rows": self.step_rows,
            "skipped_rows": self.skipped_rows,
        }

    def _advance(self, act: Active, codes: torch.Tensor | None) -> None:
        try:
            if codes is not None:
                act.pending.append(codes)
                act.frames += 1
                if len(act.pending) >= act.target:
                    self._emit(act)
                return
            if self._next_piece(act):
                return
            if act.sentences is not None and act.stream.feed is not None and not act.stream.feed.closed:
                act.text_wait = True  # more sentences may come: wait for them (no step meanwhile)
                self._wait_for_text(act)
                return
            if act.pending:
                self._emit(act)
            self._active.remove(act)
            self._finish(act)
        except Exception as e:
            log.exception("request %s failed", act.stream.timing.request_id, extra=_rid(act))
            if act in self._active:
                self._active.remove(act)
            act.fail(e)

    def _emit(self, act: Active) -> None:
        """Hand the pending frames to the decode stage as one chunk.

        A stream's first chunk is decoded here, on the scheduler thread, at once and with the cores
        to itself, because time to first audio matters most; later chunks overlap the next frames.
        "First" means: until the stream's first audio is out. A decoder with look-ahead (Chatterbox
        Turbo's) gives no audio for its first few chunks; they all run here, so the one that brings
        the first audio does not share the cores with the next frames either (and, every earlier
        chunk of the stream having run here, the stream's chunks stay in order).
        That stalls other streams by one one-frame decode when a stream starts (they already wait
        for its prefill); for a look-ahead decoder, by its first window (Chatterbox Turbo on 2 CPU
        cores: one flow + HiFT window, ~1.7 s at full size). Measured on a tiny talker with the full-size codec (5 runs, medians): TTFA
        392 ms with the first chunk on the decode thread, 354 ms here, 336 ms with no decode thread.
        """
        codes = torch.stack(act.pending)  # [T, 16]: a copy, so the decode may run later
        if self.keep_codes:
            act.codes.append(codes)
        act.pending = []
        act.target = next_chunk_frames(act, self.config.chunk_frames, self.config.chunk_ramp)
        if act.seq == 0:  # no audio out yet (seq grows only when a chunk with audio is delivered)
            self._decode_chunk(act, codes)
        elif self._decode.batches:
            self._decode.run_batched(act, (act, codes), act.fail)
        else:
            self._decode.run(lambda: self._decode_chunk(act, codes), act.fail)

    def _decode_chunk(self, act: Active, codes: torch.Tensor) -> None:
        """Decode one chunk and deliver it (decode stage; skipped once the stream failed)."""
        if act.failed or (self._decode.threaded and act.stream.cancelled):
            return
        self._decode_and_deliver(act, lambda: act.decoder.decode(codes), int(codes.shape[0]))

    def _decode_batch(self, jobs: list[tuple[Active, torch.Tensor]]) -> None:
        """Decode several streams' chunks (one each) in one ``decode_many`` call and deliver them
        (decode stage); each stream's wall time is its share of the call. A stream's own error fails
        it alone; an error of the call fails every stream in it."""
        live = [(a, c) for a, c in jobs if not (a.failed or (self._decode.threaded and a.stream.cancelled))]
        if len(live) < 2:
            for act, codes in live:
                self._guarded(act, lambda: self._decode_chunk(act, codes))  # noqa: B023 (runs now)
            return
        t0 = time.perf_counter()
        try:
            model = cast(DecodesTogether, self.model)
            pcms = model.decode_many([a.decoder for a, _ in live], [c for _, c in live])
        except Exception as e:
            log.exception("batched decode failed (%d requests)", len(live))
            for act, _ in live:
                act.fail(e)
            return
        t1 = time.perf_counter()
        self.decode_batches += 1
        self.decode_batch_rows += len(live)
        for (act, codes), pcm in zip(live, pcms, strict=True):
            if isinstance(pcm, Exception):
                log.error("request %s failed: %s", act.stream.timing.request_id, pcm, extra=_rid(act))
                act.fail(pcm)
                continue
            act.codec_s += (t1 - t0) / len(live)
            frames = int(codes.shape[0])
            self._guarded(act, lambda: self._deliver(act, np.asarray(pcm, dtype=np.float32), frames, t1))  # noqa: B023

    @staticmethod
    def _guarded(act: Active, run: Callable[[], None]) -> None:
        """``run()``; an exception fails ``act`` alone (a batch's other streams go on)."""
        try:
            run()
        except Exception as e:
            log.exception("request %s failed", act.stream.timing.request_id, extra=_rid(act))
            act.fail(e)

    def _decode_and_deliver(self, act: Active, decode: Callable[[], np.ndarray], frames: int = 0) -> None:
        """Run one decoder call (timed into the stream's codec time) and deliver its audio."""
        t0 = time.perf_counter()
        pcm = np.asarray(decode(), dtype=np.float32)
        t1 = time.perf_counter()
        act.codec_s += t1 - t0
        self._deliver(act, pcm, frames, t1)

    def _deliver(self, act: Active, pcm: np.ndarray, frames: int, t1: float) -> None:
        """Put a decoded chunk on the stream. A decoder with look-ahead may have no audio final yet:
        its frames are counted with the next chunk that has some."""
        self.last_active = time.monotonic()  # activity counts every chunk (idle unload)
        if not len(pcm):
            act.unsent_frames += frames
            return
        frames, act.unsent_frames = frames + act.unsent_frames, 0
        chunk = AudioChunk(act.seq, pcm, self.sample_rate, frames, t1)
        if act.seq == 0:
            act.stream.timing.ttfa_ms = (t1 - act.stream.started_at) * 1000
        now = self.clock()
        act.play_end = max(now if act.play_end is None else act.play_end, now) + chunk.duration_s
        act.seq += 1
        act.samples += len(pcm)
        act.emits.append(t1)
        act.durations.append(chunk.duration_s)
        act.stream._put(chunk)
        if chunk.seq == 0 and self._handoff_s > 0:
            self._handoffs.append(act.stream)

    def _finish(self, act: Active, reason: str | None = None) -> None:
        """End the request once its chunks are out: queued behind them on the decode stage (until
        then it counts as finishing: admission's decoder rule)."""
        with self._finishing_lock:
            self._finishing += 1

        def complete() -> None:
            try:
                self._complete(act, reason)
            finally:
                with self._finishing_lock:
                    self._finishing -= 1

        self._decode.run(complete, act.fail)

    def _complete(self, act: Active, reason: str | None) -> None:
        self.last_active = time.monotonic()  # the idle clock starts when the last stream ends
        if act.failed:
            return
        holds = self._info.capabilities.decoder_holds_audio
        if holds and reason is None and not act.stream.cancelled:
            self._decode_and_deliver(act, cast(LookaheadDecoder, act.decoder).finish)
        fill_final_timing(act, self.sample_rate, reason, self.keep_codes)
        act.stream._end()

    def _finish_cancelled(self, stream: SynthesisStream, act: Active | None = None) -> None:
        if act is not None:
            self._finish(act, reason="cancelled")
        else:
            stream.timing.finish_reason = "cancelled"
            stream._end()
