"""The decode stage on tiny random checkpoints: audio decoded on a second thread, overlapped with
generation, with every guarantee of the inline engine (identical audio, order, ends after the last
chunk, per-stream failure, cancellation, close) and no change to other threads' torch pools."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.fixtures.engines import holding_steps
from voxcast.config import EngineConfig
from voxcast.engine.chunks import AudioChunk
from voxcast.engine.decode_stage import DecodeStage
from voxcast.engine.engine import Engine

Factory = Callable[[str], Path]
TEXT = "Hello there, how are you?"


def _config(model_dir: Path, decode_thread: bool) -> EngineConfig:
    return EngineConfig(
        model=str(model_dir), device="cpu", chunk_frames=3, warmup=False, decode_thread=decode_thread
    )


def _engine(model_dir: Path, decode_thread: bool) -> Engine:
    return Engine.load(_config(model_dir, decode_thread))


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Factory) -> Iterator[dict[bool, Engine]]:
    path = tiny_model_dir("custom_voice")
    on = _engine(path, True)
    # One model for both (one load; a second would compute the same bits: no timing picks a kernel
    # that changes them, tests/engine/test_engine_kernel_choices.py).
    pair = {True: on, False: Engine(on.model, _config(path, False), load_ms=on.load_ms)}
    yield pair
    for engine in pair.values():
        engine.close()


class _SpyDecoder:
    """A real streaming decoder that records the thread of each call and may stall or fail."""

    def __init__(self, inner: Any, hook: Callable[[int], None] | None = None) -> None:
        self.inner = inner
        self.hook = hook
        self.threads: list[str] = []

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        self.threads.append(threading.current_thread().name)
        if self.hook is not None:
            self.hook(len(self.threads))
        return self.inner.decode(codes)


def _spy_decoders(
    monkeypatch: pytest.MonkeyPatch, engine: Engine, hook: Callable[[int], None] | None = None
) -> list[_SpyDecoder]:
    made: list[_SpyDecoder] = []
    real = engine.model.new_decoder

    def new_decoder(voice: Any = None, seed: int | None = None) -> _SpyDecoder:
        made.append(_SpyDecoder(real(voice), hook))
        return made[-1]

    monkeypatch.setattr(engine.model, "new_decoder", new_decoder)
    return made


def _run(engine: Engine, **request: Any) -> tuple[list[AudioChunk], Any]:
    stream = engine.synthesize({"text": TEXT, "voice": "ryan", **request})
    return list(stream), stream.timing


def test_audio_identical_with_and_without_the_thread(engines: dict[bool, Engine]) -> None:
    for request in ({"seed": 7, "max_frames": 11}, {"greedy": True, "max_frames": 6, "chunk_frames": 2}):
        (on, t_on), (off, t_off) = _run(engines[True], **request), _run(engines[False], **request)
        assert [c.frames for c in on] == [c.frames for c in off]
        assert [c.seq for c in on] == list(range(len(on)))
        assert b"".join(c.pcm.tobytes() for c in on) == b"".join(c.pcm.tobytes() for c in off)
        assert (t_on.frames, t_on.chunks, t_on.audio_s) == (t_off.frames, t_off.chunks, t_off.audio_s)


def test_later_chunks_decode_on_the_decode_thread_only_when_enabled(
    engines: dict[bool, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first chunk is decoded by the scheduler at once (time to first audio), later ones not."""
    for threaded, later in ((True, "voxcast-decode"), (False, "voxcast-engine")):
        spies = _spy_decoders(monkeypatch, engines[threaded])
        _run(engines[threaded], greedy=True, max_frames=5)
        assert spies[0].threads[0] == "voxcast-engine"
        assert set(spies[0].threads[1:]) == {later} and len(spies[0].threads) == 5


def test_decoding_overlaps_generation(engines: dict[bool, Engine], monkeypatch: pytest.MonkeyPatch) -> None:
    """The second chunk's decode waits for two more batched steps: only possible if they run meanwhile."""
    engine = engines[True]
    steps = [0]
    stepped = threading.Condition()
    real_step = engine.model.step_many

    def step_many(generators: list[Any]) -> list[Any]:
        out = real_step(generators)
        with stepped:
            steps[0] += 1
            stepped.notify_all()
        return out

    overlapped: list[bool] = []

    def second_decode_waits(call: int) -> None:
        if call == 2:
            with stepped:
                target = steps[0] + 2
                overlapped.append(stepped.wait_for(lambda: steps[0] >= target, timeout=10))

    monkeypatch.setattr(engine.model, "step_many", step_many)
    _spy_decoders(monkeypatch, engine, second_decode_waits)
    chunks, timing = _run(engine, greedy=True, max_frames=8)
    assert overlapped == [True]
    assert sum(c.frames for c in chunks) == timing.frames == 8


