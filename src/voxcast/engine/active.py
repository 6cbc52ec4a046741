"""One admitted request inside the engine: its state, its chunk schedule and its final timing.

The scheduler thread and the decode jobs share an :class:`Active` per request; when the request
ends, :func:`fill_final_timing` turns what both sides recorded into the stream's timing record.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from voxcast.engine.stream import SynthesisStream
from voxcast.engine.timing import playback_stalls
from voxcast.models.base import FrameGenerator, OpenPrompt, StreamingDecoder

__all__ = ["Active", "fill_final_timing", "log_extra", "next_chunk_frames", "ramp_frames"]

log = logging.getLogger(__name__)


@dataclass
class Active:
    """State of one admitted request.

    The scheduler thread owns ``pending``, ``target``, ``frames`` and ``codes``; the decode jobs
    (decode thread, or inline) own ``decoder``, ``seq``, ``samples``, ``codec_s``, ``emits``,
    ``play_end`` and ``durations``. ``failed`` is set once by whichever side fails the stream; both then skip it.
    """

    stream: SynthesisStream
    generator: FrameGenerator
    decoder: StreamingDecoder
    max_frames: int
    pending: list[torch.Tensor] = field(default_factory=list)
    target: int = 1
    seq: int = 0
    frames: int = 0
    #: frames decoded whose audio the decoder still holds back (look-ahead): counted with the next chunk
    unsent_frames: int = 0
    samples: int = 0
    codec_s: float = 0.0
    emits: list[float] = field(default_factory=list)
    #: When the audio delivered so far has finished playing for a listener who started at the first
    #: chunk (the scheduler's clock; None before the first chunk): its slack is ``play_end - now``.
    play_end: float | None = None
    #: When the stream began skipping rounds for pacing (the scheduler's clock; None: it stepped last round).
    skipping_since: float | None = None
    durations: list[float] = field(default_factory=list)
    codes: list[torch.Tensor] = field(default_factory=list)
    first: int = 1
    failed: bool = False
    #: A long text's pieces still to speak after the current one (see :class:`Piece`).
    pieces: list[str] = field(default_factory=list)
    #: The next piece's generator, prefilled ahead between frames while this one plays.
    ahead: FrameGenerator | None = None
    ahead_frames: int = 0
    ahead_ready: bool = False
    #: One record per piece spoken so far (the current one last), and finished pieces' stage times.
    piece_log: list[dict[str, Any]] = field(default_factory=list)
    stage_totals: dict[str, float] = field(default_factory=dict)
    #: Text arriving in pieces: the prompt it feeds, the feed version it has seen, when the stream
    #: began waiting for text (None: not waiting), how long and how often it waited.
    prompt: OpenPrompt | None = None
    #: Text in sentences (a layout that needs whole text): the sentences taken so far, and whether
    #: the stream waits for the next one (its pieces are spoken, its text is not complete).
    sentences: Any = None
    text_wait: bool = False
    seen: int = -1
    wait_since: float | None = None
    wait_s: float = 0.0
    waits: int = 0

    @property
    def waiting_text(self) -> bool:
        """Whether the stream waits for text: its next token, or (a whole-text layout) its next sentence."""
        return self.text_wait or self.generator.waiting

    def close_piece(self, finish_reason: str) -> None:
        """Complete the current piece's record (its frames and why it ended)."""
        if self.piece_log:
            piece = self.piece_log[-1]
            piece["frames"] = self.frames - piece.pop("first_frame")
            piece["finish_reason"] = finish_reason

    def fail(self, exc: BaseException) -> None:
        """End the stream with ``exc``; later chunks and the end of this request are skipped."""
        self.failed = True
        self.stream._fail(exc)


def log_extra(act: Active) -> dict[str, Any]:
    """``extra`` naming an active stream's request on a line the engine thread logs."""
    return {"request_id": act.stream.timing.request_id}


