"""The engine on a CUDA device (tiny random checkpoint): streamed audio equals the one-pass decode of
the same codes, seeds reproduce, concurrent streams keep their codes, bfloat16 stays close to float32.

All marked ``gpu``: skipped where no CUDA device exists (conftest)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine

Factory = Callable[[str], Path]

pytestmark = pytest.mark.gpu


def _engine(tiny_model_dir: Factory, **options: object) -> Engine:
    config = EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cuda", chunk_frames=3, **options)
    return Engine.load(config)


def _say(engine: Engine, **request: object) -> tuple[list, object]:
    stream = engine.synthesize({"text": "Hello there, how are you?", "voice": "ryan", **request})
    return list(stream), stream.timing


@pytest.fixture(scope="module")
def cuda_engine(tiny_model_dir: Factory) -> Engine:
    engine = _engine(tiny_model_dir, dtype="float32")
    yield engine
    engine.close()


def test_the_model_lives_on_the_device(cuda_engine: Engine) -> None:
    params = list(cuda_engine.model.talker.parameters())
    assert params and all(p.device.type == "cuda" for p in params)
    assert cuda_engine.warmed


def test_streamed_equals_the_one_pass_decode_on_cuda(cuda_engine: Engine) -> None:
    cuda_engine.keep_codes = True
    try:
        chunks, timing = _say(cuda_engine, seed=3, max_frames=11)
    finally:
        cuda_engine.keep_codes = False
    assert [c.frames for c in chunks] == [1, 1, 1, 1, 2, 3, 2]
    codes = torch.tensor(timing.extra["codes"])
    offline = cuda_engine.model.codec_decoder.decode_offline(codes)
    streamed = np.concatenate([c.pcm for c in chunks])
    assert streamed.shape == offline.shape and np.isfinite(streamed).all()
    assert np.max(np.abs(streamed - offline)) <= 1e-4


def test_a_seed_reproduces_on_cuda(cuda_engine: Engine) -> None:
    a = np.concatenate([c.pcm for c in _say(cuda_engine, seed=11, max_frames=8)[0]])
    b = np.concatenate([c.pcm for c in _say(cuda_engine, seed=11, max_frames=8)[0]])
    assert np.array_equal(a, b)


def test_concurrent_streams_keep_their_codes(cuda_engine: Engine) -> None:
    """Four greedy streams batched together give the codes each gives alone (>= 90 % on a random model:
    a batched GEMM may round differently from a single row's)."""
    texts = ["One two three.", "Hello there, how are you?", "A longer sentence to say now.", "Bye."]

    def codes(text: str) -> list[list[int]]:
        stream = cuda_engine.synthesize({"text": text, "voice": "ryan", "greedy": True, "max_frames": 10})
        list(stream)
        return stream.timing.extra["codes"]

    cuda_engine.keep_codes = True
    try:
        alone = [codes(t) for t in texts]
        together: list[list[list[int]] | None] = [None] * len(texts)

        def run(i: int) -> None:
            together[i] = codes(texts[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        cuda_engine.keep_codes = False
    same = total = 0
    for a, b in zip(alone, together, strict=True):
        assert b is not None and len(a) == len(b)
        for fa, fb in zip(a, b, strict=True):
            same += sum(x == y for x, y in zip(fa, fb, strict=True))
            total += len(fa)
    assert same / total >= 0.9


def test_bfloat16_on_cuda_streams_exactly_and_stays_close(
    tiny_model_dir: Factory, cuda_engine: Engine
) -> None:
    engine = _engine(tiny_model_dir, dtype="bfloat16")
    try:
        assert engine.precision is not None and not engine.precision.fallbacks
        engine.keep_codes = True
        chunks, timing = _say(engine, greedy=True, max_frames=9)
        codes = torch.tensor(timing.extra["codes"])
        streamed = np.concatenate([c.pcm for c in chunks])
        offline = engine.model.codec_decoder.decode_offline(codes)
        assert np.isfinite(streamed).all() and np.max(np.abs(streamed - offline)) <= 1e-2
        # the same codes through the float32 decoder: bfloat16 audio within a few percent of its level
        reference = cuda_engine.model.codec_decoder.decode_offline(codes)
        err = np.sqrt(np.mean((streamed - reference) ** 2)) / max(np.sqrt(np.mean(reference**2)), 1e-6)
        assert err <= 0.1
    finally:
        engine.close()