def test_stream_ends_after_its_last_chunk_with_complete_timing(
    engines: dict[bool, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = threading.Event()
    _spy_decoders(monkeypatch, engines[True], lambda call: slow.wait(0.05))
    chunks, timing = _run(engines[True], seed=4, max_frames=9)
    assert timing.chunks == len(chunks) == 6 and sum(c.frames for c in chunks) == timing.frames == 9
    assert timing.codec_ms >= 6 * 50
    assert 0 < timing.ttfa_ms <= timing.total_ms
    t_submit = chunks[0].t_emit - timing.ttfa_ms / 1000
    assert timing.total_ms >= (chunks[-1].t_emit - t_submit) * 1000 - 1e-3
    assert timing.audio_s == pytest.approx(9 * 0.08)


def test_a_failing_decode_fails_only_its_stream(
    engines: dict[bool, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first stream's second decode fails once a second stream is running alongside it."""
    engine = engines[True]
    expected = b"".join(c.pcm.tobytes() for c in _run(engine, seed=31, max_frames=12)[0])
    second_started = threading.Event()
    made: list[_SpyDecoder] = []
    real = engine.model.new_decoder

    def break_first(call: int) -> None:
        if call == 2:
            second_started.wait(10)
            raise RuntimeError("codec broke")

    def new_decoder(voice: Any = None, seed: int | None = None) -> _SpyDecoder:
        made.append(_SpyDecoder(real(voice), break_first if not made else None))
        if len(made) == 2:
            second_started.set()
        return made[-1]

    monkeypatch.setattr(engine.model, "new_decoder", new_decoder)
    broken = engine.synthesize({"text": TEXT, "voice": "ryan", "seed": 30, "max_frames": 40})
    assert next(broken).seq == 0
    other = engine.synthesize({"text": TEXT, "voice": "ryan", "seed": 31, "max_frames": 12})
    got = b"".join(c.pcm.tobytes() for c in other)
    with pytest.raises(RuntimeError, match="codec broke"):
        list(broken)
    assert got == expected and other.timing.finish_reason == "max_frames"
    assert engine.alive and len(_run(engine, greedy=True, max_frames=2)[0]) > 0


def test_cancel_ends_within_one_frame_behind_a_slow_decoder(
    engines: dict[bool, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the test lets them go, the engine makes three frames and the decode thread finishes no
    chunk: the cancel lands with chunks waiting behind the decoder, and ends the stream all the same
    (at most the chunk being decoded comes out, at most one more frame is made)."""
    engine = engines[True]
    with holding_steps(engine, after=3) as release:
        _spy_decoders(monkeypatch, engine, lambda call: release.wait(60) if call > 1 else None)
        stream = engine.synthesize(
            {"text": "A long text " * 20, "voice": "ryan", "seed": 1, "chunk_frames": 1}
        )
        assert next(stream).frames == 1  # decoded on the scheduler thread
        stream.cancel()
        steps = engine.stats()["steps"]  # counted as they start (+1: one whose check came first)
        release.set()
        rest = list(stream)
    assert len(rest) <= 1
    assert stream.timing.finish_reason == "cancelled" and stream.timing.frames <= 4
    assert engine.stats()["steps"] <= steps + 1


def test_close_joins_the_decode_thread(tiny_model_dir: Factory) -> None:
    engine = _engine(tiny_model_dir("custom_voice"), True)
    worker = engine._scheduler._decode._thread
    assert worker is not None and worker.is_alive()
    assert len(_run(engine, greedy=True, max_frames=3)[0]) > 0
    engine.close()
    assert not worker.is_alive() and not engine.alive


def test_decode_thread_pool_size_leaves_other_threads_alone() -> None:
    before = torch.get_num_threads()
    seen: dict[str, int] = {}

    def record(name: str) -> None:
        seen[name] = torch.get_num_threads()

    stage = DecodeStage(True, torch_threads=1)
    stage.run(lambda: record("decode"), print)
    stage.join(timeout=10)
    fresh = threading.Thread(target=record, args=("fresh",))
    fresh.start()
    fresh.join()
    assert seen == {"decode": 1, "fresh": before} and torch.get_num_threads() == before