def next_chunk_frames(act: Active, chunk_frames: int, ramp: bool) -> int:
    """Frames in the next chunk: the request's ``chunk_frames`` (else the engine's), ramped up from
    the first chunk when ``ramp`` is on.

    With the ramp each chunk is at most half as long as the audio already sent, but never shorter
    than the first chunk (1, 1, 1, 1, 2, 3, 4, 4, ...: :func:`ramp_frames`): a fixed 1, 4, 4
    schedule stalls whenever four frames take longer than the first 80 ms, and a chunk as long as
    all the audio sent so far (1, 1, 2, 4, an earlier ramp) arrives after that audio has
    played out once a frame costs more than about half its 80 ms.
    Measured with one int8 stream on 2 AMD Zen 5 cores (~62 ms a frame end to end; 4 x 40 frames
    alternated in one engine): 172 -> 121 ms of stall per stream (median), the same total time; two
    streams, slower than real time, unchanged (457 vs 461 ms).
    """
    size = act.stream.request.chunk_frames or chunk_frames
    return _ramped(act.first, size, act.frames) if ramp else size


def _ramped(first: int, size: int, sent: int) -> int:
    """The ramp's next chunk after ``sent`` frames: half of them, at least ``first``, at most ``size``."""
    return min(size, max(first, sent // 2))


def ramp_frames(first: int, size: int) -> int:
    """Frames the ramp takes from a ``first``-frame chunk through its first ``size``-frame chunk."""
    sent = first
    while True:
        n = _ramped(first, size, sent)
        sent += n
        if n == size:
            return sent


def fill_final_timing(act: Active, sample_rate: int, reason: str | None, keep_codes: bool) -> None:
    """Complete ``act.stream.timing`` once the request's last chunk was delivered.

    Args:
        act: the finished request.
        sample_rate: of the delivered audio.
        reason: why it ended, when not the generator's own finish reason (e.g. "cancelled").
        keep_codes: also store the generated codes in ``timing.extra["codes"]``.
    """
    t = act.stream.timing
    gen = act.generator
    stages = dict(act.stage_totals)
    for k, v in gen.stage_ms().items():
        stages[k] = stages.get(k, 0.0) + v
    t.talker_ms = stages.get("talker_ms", 0.0)
    t.code_predictor_ms = stages.get("code_predictor_ms", 0.0)
    t.codec_ms = act.codec_s * 1000
    t.total_ms = (time.perf_counter() - act.stream.started_at) * 1000
    t.frames = act.frames
    t.chunks = act.seq
    t.audio_s = act.samples / sample_rate
    t.rtf = (t.total_ms / 1000) / t.audio_s if t.audio_s else 0.0
    t.stalls, stall_s = playback_stalls(act.emits, act.durations)
    t.stall_ms = stall_s * 1000
    t.finish_reason = reason or gen.finish_reason or "eos"
    if t.finish_reason == "eos" and t.extra.get("text_timeout"):
        t.finish_reason = "text_timeout"  # spoke to its end after its text stopped arriving
    # Hitting a limit the caller set is what they asked for; hitting the derived one is a runaway.
    derived = act.stream.request.max_frames is None
    t.runaway = derived and t.finish_reason == "max_frames"
    if t.runaway:
        log.warning(
            "request %s hit its frame limit (%d): flagged runaway",
            t.request_id,
            act.max_frames,
            extra={"request_id": t.request_id},
        )
    if t.pieces > 1 and act.piece_log:
        act.close_piece(t.finish_reason)
        t.extra["pieces"] = act.piece_log
        t.runaway = t.runaway or (derived and any(p["finish_reason"] == "max_frames" for p in act.piece_log))
    if act.prompt is not None or act.sentences is not None:
        t.extra["text_in_pieces"] = {
            "tokens": act.prompt.text_tokens if act.prompt is not None else None,
            "waits": act.waits,
            "wait_ms": round(act.wait_s * 1000, 1),
        }
    if keep_codes and act.codes:
        t.extra["codes"] = torch.cat(act.codes).tolist()
