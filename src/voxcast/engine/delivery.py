"""Delivery: a stream's frames become chunks of codes, chunks become audio, and streams end.

The scheduler hands the pending frames of a stream to a :class:`Delivery` once they make a chunk.
Chunks of codes go to a :class:`~voxcast.engine.decode_stage.DecodeStage`: with a decode thread the
codec decodes them on a second thread while the scheduler generates the next frames; a stream ends
only after its last chunk was decoded and delivered. For a model that
:class:`~voxcast.models.base.DecodesTogether`, later chunks of several streams waiting for the decoder
(queued behind one another; inline: emitted in one round) are decoded in one ``decode_many`` call.

Kept apart from the frame loop because it is the one part that also runs on the decode thread: what
it touches of an :class:`~voxcast.engine.active.Active` is the decode side's (see its docstring).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import cast

import numpy as np
import torch

from voxcast.engine.active import Active, fill_final_timing, log_extra, next_chunk_frames
from voxcast.engine.chunks import AudioChunk
from voxcast.engine.config import EngineConfig
from voxcast.engine.decode_stage import DecodeStage
from voxcast.engine.model_info import ModelInfo
from voxcast.engine.stream import SynthesisStream
from voxcast.models.base import DecodesTogether, LookaheadDecoder, TTSModel

__all__ = ["HANDOFF_TAKE_S", "Delivery"]

log = logging.getLogger(__name__)

#: Longest wait for consumers to take the first chunks of a step (:meth:`Delivery.hand_off`).
HANDOFF_TAKE_S = 0.005
# Intra-op torch threads of the decode thread: torch's default. Measured (scripts/
# bench_decode_threads.py, 2 cores, the full-size codec on the decode thread against matrix-vector
# "generation" on this one, 3 runs): with 1 decode thread each generation step took 4-4.5x longer and
# the run 3.3-3.6x; with OMP_WAIT_POLICY=PASSIVE the gap vanished, i.e. the generating thread's
# OpenMP team spin-waits for a core the single busy decode thread holds. Default (active) was fastest.
_DECODE_TORCH_THREADS = 0


class Delivery:
    """Emits chunks, decodes them (inline or on the decode stage), delivers audio and ends streams.

    Args:
        config: the engine's settings (chunk sizes and ramp).
        info: the model's constants (sample rate, capabilities).
        model: the loaded model (``decode_many`` of a model that decodes streams together).
        clock: the scheduler's pacing clock (when a stream's delivered audio ends playing).
        handoff_s: the pause after a step that produced streams' first chunks (0: none).
        threaded: decode chunks after a stream's first on a decode thread.
        on_activity: called whenever a chunk is delivered or a stream ends (the engine's idle clock).
    """

    def __init__(
        self,
        config: EngineConfig,
        info: ModelInfo,
        model: Callable[[], TTSModel],
        clock: Callable[[], float],
        handoff_s: float,
        threaded: bool,
        on_activity: Callable[[], None],
    ) -> None:
        self._config = config
        self._info = info
        self._model = model
        self._clock = clock
        self._handoff_s = handoff_s
        self._on_activity = on_activity
        #: Keep every stream's codes in its timing (``extra["codes"]``).
        self.keep_codes = False
        #: Streams ended whose last decode job has not run (admission's decoder rule).
        self.finishing = 0
        self._finishing_lock = threading.Lock()
        #: First chunks handed off (see :meth:`hand_off`; CPU only: a GPU step leaves the cores free).
        self.handoffs = 0
        self._handoffs: list[SynthesisStream] = []
        #: ``decode_many`` calls and the chunks they decoded (rows / batches = the mean batch)
        self.decode_batches = 0
        self.decode_batch_rows = 0
        self.stage = self._new_stage(threaded)

    def use_thread(self, threaded: bool) -> None:
        """Swap the decode stage (only while no stream is running: its jobs would be split)."""
        if threaded == self.stage.threaded:
            return
        old = self.stage
        self.stage = self._new_stage(threaded)
        old.join(timeout=10)

    def _new_stage(self, threaded: bool) -> DecodeStage:
        """A decode stage; it batches chunks of several streams where the model decodes them together."""
        together = self._info.capabilities.decodes_together
        batch = self._decode_batch if together else None
        return DecodeStage(threaded, _DECODE_TORCH_THREADS, batch=batch, clock=self._clock)

    # -- chunks ----------------------------------------------------------------------------------
    def emit(self, act: Active) -> None:
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
        act.target = next_chunk_frames(act, self._config.chunk_frames, self._config.chunk_ramp)
        if act.seq == 0:  # no audio out yet (seq grows only when a chunk with audio is delivered)
            self._decode_chunk(act, codes)
        elif self.stage.batches:
            self.stage.run_batched(act, (act, codes), act.fail)
        else:
            self.stage.run(lambda: self._decode_chunk(act, codes), act.fail)

    def flush_held(self, act: Active) -> None:
        """``act`` waits for its next sentence: its pending frames go out as a chunk now, and the audio
        a look-ahead decoder still holds back is delivered."""
        if act.pending:
            self.emit(act)
        if self._info.capabilities.decoder_holds_audio:
            flush = cast(LookaheadDecoder, act.decoder).flush  # audio held back (look-ahead)
            if act.seq == 0:  # as in emit: inline until the first audio is out (keeps the order)
                self._flush_decoder(act, flush)
            else:
                self.stage.run(lambda: self._flush_decoder(act, flush), act.fail)

    def _flush_decoder(self, act: Active, flush: Callable[[], np.ndarray]) -> None:
        """Deliver the audio a look-ahead decoder still holds (the stream waits for its next sentence)."""
        if not (act.failed or act.stream.cancelled):
            self._decode_and_deliver(act, flush)

    # -- decoding (decode stage) -----------------------------------------------------------------
    def _decode_chunk(self, act: Active, codes: torch.Tensor) -> None:
        """Decode one chunk and deliver it (decode stage; skipped once the stream failed)."""
        if act.failed or (self.stage.threaded and act.stream.cancelled):
            return
        self._decode_and_deliver(act, lambda: act.decoder.decode(codes), int(codes.shape[0]))

    def _decode_batch(self, jobs: list[tuple[Active, torch.Tensor]]) -> None:
        """Decode several streams' chunks (one each) in one ``decode_many`` call and deliver them
        (decode stage); each stream's wall time is its share of the call. A stream's own error fails
        it alone; an error of the call fails every stream in it."""
        live = [(a, c) for a, c in jobs if not (a.failed or (self.stage.threaded and a.stream.cancelled))]
        if len(live) < 2:
            for act, codes in live:
                self._guarded(act, lambda: self._decode_chunk(act, codes))  # noqa: B023 (runs now)
            return
        t0 = time.perf_counter()
        try:
            model = cast(DecodesTogether, self._model())
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
                log.error("request %s failed: %s", act.stream.timing.request_id, pcm, extra=log_extra(act))
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
            log.exception("request %s failed", act.stream.timing.request_id, extra=log_extra(act))
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
        self._on_activity()  # activity counts every chunk (idle unload)
        if not len(pcm):
            act.unsent_frames += frames
            return
        frames, act.unsent_frames = frames + act.unsent_frames, 0
        chunk = AudioChunk(act.seq, pcm, self._info.sample_rate, frames, t1)
        if act.seq == 0:
            act.stream.timing.ttfa_ms = (t1 - act.stream.started_at) * 1000
        now = self._clock()
        act.play_end = max(now if act.play_end is None else act.play_end, now) + chunk.duration_s
        act.seq += 1
        act.samples += len(pcm)
        act.emits.append(t1)
        act.durations.append(chunk.duration_s)
        act.stream._put(chunk)
        if chunk.seq == 0 and self._handoff_s > 0:
            self._handoffs.append(act.stream)

    def hand_off(self) -> None:
        """Let the first chunks of this step reach their clients before the next frames (none: no pause).

        On a CPU the next step's threads take both cores the moment a chunk is out, so the threads
        that carry it on (the consumer, a server's event loop, the socket) wait to be scheduled: a
        few ms of loopback overhead on 2 cores. Once per stream start the scheduler waits until the
        consumers took their chunks (at most :data:`HANDOFF_TAKE_S`), then pauses ``handoff_ms``.
        """
        if not self._handoffs:
            return
        deadline = time.perf_counter() + HANDOFF_TAKE_S
        for stream in self._handoffs:
            stream._taken.wait(max(0.0, deadline - time.perf_counter()))
        self.handoffs += len(self._handoffs)
        self._handoffs.clear()
        time.sleep(self._handoff_s)

    # -- the end of a stream ---------------------------------------------------------------------
    def finish(self, act: Active, reason: str | None = None) -> None:
        """End the request once its chunks are out: queued behind them on the decode stage (until
        then it counts as finishing: admission's decoder rule)."""
        with self._finishing_lock:
            self.finishing += 1

        def complete() -> None:
            try:
                self._complete(act, reason)
            finally:
                with self._finishing_lock:
                    self.finishing -= 1

        self.stage.run(complete, act.fail)

    def _complete(self, act: Active, reason: str | None) -> None:
        self._on_activity()  # the idle clock starts when the last stream ends
        if act.failed:
            return
        holds = self._info.capabilities.decoder_holds_audio
        if holds and reason is None and not act.stream.cancelled:
            self._decode_and_deliver(act, cast(LookaheadDecoder, act.decoder).finish)
        fill_final_timing(act, self._info.sample_rate, reason, self.keep_codes)
        act.stream._end()

    def finish_cancelled(self, stream: SynthesisStream, act: Active | None = None) -> None:
        """End a cancelled stream: behind its chunks once it is active (``act``), else at once."""
        if act is not None:
            self.finish(act, reason="cancelled")
        else:
            stream.timing.finish_reason = "cancelled"
            stream._end()
