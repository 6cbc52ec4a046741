"""The engine decoding several Turbo streams' chunks in one call (``VOXCAST_TURBO_BATCH_WINDOWS``; their
S3Gen flow windows batched), tiny checkpoint without a stop bias, on a CPU: concurrent streams give the
audio they give with it off (up to float rounding of the batched flow), and batched calls of more than
one stream really ran. Inline (no decode thread) each round's later chunks are decoded together; with
a decode thread chunks batch when they queue up, so the test holds the first batch until they do."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.engines import audio_together
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine

TEXTS = ("Hello there, how are you today?", "A second voice [laugh] speaks now.", "And a third one.")
FRAMES = 30


def _concurrent(engine: Engine) -> list[np.ndarray]:
    requests = [
        {"text": t, "seed": 20 + i, "max_frames": FRAMES, "chunk_frames": 1} for i, t in enumerate(TEXTS)
    ]
    return audio_together(engine, requests)


def _hold_the_first_batch(engine: Engine) -> None:
    """On a decode thread: the first batched decode waits until two more batchable chunks were
    queued behind it, so chunks of several streams are waiting when it returns (not left to timing)."""
    stage = engine._scheduler._decode
    model = engine.model
    queued, more = [0], threading.Event()
    run_batched, decode_many = stage.run_batched, model.decode_many  # type: ignore[attr-defined]

    def counted(*args: object, **kwargs: object) -> None:
        queued[0] += 1
        if queued[0] >= 3:
            more.set()
        run_batched(*args, **kwargs)  # type: ignore[arg-type]

    def held(*args: object, **kwargs: object) -> object:
        more.wait(30)  # a bound: a hang becomes a failure below
        return decode_many(*args, **kwargs)

    stage.run_batched = counted  # type: ignore[method-assign]
    model.decode_many = held  # type: ignore[attr-defined]


@pytest.mark.parametrize("decode_thread", ["off", "on"])
def test_batched_decodes_equal_the_engine_without_them(turbo_nostop_dir: Path, decode_thread: str) -> None:
    runs, counts = {}, {}
    for batch in (False, True):
        config = EngineConfig(
            model=str(turbo_nostop_dir),
            device="cpu",
            max_active=4,
            decode_thread=decode_thread,
            settings={"turbo_batch_windows": batch},
        )
        engine = Engine.load(config)
        try:
            assert engine.capabilities.decodes_together is batch
            if batch and decode_thread == "on":
                _hold_the_first_batch(engine)
            runs[batch] = _concurrent(engine)
            scheduler = engine._scheduler
            counts[batch] = (scheduler.decode_batches, scheduler.decode_batch_rows)
        finally:
            engine.close()
    assert counts[False] == (0, 0)
    batches, rows = counts[True]
    assert batches > 0 and rows > batches, counts  # calls of several streams' chunks ran
    for a, b in zip(runs[False], runs[True], strict=True):
        assert len(a) == (FRAMES + 3) * 960  # 30 tokens + the silence tail
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_a_streams_own_error_in_a_batch_fails_it_alone(
    turbo_nostop_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig(
        model=str(turbo_nostop_dir),
        device="cpu",
        max_active=4,
        decode_thread="off",
        settings={"turbo_batch_windows": True},
    )
    engine = Engine.load(config)
    model = engine.model
    decode_many = model.decode_many  # type: ignore[attr-defined]
    failed: list[object] = []

    def first_fails(decoders: list[object], chunks: list[object]) -> list[object]:
        out = decode_many(decoders, chunks)
        if not failed:  # the first batched call: its first stream's own part fails
            failed.append(decoders[0])
            out[0] = RuntimeError("this stream's own part")
        return out

    monkeypatch.setattr(model, "decode_many", first_fails)
    errors: list[BaseException] = []
    lengths: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(len(TEXTS))

    def work(i: int) -> None:
        start.wait()
        request = {"text": TEXTS[i], "seed": 20 + i, "max_frames": FRAMES, "chunk_frames": 1}
        try:
            n = sum(len(c.pcm) for c in engine.synthesize(request))
        except RuntimeError as e:
            with lock:
                errors.append(e)
            return
        with lock:
            lengths.append(n)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(TEXTS))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        engine.close()
    assert failed and [str(e) for e in errors] == ["this stream's own part"]
    assert lengths == [(FRAMES + 3) * 960] * (len(TEXTS) - 1)  # the others went on to their end
