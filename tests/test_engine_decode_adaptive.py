"""decode_thread="adaptive": the decode thread exists while enough streams are active, and only then."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from voxcast.config import EngineConfig
from voxcast.engine.engine import ADAPTIVE_DECODE_STREAMS, Engine


def _consume(engine: Engine, seed: int, frames: int, out: dict[int, Any]) -> None:
    stream = engine.synthesize({"text": "Hello there.", "voice": "ryan", "seed": seed, "max_frames": frames})
    out[seed] = (list(stream), stream.timing)


def test_thread_starts_under_load_and_ends_when_it_drops(tiny_model_dir: Callable[[str], Path]) -> None:
    config = EngineConfig(
        model=str(tiny_model_dir("custom_voice")),
        device="cpu",
        warmup=False,
        decode_thread="adaptive",
        max_active=4,
    )
    engine = Engine.load(config)
    modes: list[bool] = []
    swap = engine._use_decode_thread

    def spy(threaded: bool) -> None:
        modes.append(threaded)
        swap(threaded)

    engine._use_decode_thread = spy  # type: ignore[method-assign]
    try:
        assert not engine.decode_threaded
        out: dict[int, Any] = {}
        _consume(engine, 0, 6, out)  # one stream: inline
        assert modes == [] and not engine.decode_threaded
        n = ADAPTIVE_DECODE_STREAMS + 1
        threads = [threading.Thread(target=_consume, args=(engine, s, 24, out)) for s in range(1, n + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert modes[:1] == [True]  # started while the streams ran
        deadline = time.monotonic() + 10
        while engine.decode_threaded and time.monotonic() < deadline:
            time.sleep(0.05)
        assert modes[-1] is False and not engine.decode_threaded  # ended once idle
        assert engine.decode_switches == len(modes) >= 2
        for seed in range(n + 1):
            chunks, timing = out[seed]
            assert [c.seq for c in chunks] == list(range(len(chunks)))
            assert sum(c.frames for c in chunks) == timing.frames == (6 if seed == 0 else 24)
            assert sum(len(c.pcm) for c in chunks) == timing.frames * 1920
            assert timing.finish_reason == "max_frames"
    finally:
        engine.close()


@pytest.mark.parametrize("raw", ["adaptive", "ADAPTIVE"])
def test_env_accepts_adaptive(raw: str) -> None:
    assert (
        EngineConfig.from_env({"VOXCAST_MODEL": "x", "VOXCAST_DECODE_THREAD": raw}).decode_thread
        == "adaptive"
    )


def test_env_rejects_other_words() -> None:
    with pytest.raises(ValueError, match="VOXCAST_DECODE_THREAD"):
        EngineConfig.from_env({"VOXCAST_MODEL": "x", "VOXCAST_DECODE_THREAD": "sometimes"})
