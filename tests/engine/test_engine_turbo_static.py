"""The engine with Turbo's static T3 decode step on (``VOXCAST_TURBO_STATIC_DECODE``), tiny checkpoint
without a stop bias, on a CPU: concurrent streams give the same audio as the engine without it (the
CPU path draws the same tokens), and the warm-up built the step."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.testing.chatterbox_turbo import make_t3

TEXTS = ("Hello there, how are you today?", "A second voice [laugh] speaks now.", "And a third one.")


@pytest.fixture(scope="module")
def nostop_dir(turbo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("turbo-nostop") / "m"
    shutil.copytree(turbo_model_dir, out)
    make_t3(out, size="tiny", seed=0, stop_bias=-20.0)
    return out


def _concurrent(engine: Engine) -> list[np.ndarray]:
    out: list[np.ndarray] = [np.zeros(0)] * len(TEXTS)

    def work(i: int) -> None:
        chunks = list(engine.synthesize({"text": TEXTS[i], "seed": 20 + i, "max_frames": 30}))
        out[i] = np.concatenate([c.pcm for c in chunks])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_static_decode_streams_equal_the_eager_engine(nostop_dir: Path) -> None:
    runs = {}
    for static in (False, True):
        config = EngineConfig(
            model=str(nostop_dir), device="cpu", max_active=4, settings={"turbo_static_decode": static}
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
