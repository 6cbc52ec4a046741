"""``decode_thread=auto``: warm-up times a concurrent workload with and without the decode thread and
keeps the faster; the setting's spellings; the engine serves the same audio after the switch."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from voxcast.config import EngineConfig
from voxcast.engine import delivery as delivery_module
from voxcast.engine import warmup as warmup_module
from voxcast.engine.active import ramp_frames
from voxcast.engine.engine import Engine
from voxcast.engine.warmup import calibration_requests

Factory = Callable[[str], Path]
TEXT = "Hello there, how are you?"


@pytest.mark.parametrize(
    ("raw", "want"),
    [("", "auto"), ("auto", "auto"), ("AUTO", "auto"), ("on", "on"), ("1", "on"), ("true", "on"),
     ("off", "off"), ("0", "off"), ("No", "off")],
)  # fmt: skip
def test_decode_thread_setting_spellings(raw: str, want: str) -> None:
    assert EngineConfig.from_env({"VOXCAST_DECODE_THREAD": raw}).decode_thread == want


def test_decode_thread_bad_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="VOXCAST_DECODE_THREAD"):
        EngineConfig.from_env({"VOXCAST_DECODE_THREAD": "sometimes"})
    with pytest.raises(ValueError, match="VOXCAST_DECODE_THREAD"):
        EngineConfig(decode_thread="maybe")


def test_booleans_still_mean_on_and_off() -> None:
    assert EngineConfig(decode_thread=True).decode_thread == "on"  # type: ignore[arg-type]
    assert EngineConfig(decode_thread=False).decode_thread == "off"  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Factory) -> Iterator[Engine]:
    config = EngineConfig(
        model=str(tiny_model_dir("custom_voice")), device="cpu", chunk_frames=3, warmup=False
    )
    eng = Engine.load(config)
    yield eng
    eng.close()


def _audio(eng: Engine) -> np.ndarray:
    stream = eng.synthesize({"text": TEXT, "voice": "ryan", "greedy": True, "max_frames": 10})
    return np.concatenate([c.pcm for c in stream])


def test_auto_without_warmup_starts_inline(engine: Engine) -> None:
    assert engine.config.decode_thread == "auto"
    assert engine.decode_calibration is None and not engine.decode_threaded


def test_calibration_workload_runs_into_full_chunks(engine: Engine) -> None:
    reqs = calibration_requests(engine)
    assert len(reqs) == 2
    cfg = engine.config
    assert all(
        r.max_frames == ramp_frames(cfg.first_chunk_frames, cfg.chunk_frames) + 2 * cfg.chunk_frames
        for r, _ in reqs
    )
    assert len({r.request_id for r, _ in reqs}) == 2


def _costly_decodes(monkeypatch: pytest.MonkeyPatch, threaded: bool) -> None:
    """Each decode job run by a stage that is (``threaded``) or is not on a thread adds 10 s to the
    clock the calibration reads: a cost no load on the host can outweigh (nothing sleeps)."""
    real_stage = delivery_module.DecodeStage
    late = {"s": 0.0}
    monkeypatch.setattr(
        warmup_module, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + late["s"])
    )

    def stage(on_thread: bool, torch_threads: int = 0, **kwargs: Any) -> Any:
        made = real_stage(on_thread, torch_threads, **kwargs)
        if on_thread == threaded:
            run = made.run

            def costly_run(job: Any, on_error: Any) -> None:
                late["s"] += 10.0
                run(job, on_error)

            made.run = costly_run  # type: ignore[method-assign]
        return made

    monkeypatch.setattr(delivery_module, "DecodeStage", stage)


def test_thread_chosen_when_decoding_overlaps(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding inline costs the frame loop its time; on the thread it overlaps."""
    before = _audio(engine)
    _costly_decodes(monkeypatch, threaded=False)
    engine.use_decode_thread(True)  # so the calibration's inline runs get a (costly) stage of their own
    assert engine.calibrate_decode_thread(rounds=1) is True
    cal = engine.decode_calibration
    assert cal is not None and cal["decode_thread"] is True and cal["on_ms"] < cal["off_ms"]
    assert engine.decode_threaded
    monkeypatch.undo()
    np.testing.assert_array_equal(_audio(engine), before)  # same audio through the thread


def test_inline_kept_when_the_thread_costs_more(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode stage whose worker is slow to pick up jobs loses the comparison."""
    before = _audio(engine)
    _costly_decodes(monkeypatch, threaded=True)
    assert engine.calibrate_decode_thread(rounds=1) is False
    assert not engine.decode_threaded
    monkeypatch.undo()
    np.testing.assert_array_equal(_audio(engine), before)


def test_warmup_calibrates_when_auto(tiny_model_dir: Factory) -> None:
    config = EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", decode_thread="auto")
    eng = Engine.load(config)
    try:
        cal = eng.decode_calibration
        assert cal is not None and set(cal) == {"off_ms", "on_ms", "decode_thread"}
        assert eng.decode_threaded is cal["decode_thread"]
        chunks = list(eng.synthesize({"text": TEXT, "voice": "ryan", "max_frames": 6}))
        assert sum(c.frames for c in chunks) == 6
    finally:
        eng.close()
    fixed = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", decode_thread="on")
    )
    try:
        assert fixed.decode_calibration is None and fixed.decode_threaded
    finally:
        fixed.close()


def test_warmup_remembers_the_choice_per_machine_and_model(
    tiny_model_dir: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second start on the same machine with the same model and settings takes the stored
    choice instead of measuring (VOXCAST_CALIBRATION_DIR); other settings measure again; an
    unreadable record is measured over."""
    monkeypatch.setenv("VOXCAST_CALIBRATION_DIR", str(tmp_path))
    model = str(tiny_model_dir("custom_voice"))

    def start(max_active: int = 4) -> dict[str, Any]:
        eng = Engine.load(
            EngineConfig(model=model, device="cpu", decode_thread="auto", max_active=max_active)
        )
        try:
            assert eng.decode_calibration is not None
            assert eng.decode_threaded is eng.decode_calibration["decode_thread"]
            return dict(eng.decode_calibration)
        finally:
            eng.close()

    first = start()
    assert "cached" not in first and len(list(tmp_path.glob("decode-*.json"))) == 1
    again = start()
    assert again == {**first, "cached": True}
    other = start(max_active=2)
    assert "cached" not in other and len(list(tmp_path.glob("decode-*.json"))) == 2
    for path in tmp_path.glob("decode-*.json"):
        path.write_text("{not json")
    assert "cached" not in start()
    monkeypatch.setenv("VOXCAST_CALIBRATION_DIR", "off")
    assert "cached" not in start()
