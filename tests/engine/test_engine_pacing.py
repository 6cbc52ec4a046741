"""Streaming-aware pacing in the engine (tiny model, fake clock): a new request's first chunk is not
queued behind frames of streams that are far enough ahead of playback.

The scheduler's clock is injected, so slack (audio delivered ahead of a listener who started at the
first chunk) is decided by the test, not by how fast this machine runs: a frozen clock means every
delivered chunk is still unplayed (lots of slack); a clock that jumps a second on every reading means
every stream is behind playback (no slack). The model's batched step and the generators' prefill parts
are recorded in order; the tests assert which streams stepped while the new one waited for its first
chunk, never how long anything took.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine

Factory = Callable[[str], Path]
LONG = "A stream that has been speaking for a while is well ahead of its listener by now."
NEW = "A new caller waits for the first audio of a reply that starts right away, please."


class FakeClock:
    """Frozen (``step=0``), or moving ``step`` seconds at every reading."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        if self.step:  # a frozen clock never writes: a test may move it from its own thread
            self.now += self.step
        return self.now


class Recorder:
    """Records the engine model's batched steps and prefill parts, in order, by generator number
    (0: the first generator built, 1: the second, ...)."""

    def __init__(self, model: Any) -> None:
        self.events: list[tuple[str, frozenset[int]]] = []
        #: Each generator's frame limit, in the order they were built (a request's ``max_frames``).
        self.limits: list[int] = []
        self._ids: dict[int, int] = {}
        inner_new, inner_step = model.new_generator, model.step_many

        def new_generator(*a: Any, **kw: Any) -> Any:
            gen = inner_new(*a, **kw)
            n = self._ids[id(gen)] = len(self._ids)
            self.limits.append(a[2])
            inner_part = gen.prefill_part

            def prefill_part(limit: int | None) -> bool:
                self.events.append(("prefill", frozenset({n})))
                return bool(inner_part(limit))

            gen.prefill_part = prefill_part
            return gen

        def step_many(gens: list[Any]) -> list[Any]:
            self.events.append(("step", frozenset(self._ids[id(g)] for g in gens)))
            return list(inner_step(gens))

        model.new_generator, model.step_many = new_generator, step_many

    def window(self, new: int) -> list[tuple[str, frozenset[int]]]:
        """The events from generator ``new``'s first prefill part through its first step."""
        start = next(i for i, (kind, ids) in enumerate(self.events) if kind == "prefill" and new in ids)
        end = next(i for i, (kind, ids) in enumerate(self.events) if kind == "step" and new in ids)
        return self.events[start : end + 1]


@pytest.fixture
def engine_on(tiny_model_dir: Factory) -> Iterator[Callable[..., tuple[Engine, Recorder]]]:
    made: list[Engine] = []

    def make(clock: FakeClock, horizon_ms: float = 300.0, **settings: Any) -> tuple[Engine, Recorder]:
        config = EngineConfig(
            model=str(tiny_model_dir("custom_voice")),
            device="cpu",
            warmup=False,
            prefill_chunk=4,  # the new request's prefill runs in several parts
            handoff_ms=0,
            slack_horizon_ms=horizon_ms,
            # unless a test says otherwise, every chunk delivered on the scheduler thread: one order of events
            **{"decode_thread": "off", **settings},
        )
        engine = Engine.load(config, clock=clock)
        made.append(engine)
        return engine, Recorder(engine.model)

    yield make
    for engine in made:
        engine.close()


def _request(text: str, frames: int) -> dict[str, Any]:
    return {"text": text, "voice": "ryan", "max_frames": frames, "greedy": True}


def _run_past(engine: Engine, chunks: int, **flags: Any) -> Any:
    """A long stream that has delivered ``chunks`` chunks (still generating)."""
    stream = engine.synthesize(_request(LONG, 4000), **flags)
    for _ in range(chunks):
        next(stream)
    return stream


def _new_first_chunk(engine: Engine) -> Any:
    new = engine.synthesize(_request(NEW, 40))
    first = next(new)
    assert first.seq == 0
    return new


def test_streams_with_slack_skip_rounds_until_the_new_request_has_its_first_chunk(
    engine_on: Callable[..., tuple[Engine, Recorder]],
) -> None:
    engine, rec = engine_on(FakeClock())  # frozen: everything delivered is still ahead of playback
    old = _run_past(engine, 6)  # 1+1+1+1+2+3 frames = 720 ms delivered > 300 ms horizon
    new = _new_first_chunk(engine)
    window = rec.window(1)
    assert sum(kind == "prefill" for kind, _ in window) > 1  # the prefill ran in parts...
    assert all(0 not in ids for kind, ids in window if kind == "step")  # ...and no frame of 0 between
    assert window[-1] == ("step", frozenset({1}))
    assert engine.stats()["skipped_rows"] > 0
    next(new)  # once the first chunk is out, both step again, batched together
    assert ("step", frozenset({0, 1})) in rec.events
    old.cancel()
    new.cancel()


