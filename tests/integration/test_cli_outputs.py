"""``voxcast synth`` / ``enqueue``: the output file is checked before anything loads or is enqueued
(a missing directory, the reference audio itself, a format the extension contradicts), and every
command writes what the extension names (voxcast.audio.files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.fixtures.models import TinyModelFactory
from voxcast.audio.pcm import mulaw_decode
from voxcast.serving.cli.main import main
from voxcast.serving.rq.client import QueueClient
from voxcast.serving.rq.config import QueueConfig


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A model path that does not exist: a command that got as far as loading would fail there (1)."""
    monkeypatch.setenv("VOXCAST_MODEL", str(tmp_path / "no-such-model"))
    monkeypatch.setenv("VOXCAST_STORAGE_DIR", str(tmp_path / "store"))


def test_an_output_in_a_missing_directory_fails_before_loading(
    capsys: pytest.CaptureFixture[str], no_model: None
) -> None:
    code, _, err = _run(capsys, "synth", "Hello.", "--voice", "ryan", "--out", "/missing/dir/x.wav")
    assert (code, err) == (2, "error: out: no such directory: /missing/dir\n")


def test_an_output_that_is_the_reference_audio_is_refused(
    capsys: pytest.CaptureFixture[str], no_model: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    me = tmp_path / "me.wav"
    sf.write(me, np.zeros(24000, dtype=np.float32), 24000)
    before = me.read_bytes()
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "synth", "Hi.", "--ref-audio", "me.wav", "--out", str(me))
    assert code == 2 and err.startswith(f"error: out: {me} is also --ref-audio") and me.read_bytes() == before


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--out", "x.mp3", "--format", "wav"], "format"),
        (["--out", "x.sln16", "--sample-rate", "8000"], "sample_rate"),
        (["--out", "x.bin"], "out"),
    ],
)
def test_a_format_the_extension_contradicts_is_refused(
    capsys: pytest.CaptureFixture[str], no_model: None, tmp_path: Path, argv: list[str], field: str
) -> None:
    argv = [a if not a.startswith("x.") else str(tmp_path / a) for a in argv]
    code, _, err = _run(capsys, "synth", "Hello.", "--voice", "ryan", *argv)
    assert code == 2 and err.startswith(f"error: {field}: "), err


def test_synth_writes_what_the_extension_names(
    capsys: pytest.CaptureFixture[str], tiny_model_dir: TinyModelFactory, tmp_path: Path
) -> None:
    model = str(tiny_model_dir("custom_voice"))
    common = ["--model", model, "--voice", "ryan", "--seed", "1", "--max-frames", "6", "--no-cache"]
    aac, ulaw = tmp_path / "x.aac", tmp_path / "x.ulaw"
    assert _run(capsys, "synth", "Hello.", *common, "--out", str(aac))[0] == 0
    head = aac.read_bytes()[:2]
    assert head[0] == 0xFF and head[1] & 0xF0 == 0xF0  # ADTS sync word: an AAC stream, not a WAV
    code, out, _ = _run(capsys, "synth", "Hello.", *common, "--out", str(ulaw))
    result = json.loads(out)
    raw = ulaw.read_bytes()
    assert code == 0 and raw[:4] != b"RIFF"
    assert len(raw) == round(result["timing"]["audio_s"] * 8000)  # one byte a sample at 8 kHz
    assert np.abs(mulaw_decode(np.frombuffer(raw, np.uint8))).max() > 0


def test_enqueue_requests_the_format_its_out_names(
    capsys: pytest.CaptureFixture[str], redis_url: str, tmp_path: Path
) -> None:
    code, out, err = _run(
        capsys,
        "enqueue",
        "Hello.",
        "--out",
        str(tmp_path / "x.mp3"),
        "--idle-timeout",
        "0.2",
        "--redis-url",
        redis_url,
    )
    assert code == 1 and out == ""  # no worker serves the queue: the job is still queued
    job = QueueClient.connect(QueueConfig(redis_url=redis_url)).job(err.splitlines()[0])
    assert job.args[0]["response_format"] == "mp3"
    code, _, err = _run(
        capsys,
        "enqueue",
        "Hello.",
        "--out",
        str(tmp_path / "x.mp3"),
        "--format",
        "wav",
        "--redis-url",
        redis_url,
    )
    assert code == 2 and '"field": "format"' in err
    code, _, err = _run(capsys, "enqueue", "Hello.", "--out", "/missing/dir/x.wav", "--redis-url", redis_url)
    assert code == 2 and '"field": "out"' in err
