"""The engine with ``VOXCAST_BATCH_GRAPHS=on`` (Qwen3-TTS frames in slots, :mod:`voxcast.models.qwen3_tts.accel.batch_frames`):
it serves audio, concurrent streams keep the codes each makes alone (greedy: also the default
path's), a seed reproduces whatever else is batched, a cancelled stream gives its slot back.
On a CPU the frame function runs eagerly; the same checks on CUDA (captured graphs) are marked ``gpu``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.engines import run_together
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine

Factory = Callable[[str], Path]
TEXTS = ["One two three.", "Hello there, how are you?", "A longer sentence to say now, slowly.", "Bye."]


def _engine(tiny_model_dir: Factory, device: str, batch_graphs: str = "off", **fields: Any) -> Engine:
    config = EngineConfig(
        model=str(tiny_model_dir("custom_voice")),
        device=device,
        chunk_frames=3,
        max_active=4,
        settings={"batch_graphs": batch_graphs},
        **fields,
    )
    return Engine.load(config)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Factory) -> Iterator[Engine]:
    e = _engine(tiny_model_dir, "cpu", batch_graphs="on")
    e.keep_codes = True  # every test reads its codes (_codes), whichever of them runs first
    yield e
    e.close()


def _codes(engine: Engine, text: str, **request: object) -> list[list[int]]:
    stream = engine.synthesize({"text": text, "voice": "ryan", "max_frames": 10, **request})
    chunks = list(stream)
    assert chunks and all(np.isfinite(c.pcm).all() for c in chunks)
    return stream.timing.extra["codes"]


def _together(engine: Engine, requests: list[dict[str, object]]) -> list[list[list[int]] | None]:
    return run_together([lambda r=r: _codes(engine, **r) for r in requests])  # type: ignore[arg-type]


def _check_serving(engine: Engine, default: Engine | None) -> None:
    assert engine.model.batched is not None  # type: ignore[attr-defined]
    engine.keep_codes = True
    alone = [_codes(engine, t, greedy=True) for t in TEXTS]
    together = _together(engine, [{"text": t, "greedy": True} for t in TEXTS])
    assert together == alone and all(len(c) == 10 for c in alone)
    if default is not None:
        default.keep_codes = True
        assert [_codes(default, t, greedy=True) for t in TEXTS] == alone
    # a seeded stream says the same alone and among other sampled streams
    seeded = _codes(engine, TEXTS[1], seed=7)
    mixed = _together(engine, [{"text": TEXTS[0]}, {"text": TEXTS[2]}, {"text": TEXTS[1], "seed": 7}])
    assert mixed[2] == seeded


def test_the_engine_serves_with_batch_graphs(engine: Engine, tiny_model_dir: Factory) -> None:
    default = _engine(tiny_model_dir, "cpu")
    try:
        assert default.model.batched is None  # type: ignore[attr-defined]
        _check_serving(engine, default)
    finally:
        default.close()
    assert engine.model.runtime_report()["batch_graphs"] is True  # type: ignore[attr-defined]


def test_a_text_in_pieces_speaks_as_the_default_path(tiny_model_dir: Factory) -> None:
    """A long text is spoken in pieces (a generator each, the next prefilled ahead): each piece's
    generator takes a slot when it first steps and gives it back when it ends."""
    text = "First sentence of the piece test. Second sentence follows it here. A third one ends it."
    engine = _engine(tiny_model_dir, "cpu", "on", piece_chars=40, warmup=False)
    default = _engine(tiny_model_dir, "cpu", piece_chars=40, warmup=False)
    try:
        got: list[list[int]] = []
        want: list[list[int]] = []
        for e, out in ((engine, got), (default, want)):
            e.keep_codes = True
            stream = e.synthesize({"text": text, "voice": "ryan", "greedy": True})
            assert list(stream)
            out.extend(stream.timing.extra["codes"])
        assert got == want and len(got) > 0
        assert engine.model.batched.active == 0  # type: ignore[attr-defined]
    finally:
        engine.close()
        default.close()


def test_the_setting_is_read_from_the_environment() -> None:
    config = EngineConfig.from_env({"VOXCAST_MODEL": "x", "VOXCAST_BATCH_GRAPHS": "on"})
    assert config.settings["batch_graphs"] is True
    with pytest.raises(ValueError, match="VOXCAST_BATCH_GRAPHS"):
        EngineConfig.from_env({"VOXCAST_MODEL": "x", "VOXCAST_BATCH_GRAPHS": "sometimes"})


def test_a_cancelled_stream_gives_its_slot_back(engine: Engine) -> None:
    stream = engine.synthesize({"text": "A long text " * 20, "voice": "ryan", "seed": 1, "chunk_frames": 1})
    next(stream)
    stream.cancel()
    list(stream)
    assert stream.timing.finish_reason == "cancelled"
    _codes(engine, "Next.")  # the next step sweeps the dropped stream's slot
    assert engine.model.batched.active == 0  # type: ignore[attr-defined]


@pytest.mark.gpu
def test_the_engine_serves_with_batch_graphs_on_cuda(tiny_model_dir: Factory) -> None:
    """Captured graphs per bucket (captured at warm-up): the same checks as on the CPU, greedy codes
    against the captured path alone (the default path's rounding differs on CUDA)."""
    e = _engine(tiny_model_dir, "cuda", batch_graphs="on")
    try:
        assert e.model.batched.cuda_graphs and e.model.batched.captures >= 3  # type: ignore[attr-defined]
        _check_serving(e, None)
    finally:
        e.close()
