"""The scheduler: the frame loop that streams every admitted request through one model.

One thread admits new requests (prompt + prefill; at most one per round, prefilled in parts, while
others are playing, so they stall by about one part; all waiting ones at once while none has produced
a frame yet) and advances every active request by one frame per round in one batched step
(continuous batching: the talker and code predictor read their weights once for all rows), so
concurrent users share the cost of a frame instead of queueing behind each other.

The scheduler decides what runs in a round; its collaborators do the work, each on state of its own:
:class:`~voxcast.engine.text_intake.TextIntake` feeds text that arrives in pieces to open prompts,
:class:`~voxcast.engine.pieces.Pieces` builds streams and the pieces a long text is spoken in (the
next one prefilled between frames), and :class:`~voxcast.engine.delivery.Delivery` turns frames into
chunks, decodes them (inline or on the decode thread) and ends streams.

The :class:`~voxcast.engine.engine.Engine` owns the scheduler: it loads, warms and unloads the model
and hands streams to :meth:`Scheduler.queue`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from voxcast.engine.active import Active, log_extra
from voxcast.engine.config import EngineConfig
from voxcast.engine.decode_stage import DecodeStage
from voxcast.engine.delivery import HANDOFF_TAKE_S, Delivery
from voxcast.engine.model_info import ModelInfo
from voxcast.engine.pacing import Room, RoundCosts, Row, Waiting, rows_to_step
from voxcast.engine.pieces import Pieces
from voxcast.engine.stream import SynthesisStream
from voxcast.engine.text_intake import TextIntake
from voxcast.errors import EngineUnavailable, InvalidRequest
from voxcast.models.base import FrameGenerator, TTSModel

__all__ = ["HANDOFF_TAKE_S", "Scheduler"]

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.25
#: How long :meth:`Scheduler.close` waits for each engine thread to end.
_CLOSE_S = 10.0


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
        #: When a stream last did something (monotonic s): the engine's idle clock.
        self.last_active = time.monotonic()
        #: Streams waiting for a slot, taken real-time first (:class:`~voxcast.engine.pacing.Waiting`).
        self._pending: Waiting[SynthesisStream] = Waiting()
        self._active: list[Active] = []
        self._prefilling: list[Active] = []  # admitted, prefill interleaved with the active frames
        #: Set whenever the scheduler may have work: a request queued, text pushed, a stream cancelled.
        self._wake = threading.Event()
        self._stopping = threading.Event()
        #: Batched model steps run, and the rows they held (rows / steps = the mean batch size).
        self.steps = 0
        self.step_rows = 0
        threaded = config.decode_thread == "on"
        self._delivery = Delivery(config, info, model, clock, handoff_s, threaded, self._touch)
        self._pieces = Pieces(config, info, model)
        self._intake = TextIntake(config, model, self._pieces, self._delivery, self._active, self._prefilling)
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

    @property
    def _decode(self) -> DecodeStage:
        """The decode stage (the delivery's; :meth:`use_decode_thread` swaps it)."""
        return self._delivery.stage

    @property
    def keep_codes(self) -> bool:
        """Keep every stream's codes in its timing (``extra["codes"]``)."""
        return self._delivery.keep_codes

    @keep_codes.setter
    def keep_codes(self, value: bool) -> None:
        self._delivery.keep_codes = value

    @property
    def handoffs(self) -> int:
        """First chunks handed off (:meth:`~voxcast.engine.delivery.Delivery.hand_off`)."""
        return self._delivery.handoffs

    @property
    def decode_batches(self) -> int:
        """``decode_many`` calls (a model that decodes streams together)."""
        return self._delivery.decode_batches

    @property
    def decode_batch_rows(self) -> int:
        """Chunks decoded by ``decode_many`` calls (rows / batches = the mean batch)."""
        return self._delivery.decode_batch_rows

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
        ahead, opening = self._pieces.queued(), self._intake.waiting() > 0
        return bool(self._active or self._prefilling or ahead or opening)

    def close(self) -> None:
        """Stop the scheduler and the decode thread; streams still running end with EngineUnavailable."""
        self._stopping.set()
        self._thread.join(timeout=_CLOSE_S)
        self._decode.join(timeout=_CLOSE_S)
        if self._thread.is_alive():  # inside one long model call (recording a step, a prefill)
            log.warning("engine: the scheduler thread still runs %.0f s after close", _CLOSE_S)

    def use_decode_thread(self, threaded: bool) -> None:
        """Swap the decode stage (only while no stream is running: its jobs would be split)."""
        self._delivery.use_thread(threaded)

    def _touch(self) -> None:
        """A stream did something (a chunk delivered, a stream ended): restart the idle clock."""
        self.last_active = time.monotonic()

    # -- scheduler thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with torch.inference_mode():
                while not self._stopping.is_set():
                    self._wake.clear()  # before looking: a wake-up from here on is not lost
                    t0 = self.clock()
                    self._admit()
                    self._intake.feed()  # after admitting: a new stream's text decides its prefill now
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
            self._intake.fail_all(err)
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
                self._delivery.finish_cancelled(stream)
                continue
            try:
                if stream.feed is not None:
                    self._intake.open(stream)
                elif playing and self.config.prefill_chunk:
                    self._prefilling.append(self._pieces.start(stream, prefill=False))
                else:
                    self._active.append(self._pieces.start(stream))
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
        return Room(held, self._pending.realtime, self.config.max_active, self._delivery.finishing)

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
        return bool(
            self._prefilling or self._pieces.queued() or any(not a.waiting_text for a in self._active)
        )

    def _nobody_playing(self) -> bool:
        """Whether no admitted stream has produced a frame yet (all still before their first audio)."""
        return all(act.frames == 0 for act in self._active)

    def _prefill_part(self) -> None:
        """Advance the oldest interleaved prefill by one part (all of it when nothing else decodes);
        with none waiting, one part of a long text's next piece.

        While nobody plays yet (``burst_admit``), every waiting prefill is run whole this round, as
        :meth:`_admit` does for whole texts: streams whose text arrives in pieces (the WebSocket) and
        that open together start together, instead of one after another in parts.
        """
        if not self._prefilling:
            if self._pieces.queued():
                self._pieces.prefill_ahead(self._active)
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
            self._delivery.finish_cancelled(act.stream)
            return
        try:
            act.stream.timing.prefill_parts += 1
            if act.generator.prefill_part(limit):
                self._prefilling.remove(act)
                self._pieces.prefilled(act)  # may build the next piece's prompt: inside the try too
                self._active.append(act)
        except Exception as e:
            log.exception("request %s failed to prefill", act.stream.timing.request_id, extra=log_extra(act))
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
                self._delivery.finish_cancelled(act.stream, act)
            elif act.waiting_text:
                self._intake.wait_for_text(act)
            else:
                self._intake.resume(act)
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
        self._delivery.hand_off()  # the first chunks of this step reach their clients first
        return len(acts)

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
            "waiting_text": self._intake.waiting() + sum(1 for a in self._active if a.waiting_text),
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
                    self._delivery.emit(act)
                return
            if self._pieces.next_piece(act):
                return
            if act.sentences is not None and act.stream.feed is not None and not act.stream.feed.closed:
                act.text_wait = True  # more sentences may come: wait for them (no step meanwhile)
                self._intake.wait_for_text(act)
                return
            if act.pending:
                self._delivery.emit(act)
            self._active.remove(act)
            self._delivery.finish(act)
        except Exception as e:
            log.exception("request %s failed", act.stream.timing.request_id, extra=log_extra(act))
            if act in self._active:
                self._active.remove(act)
            act.fail(e)