def test_streams_without_slack_keep_their_frames(engine_on: Callable[..., tuple[Engine, Recorder]]) -> None:
    engine, rec = engine_on(FakeClock(step=1.0))  # a second passes at every reading: always behind
    old = _run_past(engine, 6)
    new = _new_first_chunk(engine)
    steps = [ids for kind, ids in rec.window(1) if kind == "step"]
    assert steps and all(0 in ids for ids in steps)  # stepped between the parts and with the new one
    assert engine.stats()["skipped_rows"] == 0
    old.cancel()
    new.cancel()


def test_streams_without_a_listener_yield_however_far_behind(
    engine_on: Callable[..., tuple[Engine, Recorder]],
) -> None:
    clock = FakeClock()
    engine, rec = engine_on(clock)
    batch = _run_past(engine, 6, realtime=False)  # a prerender or queue job: no deadline
    clock.now += 10.0  # far behind playback, but it has not skipped a round yet (MAX_SKIP_S)
    new = _new_first_chunk(engine)
    assert all(0 not in ids for kind, ids in rec.window(1) if kind == "step")
    batch.cancel()
    new.cancel()


def test_a_stream_without_a_listener_steps_once_it_skipped_for_max_skip_s(
    engine_on: Callable[..., tuple[Engine, Recorder]],
) -> None:
    engine, rec = engine_on(FakeClock(step=1.0))  # a second per reading: a round is 2+ s, past MAX_SKIP_S
    batch = _run_past(engine, 6, realtime=False)
    new = _new_first_chunk(engine)
    steps = [ids for kind, ids in rec.window(1) if kind == "step"]
    assert any(0 in ids for ids in steps)  # batch work progresses while a new request waits...
    assert engine.stats()["skipped_rows"] > 0  # ...having skipped first
    batch.cancel()
    new.cancel()


def test_a_live_caller_is_admitted_before_a_batch_backlog(
    engine_on: Callable[..., tuple[Engine, Recorder]],
) -> None:
    engine, rec = engine_on(FakeClock(), max_active=1)
    running = _run_past(engine, 1)  # holds the only slot: the others wait in the queue
    waiting = [engine.synthesize(_request(NEW, n), realtime=False) for n in (6, 7)]
    waiting.append(engine.synthesize(_request(NEW, 5), realtime=True))
    for stream in waiting:
        stream._start()  # queued now, in this order (next() would block until it is admitted)
    running.cancel()
    for stream in waiting:
        assert sum(c.frames for c in stream) > 0
    assert rec.limits == [4000, 5, 6, 7]  # the live caller first, then the batch jobs in order


def test_batch_jobs_waiting_do_not_count_against_a_live_caller(
    engine_on: Callable[..., tuple[Engine, Recorder]],
) -> None:
    # the frozen clock measures every round at 0 s: only the slots can refuse
    engine, _ = engine_on(FakeClock(), max_active=1, admission_queue=1)
    running = _run_past(engine, 1)
    batch = engine.synthesize(_request(NEW, 4), realtime=False)
    batch._start()
    assert engine.over_capacity() is None  # a live caller would wait behind the running stream only
    live = engine.synthesize(_request(NEW, 4), realtime=True)
    live._start()
    reason = engine.over_capacity()  # the next one would wait behind two: the running one and this
    assert reason is not None and "VOXCAST_MAX_ACTIVE" in reason
    for stream in (running, batch, live):
        stream.cancel()


def test_with_pacing_off_every_stream_steps_every_round(
    engine_on: Callable[..., tuple[Engine, Recorder]],
) -> None:
    engine, rec = engine_on(FakeClock(), horizon_ms=0)
    old = _run_past(engine, 6)
    new = _new_first_chunk(engine)
    assert any(0 in ids for kind, ids in rec.window(1) if kind == "step")
    assert engine.stats()["skipped_rows"] == 0
    old.cancel()
    new.cancel()


def test_an_idle_engine_admits_a_refusable_request(engine_on: Callable[..., tuple[Engine, Recorder]]) -> None:
    engine, _ = engine_on(FakeClock())
    assert engine.over_capacity() is None
    chunks = list(engine.synthesize(_request(NEW, 6), refusable=True))
    assert sum(c.frames for c in chunks) == 6


def test_a_decode_thread_that_falls_behind_refuses_one_more(
    engine_on: Callable[..., tuple[Engine, Recorder]],
) -> None:
    """The rounds are free (a frozen clock) but each later chunk's decode, on the decode thread, takes
    0.5 s of the clock: the thread is busy all the time, so one more live stream would stall them all."""
    clock = FakeClock()
    engine, _ = engine_on(clock, decode_thread="on")
    costly = {"on": False}
    inner_new = engine.model.new_decoder

    def new_decoder(*a: Any, **kw: Any) -> Any:
        decoder = inner_new(*a, **kw)
        inner_decode = decoder.decode

        def decode(codes: Any) -> Any:
            if costly["on"]:
                clock.now += 0.5
            return inner_decode(codes)

        decoder.decode = decode
        return decoder

    engine.model.new_decoder = new_decoder
    running = _run_past(engine, 6)
    assert engine.over_capacity() is None  # decodes that cost no time: the thread is idle
    costly["on"] = True
    for _ in range(4):
        next(running)
    reason = engine.over_capacity()
    assert reason is not None and "decoder is busy" in reason
    assert engine.capacity()["decode_busy"] > 0.8
    running.cancel()
