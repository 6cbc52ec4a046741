"""Word timestamps at every entry point that returns a result: the service (live and from the cache),
the HTTP server's SSE ``done`` event, the WebSocket's ``segment_done`` and the CLI. The toy family
speaks a known tone, so the words each must report are the estimate on that exact audio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from tests.fixtures.http_server import running
from tests.fixtures.models import build_cached
from tests.toy_family.family import MODULE, PITCHES, SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.toy_family.model import FRAMES_PER_WORD, sine
from voxcast import Engine, EngineConfig
from voxcast.audio.word_times import estimate_word_times
from voxcast.models import registry
from voxcast.service import Service, ServiceConfig
from voxcast.serving.cli.main import main
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.storage.local import LocalBlobStore

TEXT = "Thanks for calling us today."
AMPLITUDE = 0.5


def _expected(text: str, voice: str = "low") -> list[dict[str, Any]]:
    """The words of the toy's audio of ``text`` (one tone, three frames a word, at its own rate)."""
    audio = sine(
        PITCHES[voice], 0, FRAMES_PER_WORD * len(text.split()) * SAMPLES_PER_FRAME, SAMPLE_RATE, AMPLITUDE
    )
    return [w.to_dict() for w in estimate_word_times(text, audio, SAMPLE_RATE)]


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    registry.register(MODULE)
    return build_cached("toy_sine")


@pytest.fixture(scope="module")
def service(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    engine = Engine.load(EngineConfig(model=str(checkpoint), device="cpu", settings={"toy_amplitude": 50}))
    yield Service.assemble(ServiceConfig(), engine, LocalBlobStore(tmp_path_factory.mktemp("store")))
    engine.close()


def _result(service: Service, **req: Any) -> Any:
    stream = service.synthesize({"text": TEXT, "voice": "low", **req})
    for _ in stream:
        pass
    return stream.result


def test_words_are_the_estimate_on_the_audio_spoken(service: Service) -> None:
    result = _result(service, word_timestamps=True, seed=1, response_format="pcm")
    assert result.timing.cache_hit is False and result.timing.finish_reason == "eos"
    assert result.words == _expected(TEXT)
    assert [w["word"] for w in result.words] == TEXT.split()
    assert result.words[-1]["end_ms"] <= result.duration_s * 1000 + 1e-6
    assert result.to_dict()["words"] == result.words and "words_ms" in result.timing.extra


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_a_cache_hit_reports_the_words_of_its_stored_audio(service: Service, fmt: str) -> None:
    """A hit reads the stored file back (24 kHz, resampled from the toy's 16 kHz; MP3 with its
    encoder's delay): the same words, each within 10 ms (MP3: its delay of about 50 ms more)."""
    live = _result(service, word_timestamps=True, seed=2, response_format=fmt)
    hit = _result(service, word_timestamps=True, seed=2, response_format=fmt)
    assert live.timing.cache_hit is False and hit.timing.cache_hit is True
    slack = 10 if fmt == "wav" else 70
    assert [w["word"] for w in hit.words] == [w["word"] for w in live.words]
    for a, b in zip(live.words, hit.words, strict=True):
        assert abs(a["start_ms"] - b["start_ms"]) <= slack and abs(a["end_ms"] - b["end_ms"]) <= slack


def test_no_words_unless_asked_or_when_the_text_was_not_spoken_to_its_end(service: Service) -> None:
    plain = _result(service, seed=3)
    assert plain.words is None and "words" not in plain.to_dict()
    cut = _result(service, word_timestamps=True, max_frames=4, seed=5)
    assert cut.timing.finish_reason == "max_frames" and cut.words is None
    cut_hit = _result(service, word_timestamps=True, max_frames=4, seed=5)  # its stored file: cut too
    assert cut_hit.timing.cache_hit is True and cut_hit.words is None
    stream = service.synthesize({"text": TEXT, "voice": "low", "word_timestamps": True, "cache": False})
    next(stream)
    stream.cancel()
    for _ in stream:
        pass
    assert stream.result.timing.finish_reason == "cancelled" and stream.result.words is None


def test_http_sse_and_websocket_report_the_words(service: Service) -> None:
    with running(create_app(ServiceHolder(service), HttpConfig())) as url:
        body = {"input": TEXT, "voice": "low", "stream_format": "sse", "word_timestamps": True}
        with httpx.Client(base_url=url, timeout=60) as http:
            sse = http.post("/v1/audio/speech", json=body)
        events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "speech.audio.done" and events[-1]["result"]["words"] == _expected(TEXT)

        second = "See you soon, friend."
        ws_url = url.replace("http", "ws") + "/v1/audio/speech/stream"
        with connect(ws_url, open_timeout=30) as ws:
            config = {"type": "config", "voice": "low", "response_format": "pcm", "text_mode": "sentences"}
            ws.send(json.dumps({**config, "word_timestamps": True}))
            ws.send(json.dumps({"type": "text", "text": f"{TEXT} {second}"}))
            ws.send(json.dumps({"type": "flush"}))
            done: list[dict[str, Any]] = []
            while len(done) < 2:
                msg = ws.recv(timeout=60)
                if isinstance(msg, str) and json.loads(msg)["type"] == "segment_done":
                    done.append(json.loads(msg))
        assert [d["words"] for d in done] == [_expected(TEXT), _expected(second)]  # each from its own start

        with connect(ws_url, open_timeout=30) as ws:  # words mode: the utterance's text as it arrived
            ws.send(json.dumps({**config, "text_mode": "words", "word_timestamps": True}))
            for delta in ("Thanks for ca", "lling us tod", "ay. See you"):
                ws.send(json.dumps({"type": "text", "text": delta}))
            ws.send(json.dumps({"type": "flush"}))
            while (
                not isinstance(msg := ws.recv(timeout=60), str) or json.loads(msg)["type"] != "segment_done"
            ):
                pass
        assert [w["word"] for w in json.loads(msg)["words"]] == [
            "Thanks",
            "for",
            "calling",
            "us",
            "today.",
            "See",
            "you",
        ]


def test_cli_prints_the_words(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VOXCAST_STORAGE_DIR", str(tmp_path / "store"))
    argv = ["synth", TEXT, "--model", str(checkpoint), "--voice", "low", "--out", str(tmp_path / "a.wav")]
    assert main([*argv, "--word-timestamps"]) == 0
    assert [w["word"] for w in json.loads(capsys.readouterr().out)["words"]] == TEXT.split()


def test_cli_stdin_prints_each_utterances_words(checkpoint: Path, tmp_path: Path) -> None:
    """``synth --stdin --word-timestamps``: each utterance's JSON line (stderr) carries its words."""
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "synth", "--stdin", "--out", "-", "--format", "pcm",
           "--model", str(checkpoint), "--voice", "low", "--word-timestamps"]  # fmt: skip
    env = {**os.environ, "VOXCAST_FAMILIES": MODULE, "VOXCAST_STORAGE_DIR": str(tmp_path / "store")}
    done = subprocess.run(cmd, input=TEXT.encode(), capture_output=True, env=env, cwd=repo, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    lines = [json.loads(x) for x in done.stderr.splitlines() if x.startswith(b"{")]
    assert [w["word"] for w in lines[0]["words"]] == TEXT.split()
