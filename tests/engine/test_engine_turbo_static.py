"""The engine with Turbo's static T3 decode step on (``VOXCAST_TURBO_STATIC_DECODE``), tiny checkpoint
without a stop bias, on a CPU: concurrent streams give the same audio as the engine without it (the
CPU path draws the same tokens), and the warm-up built the step."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.fixtures.engines import audio_together
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine

TEXTS = ("Hello there, how are you today?", "A second voice [laugh] speaks now.", "And a third one.")


def _concurrent(engine: Engine) -> list[np.ndarray]:
    return audio_together(
        engine, [{"text": t, "seed": 20 + i, "max_frames": 30} for i, t in enumerate(TEXTS)]
    )


def test_static_decode_streams_equal_the_eager_engine(turbo_nostop_dir: Path) -> None:
    runs = {}
    for static in (False, True):
        config = EngineConfig(
            model=str(turbo_nostop_dir), device="cpu", max_active=4, settings={"turbo_static_decode": static}
        )
        engine = Engine.load(config)
        try:
            report = engine.model.runtime_report()
            assert bool(report["t3_static_decode"]) is static
            runs[static] = _concurrent(engine)
            if static:
                used = engine.model.static  # type: ignore[attr-defined]
                assert used.steps > 0 and used.rows > used.steps  # it ran, batched
                assert used._free == list(range(4))  # every slot came back
        finally:
            engine.close()
    for a, b in zip(runs[False], runs[True], strict=True):
        assert len(a) == (30 + 3) * 960  # 30 tokens + the silence tail
        assert np.array_equal(a, b)
