"""Streaming-aware pacing: which streams take a frame in a round, and whether one more fits.

A listener starts playing a stream at its first chunk's arrival and plays on in real time, pausing
only while it waits for audio (the model of :func:`voxcast.engine.timing.playback_stalls` and of
``scripts/bench_load.py``). A stream's **slack** is the audio it has delivered that the listener has not
played yet: ``play_end - now``. A stream with more slack than a round can cost does not need a frame
this round. So while a new real-time request waits for its first chunk (its prefill runs, its first
frames are generated), streams whose slack exceeds the horizon skip rounds, and the rows that need
frames still run together in one batched step: the new request's first chunk is not queued behind
frames nobody needs yet (the slack scheduling of VoxServe, Kamahori et al. 2026). Streams
without a listener (prerender, batch jobs, responses returned whole) have no deadline and yield to
every new request, but never for longer than :data:`MAX_SKIP_S` in a row, so batch work progresses
however often new requests arrive. With nobody waiting for a first chunk every stream steps every round.
Requests waiting for a slot are admitted real-time first (:class:`Waiting`): a backlog of batch jobs
never delays a live caller.

:class:`RoundCosts` measures a round's time (its batched step, a prefill part, first-chunk decodes)
per batch size; :func:`over_capacity` tells the
entry points that refuse work (HTTP, the WebSocket) whether one more real-time stream would still let
every round finish within a frame of audio, and whether it would wait for a free slot. Everything here
is pure: times come from the scheduler's (injectable) clock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["MAX_SKIP_S", "BusyMeter", "Room", "RoundCosts", "Row", "Waiting", "over_capacity", "rows_to_step"]

T = TypeVar("T")

EWMA_WEIGHT = 0.25
"""Weight of a new round time in its batch size's moving average."""

MIN_SAMPLES = 3
"""Rounds of one batch size measured before its average is trusted (the first may include compiles)."""

RECENT_ROUNDS = 16
"""Rounds whose longest one sizes the horizon's floor (:meth:`RoundCosts.recent_max_s`)."""

MAX_SKIP_S = 2.0
"""Longest a stream without a listener skips rounds in a row: then it takes a frame anyway (so it gets
at least one frame every 2 s while new requests keep arriving; a real-time stream's skips are bounded
by its slack instead)."""


@dataclass(frozen=True)
class Row:
    """What pacing needs to know of one stream that could take a frame this round.

    Attributes:
        realtime: someone listens as it plays (a streamed response); False: no deadline.
        play_end: when the audio delivered so far has finished playing (clock seconds), None before
            the first chunk.
        skipping_since: when the stream began skipping rounds (clock seconds), None if it stepped
            in the last round.
    """

    realtime: bool
    play_end: float | None
    skipping_since: float | None = None

    def slack_s(self, now: float) -> float | None:
        """Audio delivered ahead of playback at ``now`` (negative: the listener waits), None before
        the first chunk."""
        return None if self.play_end is None else self.play_end - now


def rows_to_step(
    rows: Sequence[Row], now: float, horizon_s: float, urgent: bool, max_skip_s: float = MAX_SKIP_S
) -> list[bool]:
    """Which of ``rows`` take a frame this round.

    Args:
        rows: the streams that could step (not waiting for text).
        now: the scheduler clock.
        horizon_s: slack beyond which a real-time stream may skip a round (0: none skips).
        urgent: a real-time request waits for its first chunk (admitted or about to be).
        max_skip_s: how long a row without a listener may skip rounds in a row.

    Returns:
        One flag per row. Not urgent (or no horizon): every row. Urgent: the real-time rows still
        before their first chunk or with at most ``horizon_s`` of slack, and the rows without a
        listener that have skipped for ``max_skip_s``; the rest skip the round.
    """
    if not urgent or horizon_s <= 0:
        return [True] * len(rows)
    out = []
    for row in rows:
        if row.realtime:
            slack = row.slack_s(now)
            out.append(slack is None or slack <= horizon_s)
        else:
            out.append(row.skipping_since is not None and now - row.skipping_since >= max_skip_s)
    return out


