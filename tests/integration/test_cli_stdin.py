"""``voxcast synth --stdin``: text piped in as it arrives, fed word by word into one utterance
(the default) or each sentence spoken once complete (``--text-mode sentences``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import soundfile as sf

Factory = Callable[[str], Path]
REPO = Path(__file__).resolve().parents[2]


def _cmd(model: Path, out: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "voxcast.serving.cli.main", "synth", "--stdin", "--out", out,
        "--model", str(model), "--voice", "ryan", "--seed", "3", "--max-frames", "4", "--device", "cpu", *extra,
    ]  # fmt: skip


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "VOXCAST_STORAGE_DIR": str(tmp_path / "store"),
        "HF_HUB_OFFLINE": "1",
        "VOXCAST_THREADS": "1",  # one OpenMP thread, as the server and worker fixtures
        "OMP_NUM_THREADS": "1",
    }


def test_sentences_are_spoken_as_the_text_arrives(tiny_model_dir: Factory, tmp_path: Path) -> None:
    out = tmp_path / "out.wav"
    proc = subprocess.Popen(
        _cmd(tiny_model_dir("custom_voice"), str(out), "--text-mode", "sentences"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(b"Hello there. How are")
    proc.stdin.flush()
    # the first sentence is spoken while the rest has not been written yet
    while True:
        line = proc.stderr.readline()
        assert line, "the process ended before speaking"
        if line.startswith(b"{"):
            first = json.loads(line)
            break
    assert first["sentence"] == 0 and first["chars"] == len("Hello there.") and first["frames"] == 4
    proc.stdin.write(b" you? Fine, thanks" + "。".encode()[:2])  # a split multi-byte character
    proc.stdin.flush()
    stdout, stderr = proc.communicate(input="。".encode()[2:], timeout=120)  # the rest, then EOF
    assert proc.returncode == 0, stderr.decode()[-2000:]
    later = [json.loads(x) for x in stderr.splitlines() if x.startswith(b"{")]
    assert [s["chars"] for s in later] == [len("How are you?"), len("Fine, thanks。")]
    assert json.loads(stdout)["segments"] == 3
    audio, rate = sf.read(out, dtype="int16")  # a proper WAV file: sizes filled in at the end
    assert rate == 24000 and len(audio) == 3 * 4 * 1920


def test_raw_audio_to_stdout(tiny_model_dir: Factory, tmp_path: Path) -> None:
    done = subprocess.run(
        _cmd(
            tiny_model_dir("custom_voice"),
            "-",
            "--format",
            "mulaw",
            "--sample-rate",
            "8000",
            "--text-mode",
            "sentences",
        ),
        input=b"One. Two.",
        capture_output=True,
        env=_env(tmp_path),
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert len(done.stdout) == 2 * 4 * 640  # two sentences of 4 frames, 8 kHz mu-law


def test_words_are_spoken_as_they_arrive_in_one_utterance(tiny_model_dir: Factory, tmp_path: Path) -> None:
    cmd = _cmd(tiny_model_dir("custom_voice"), "-", "--format", "pcm")
    cmd[cmd.index("--max-frames") + 1] = "40"
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp_path),
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"Hello there, how are")  # no sentence is complete yet
    proc.stdin.flush()
    first = proc.stdout.read(1920 * 2)  # audio of the first words while the rest is unwritten
    assert len(first) == 1920 * 2
    proc.stdin.write(b" you? Fine, thanks" + "。".encode()[:2])  # a split multi-byte character
    proc.stdin.flush()
    stdout, stderr = proc.communicate(input="。".encode()[2:], timeout=120)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    lines = [json.loads(x) for x in stderr.splitlines() if x.startswith(b"{")]
    assert lines[0]["utterance"] == 0 and lines[0]["chars"] == len("Hello there, how are you? Fine, thanks。")
    assert lines[0]["frames"] == 40 and lines[-1]["segments"] == 1
    assert len(first) + len(stdout) == 40 * 1920 * 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--format", "mp3"), "--stdin writes"),
        (("--format", "wav"), "--out - writes raw audio"),
    ],
)
def test_stdin_mode_refuses_what_it_cannot_append(
    tiny_model_dir: Factory, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    done = subprocess.run(
        _cmd(tiny_model_dir("custom_voice"), "-", *args), input=b"Hi.", capture_output=True, env=_env(tmp_path),
        cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr.decode()


def test_text_and_stdin_together_are_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "voxcast.serving.cli.main", "synth", "Hi.", "--stdin", "--out", str(tmp_path / "x.wav")],
        capture_output=True, env=_env(tmp_path), cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "not both" in done.stderr.decode()


def test_words_with_streaming_text_equal_the_whole_text_byte_for_byte(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    """``--streaming-text`` (``non_streaming_text: false``) is the layout text in pieces uses, so the
    text fed word by word gives exactly the bytes of the whole text at once with that flag."""
    model, text = tiny_model_dir("custom_voice"), "Hello there, how are you? Fine, thanks."
    cmd = _cmd(model, "-", "--format", "pcm", "--streaming-text")
    cmd[cmd.index("--max-frames") + 1] = "24"
    # the whole text at once runs beside the piped one (its own store; it reads no cache either)
    whole = tmp_path / "whole.pcm"
    once = [a for a in cmd if a != "--stdin"]
    once[once.index("--out") + 1] = str(whole)
    at_once = subprocess.Popen(
        [*once, "--no-cache", text], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=_env(tmp_path / "whole"), cwd=REPO,
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path), cwd=REPO
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    words = text.split(" ")
    proc.stdin.write(f"{words[0]} {words[1]}".encode())  # "Hello" is complete once the next word starts
    proc.stdin.flush()
    first = proc.stdout.read(1920 * 2)  # spoken from the first word, before the rest is written
    for word in words[2:-1]:
        proc.stdin.write(b" " + word.encode())
        proc.stdin.flush()
    stdout, stderr = proc.communicate(input=b" " + words[-1].encode(), timeout=120)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    pieces = first + stdout

    _, once_err = at_once.communicate(timeout=120)
    assert at_once.returncode == 0, once_err.decode()[-2000:]
    assert len(pieces) == 24 * 1920 * 2 and pieces == whole.read_bytes()
