"""The engine serving Chatterbox Turbo with int8 T3 weights (``VOXCAST_QUANT=int8``), tiny checkpoint
without a stop bias, on a CPU: a request and two concurrent ones run to their frame limit, the same
seed gives the same audio again, and the runtime report names the int8 weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.fixtures.engines import audio_together
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine

TEXTS = ("Hello there, how are you today?", "A second voice speaks now.")


def _audio(engine: Engine, text: str, seed: int) -> np.ndarray:
    chunks = list(engine.synthesize({"text": text, "seed": seed, "max_frames": 20}))
    return np.concatenate([c.pcm for c in chunks])


def test_int8_engine_serves_turbo(turbo_nostop_dir: Path) -> None:
    engine = Engine.load(EngineConfig(model=str(turbo_nostop_dir), device="cpu", quant="int8", max_active=2))
    try:
        report = engine.model.runtime_report()
        assert report["t3_quant"]["linears"] > 0  # type: ignore[index]
        alone = [_audio(engine, t, 5 + i) for i, t in enumerate(TEXTS)]
        assert all(len(a) == (20 + 3) * 960 and np.abs(a).max() > 0 for a in alone)
        assert np.array_equal(alone[0], _audio(engine, TEXTS[0], 5))  # seeded: the same again
        out = audio_together(
            engine, [{"text": t, "seed": 5 + i, "max_frames": 20} for i, t in enumerate(TEXTS)]
        )
        assert all(len(a) == (20 + 3) * 960 for a in out)
    finally:
        engine.close()
