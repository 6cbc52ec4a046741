"""A new user's first run: a demo model that ends its speech, no kernel build for a tiny model, a
one-shot CLI that validates its arguments before loading anything and warms nothing it won't use, and
marks its file when the watermark is on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voxcast import Engine, EngineConfig
from voxcast.kernels import native
from voxcast.serving.cli.main import main
from voxcast.watermark import mark
from voxcast.watermark.perth import PerthWatermarker, find_perth_weights

REPO = Path(__file__).resolve().parents[2]
DEMO_TEXT = "Hello from voxcast. This is streaming speech."  # scripts/demo.sh's default sentence


@pytest.fixture(scope="module")
def demo_model(demo_model_dir: Path) -> Path:
    return demo_model_dir


def test_the_demo_model_ends_its_speech_and_a_replay_comes_from_the_cache(
    demo_model: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VOXCAST_STORAGE_DIR": str(tmp_path / "store")}
    env |= {"VOXCAST_THREADS": "1", "OMP_NUM_THREADS": "1"}  # as the server and worker fixtures
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "synth", DEMO_TEXT, "--model", str(demo_model),
           "--voice", "ryan", "--seed", "8", "--out", str(tmp_path / "demo.wav")]  # fmt: skip
    runs = [subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert "runaway" not in r.stderr and "Traceback" not in r.stderr
    first, second = (json.loads(r.stdout) for r in runs)
    assert first["timing"]["finish_reason"] == "eos" and 12 <= first["timing"]["frames"] <= 80
    assert second["timing"]["finish_reason"] == "cache" and second["timing"]["cache_hit"]
    assert first["timing"]["warmup_ms"] == 0  # a one-shot run warms only its own path
    assert (tmp_path / "demo.wav").read_bytes()[:4] == b"RIFF"


def test_test_checkpoints_still_run_to_their_frame_limit(tiny_model_dir) -> None:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    try:
        from voxcast.engine.request import parse_request

        s = engine.synthesize(
            parse_request({"text": DEMO_TEXT, "voice": "ryan", "seed": 8, "max_frames": 30})
        )
        assert sum(c.frames for c in s) == 30 and s.timing.finish_reason == "max_frames"
    finally:
        engine.close()


def test_a_tiny_float32_model_never_builds_the_native_kernels(
    tiny_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build() -> bool:
        raise AssertionError("the native kernel library was built for a tiny model")

    monkeypatch.setattr(native, "load", no_build)
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    try:
        report = engine.model.runtime_report()
        assert not report["int8_kernel"] and not report["fused_ops"]
        assert not report["f32_rows"]["packed"] and not report["f32_rows"]["rows"]
    finally:
        engine.close()


def test_synth_validates_arguments_before_loading_a_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        [
            "synth",
            "hi",
            "--model",
            str(tmp_path / "no-model"),
            "--sample-rate",
            "12345",
            "--out",
            str(tmp_path / "x.wav"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "sample_rate" in err and "12345" in err
    assert "no-model" not in err and "Traceback" not in err  # the model was never looked at
    code = main(["synth", "hi", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "x.xyz")])
    err = capsys.readouterr().err
    assert code == 2 and "'.xyz'" in err and "no-model" not in err


@pytest.mark.skipif(find_perth_weights() is None, reason="resemble-perth is not installed")
def test_synth_marks_its_file_when_the_watermark_is_on(
    demo_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOXCAST_STORAGE_DIR", str(tmp_path / "store"))
    args = ["synth", DEMO_TEXT, "--model", str(demo_model), "--voice", "ryan", "--seed", "8"]
    assert main([*args, "--out", str(tmp_path / "plain.wav")]) == 0
    monkeypatch.setenv("VOXCAST_WATERMARK", "perth")
    for name in ("marked.wav", "again.wav"):  # rendered and marked, then the marked cache entry
        assert main([*args, "--out", str(tmp_path / name)]) == 0
    plain, sr = sf.read(tmp_path / "plain.wav", dtype="float32")
    marked, _ = sf.read(tmp_path / "marked.wav", dtype="float32")
    assert (tmp_path / "marked.wav").read_bytes() == (tmp_path / "again.wav").read_bytes()
    assert sr == 24000 and len(marked) == len(plain)
    np.testing.assert_allclose(marked, mark(PerthWatermarker.load(), plain, sr), atol=4 / 32768)
    assert np.sqrt(np.mean((marked - plain) ** 2)) > 1e-3  # a mark, not rounding