class Waiting(Generic[T]):
    """Streams waiting for a slot, taken real-time first: every waiting real-time stream before any
    without a listener, first come first served within each. Put from any thread, taken on the
    scheduler's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: deque[T] = deque()
        self._batch: deque[T] = deque()

    def put(self, item: T, realtime: bool) -> None:
        """Queue ``item`` (``realtime``: someone listens as it plays)."""
        with self._lock:
            (self._live if realtime else self._batch).append(item)

    def take(self) -> T | None:
        """The next stream to admit (None: none waits)."""
        with self._lock:
            for waiting in (self._live, self._batch):
                if waiting:
                    return waiting.popleft()
            return None

    def __len__(self) -> int:
        with self._lock:
            return len(self._live) + len(self._batch)

    @property
    def realtime(self) -> int:
        """Real-time streams waiting: the ones a new real-time stream would wait behind."""
        with self._lock:
            return len(self._live)


class RoundCosts:
    """Measured time of a round with a batched frame step, by batch size (moving averages), and the longest
    recent rounds. The scheduler thread records; any thread reads (admission runs on the caller's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mean: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._recent: deque[float] = deque(maxlen=RECENT_ROUNDS)

    def record_step(self, rows: int, seconds: float) -> None:
        """A round that stepped ``rows`` rows took ``seconds`` (the cost of a frame at that size)."""
        with self._lock:
            n = self._count.get(rows, 0)
            old = self._mean.get(rows, seconds)
            self._mean[rows] = seconds if n == 0 else old + EWMA_WEIGHT * (seconds - old)
            self._count[rows] = n + 1

    def record_round(self, seconds: float) -> None:
        """A whole scheduler round (admission, prefill part, step, first-chunk decodes) took ``seconds``."""
        with self._lock:
            self._recent.append(seconds)

    def recent_max_s(self) -> float:
        """The longest of the last :data:`RECENT_ROUNDS` rounds (0 before any)."""
        with self._lock:
            return max(self._recent, default=0.0)

    def measured(self) -> dict[int, float]:
        """The trusted averages: batch size -> seconds a step."""
        with self._lock:
            return {k: v for k, v in self._mean.items() if self._count.get(k, 0) >= MIN_SAMPLES}

    def predict_s(self, rows: int) -> float | None:
        """The expected step time with ``rows`` rows: measured, else a line fitted through the
        measured sizes (``a + b * rows``, neither negative), else proportional to the one measured
        size; None before any size is trusted. Extrapolating proportionally overestimates a GPU's
        cost (batching is sublinear there): conservative."""
        known = self.measured()
        if rows in known:
            return known[rows]
        if not known:
            return None
        if len(known) == 1:
            ((k, t),) = known.items()
            return t * max(rows, k) / k
        xs, ys = list(known), list(known.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var)
        base = max(0.0, my - slope * mx)
        return base + slope * rows


BUSY_WINDOW_S = 1.0
"""Seconds over which :class:`BusyMeter` measures how busy a worker was."""


class BusyMeter:
    """How busy a worker thread was over the last :data:`BUSY_WINDOW_S` (the decode stage's: a
    stream's later chunks are decoded there, outside the scheduler's rounds). Thread-safe; times are
    the caller's clock's."""

    def __init__(self, window_s: float = BUSY_WINDOW_S) -> None:
        self.window_s = window_s
        self._spans: deque[tuple[float, float]] = deque()
        self._since: float | None = None  # when the job running now started
        self._lock = threading.Lock()

    def start(self, now: float) -> None:
        """A job starts."""
        with self._lock:
            self._since = now

    def stop(self, now: float) -> None:
        """The job started last ends."""
        with self._lock:
            if self._since is not None:
                self._spans.append((self._since, now))
                self._since = None
            while self._spans and self._spans[0][1] <= now - self.window_s:
                self._spans.popleft()

    def fraction(self, now: float) -> float:
        """The share of the last ``window_s`` seconds a job was running (a running job counts up to
        ``now``)."""
        lo = now - self.window_s
        with self._lock:
            spans = [*self._spans, *(((self._since, now),) if self._since is not None else ())]
        busy = sum(max(0.0, min(b, now) - max(a, lo)) for a, b in spans)
        return min(1.0, busy / self.window_s)


@dataclass(frozen=True)
class Room:
    """The engine's occupancy as admission sees it.

    Attributes:
        held: admitted streams that hold a slot (generating or prefilling).
        waiting: real-time streams queued for a slot (streams without a listener wait behind a new
            real-time one, so they do not count).
        max_active: slots.
        finishing: streams whose generation ended but whose last chunks the decode thread has not
            decoded yet (they hold no slot, but the decoder's time).
    """

    held: int
    waiting: int
    max_active: int
    finishing: int = 0

    @property
    def idle(self) -> bool:
        """No stream holds or waits for a slot (streams finishing may still keep the decoder busy)."""
        return self.held == 0 and self.waiting == 0


def over_capacity(
    room: Room, costs: RoundCosts, frame_s: float, load: float, queue: int, decode_busy: float = 0.0
) -> str | None:
    """Why one more real-time stream would not keep every stream viable, or None when it fits.

    Never refuses on an idle engine whose decoder keeps up. Otherwise it refuses when

    - the new stream would wait for a slot behind more than ``queue`` others (``max_active`` full), or
    - the measured round time with every stream it would run together, the new one included, exceeds
      ``load`` x ``frame_s`` (a round must produce a frame of audio for each row faster than that
      frame plays). Before any round is measured this never refuses; or
    - the decode thread, busy ``decode_busy`` of its time with the streams it decodes for (those held
      and those finishing), would be busy more than ``load`` of it with one more (its share grown in
      proportion to the streams): the rounds can be fast while the decoder falls behind (Chatterbox
      Turbo's flow and HiFT on a CPU), and then every stream stalls.

    Args:
        room: the engine's occupancy.
        costs: the measured round times.
        frame_s: the audio duration of one frame (0.08 s at 12.5 Hz).
        load: the share of a frame's duration a round may take, and of its time the decode thread
            may be busy.
        queue: streams that may wait for a slot beyond ``max_active``.
        decode_busy: the share of the last seconds the decode thread was busy (0: none, or inline).
    """
    decoding = room.held + room.finishing
    with_one_more = decoding + room.waiting + 1
    if decoding and decode_busy * with_one_more / decoding > load:  # first: it slows rounds too
        return (
            f"the decoder is busy {decode_busy:.0%} of the time with {decoding} streams: {with_one_more}"
            f" would need about {decode_busy * with_one_more / decoding:.0%}, over {load:g}"
            " (VOXCAST_ADMISSION_LOAD)"
        )
    if room.idle:
        return None
    rows = room.held + room.waiting + 1
    beyond = rows - room.max_active
    if beyond > queue:
        return (
            f"all {room.max_active} streams are taken and {room.waiting} wait"
            f" (VOXCAST_MAX_ACTIVE, VOXCAST_ADMISSION_QUEUE={queue})"
        )
    batch = min(rows, room.max_active)
    step_s = costs.predict_s(batch)
    if step_s is not None and step_s > load * frame_s:
        return (
            f"a round of {batch} streams takes about {step_s * 1000:.0f} ms, over"
            f" {load:g} x the {frame_s * 1000:.0f} ms a frame plays (VOXCAST_ADMISSION_LOAD)"
        )
    return None
