"""vLLM-Omni's speech fields at every entry point: the schema itself, the real HTTP server (the open
benchmark's exact body, task_type checked against the loaded model, ref_audio URLs), the WebSocket
config, a queued job's payload and the CLI's ``--request``. Tiny CustomVoice checkpoint."""

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
import redis
from websockets.sync.client import connect

from tests.fixtures.http_server import running
from voxcast.engine.request import parse_request
from voxcast.errors import InvalidRequest
from voxcast.service import Service
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.rq.client import QueueClient
from voxcast.serving.rq.config import QueueConfig

REPO = Path(__file__).resolve().parents[2]

#: The open benchmark's (nari-labs/benchmarks tts_bench) canonical body for its vllm-omni target.
BENCH_BODY = {
    "input": "Hello from the open benchmark.",
    "model": "qwen3-tts-1.7b-customvoice",  # any name: one model per server (the harness sends its hub id)
    "voice": "Ryan",
    "language": "English",
    "response_format": "pcm",
    "stream": True,
    "stream_format": "audio",
    "non_streaming_mode": False,
}


def test_the_schema_maps_vllm_omni_names_onto_its_own() -> None:
    req = parse_request(
        {
            "input": "hi",
            "speaker": "Ryan",
            "language": "en",
            "task_type": "CustomVoice",
            "non_streaming_mode": False,
            "max_new_tokens": 120,
            "initial_codec_chunk_frames": 2,
            "stream_format": "sse",
        }
    )
    assert (req.voice, req.language, req.task_type) == ("Ryan", "english", "custom_voice")
    assert (req.non_streaming_text, req.max_frames, req.first_chunk_frames) == (False, 120, 2)
    assert parse_request({"text": "hi", "x_vector_only_mode": True}).x_vector_only is True
    for language in ("English", "english", "EN", "en-US"):
        assert parse_request({"text": "hi", "language": language}).language == "english"
    # the same value under both names is one value; different values are refused naming vLLM-Omni's
    assert parse_request(
        {"text": "hi", "non_streaming_mode": True, "non_streaming_text": True}
    ).non_streaming_text
    for body, field in [
        ({"non_streaming_mode": True, "non_streaming_text": False}, "non_streaming_mode"),
        ({"max_new_tokens": 10, "max_frames": 11}, "max_new_tokens"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": True}, "max_new_tokens"),
        ({"task_type": "Clone"}, "task_type"),
        ({"stream_format": "chunks"}, "stream_format"),
        ({"speaker": "ryan", "voice": "vivian"}, "speaker"),
    ]:
        with pytest.raises(InvalidRequest) as e:
            parse_request({"text": "hi", **body})
        assert e.value.field == field, (body, e.value)


@pytest.fixture(scope="module")
def base_url(tiny_service: Service) -> Iterator[str]:
    with running(create_app(ServiceHolder(tiny_service), HttpConfig())) as url:
        yield url


def _speech(base_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(base_url + "/v1/audio/speech", json=body, timeout=120)


def test_the_open_benchmarks_body_streams_pcm(base_url: str) -> None:
    """Before: 400 ``non_streaming_mode: Extra inputs are not permitted`` on every request."""
    r = _speech(base_url, {**BENCH_BODY, "seed": 4, "max_new_tokens": 12})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].split(";")[0] == "audio/pcm" and len(r.content) > 0
    ours = _speech(
        base_url,
        {"input": BENCH_BODY["input"], "voice": "ryan", "language": "english", "response_format": "pcm",
         "non_streaming_text": False, "seed": 4, "max_frames": 12},
    )  # fmt: skip
    assert ours.content == r.content  # the same request under voxcast's names: the same audio


def test_task_type_must_fit_the_loaded_model(base_url: str) -> None:
    ok = _speech(base_url, {**BENCH_BODY, "task_type": "CustomVoice", "max_new_tokens": 4})
    assert ok.status_code == 200, ok.text
    for task in ("Base", "VoiceDesign"):
        r = _speech(base_url, {**BENCH_BODY, "task_type": task})
        assert r.status_code == 400 and r.json()["error"]["param"] == "task_type", r.text
        assert "custom_voice" in r.json()["error"]["message"]


def test_a_ref_audio_url_is_not_fetched_by_default(base_url: str) -> None:
    body = {
        "input": "hi",
        "ref_audio": "http://127.0.0.1:9/ref.wav",
        "ref_text": "hello",
        "response_format": "pcm",
    }
    r = _speech(base_url, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio", r.text
    assert "VOXCAST_REF_AUDIO_URL_HOSTS" in r.json()["error"]["message"]


def test_the_websocket_config_takes_vllm_omni_fields(base_url: str) -> None:
    url = base_url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    config = {"type": "config", "voice": "Ryan", "language": "English", "task_type": "CustomVoice",
              "non_streaming_mode": False, "max_new_tokens": 4, "seed": 2, "cache": False}  # fmt: skip
    with connect(url, open_timeout=30) as ws:
        ws.send(json.dumps(config))
        ws.send(json.dumps({"type": "text", "text": "Hi."}))
        ws.send(json.dumps({"type": "close"}))
        events = []
        while not events or events[-1].get("type") != "closed":
            raw = ws.recv(timeout=60)
            if isinstance(raw, str):
                events.append(json.loads(raw))
    assert not [e for e in events if e["type"] == "error"], events
    assert [e["timing"]["frames"] for e in events if e["type"] == "segment_done"] == [4]
    with connect(url, open_timeout=30) as ws:
        ws.send(json.dumps({**config, "task_type": "Base"}))
        error = json.loads(ws.recv(timeout=60))
    assert error["type"] == "error" and error["error"]["param"] == "task_type", error


def test_a_queued_job_keeps_the_mapped_fields(redis_client: redis.Redis) -> None:
    client = QueueClient(redis_client, QueueConfig(queues=("vx-vllm",)))
    job_id = client.enqueue({**BENCH_BODY, "task_type": "CustomVoice", "max_new_tokens": 30})
    (payload,) = client.job(job_id).args
    assert payload["non_streaming_text"] is False and payload["max_frames"] == 30
    assert payload["language"] == "english" and payload["task_type"] == "custom_voice"
    with pytest.raises(InvalidRequest) as e:
        client.enqueue({**BENCH_BODY, "non_streaming_mode": True, "non_streaming_text": False})
    assert e.value.field == "non_streaming_mode"


def test_the_cli_request_flag_takes_vllm_omni_fields(tiny_model_dir, tmp_path: Path) -> None:
    out = tmp_path / "x.wav"
    request = {
        "language": "English",
        "task_type": "CustomVoice",
        "non_streaming_mode": False,
        "max_new_tokens": 3,
    }
    run = subprocess.run(
        [sys.executable, "-m", "voxcast.serving.cli.main", "synth", "Hello.", "--voice", "ryan", "--seed", "1",
         "--model", str(tiny_model_dir("custom_voice")), "--out", str(out), "--request", json.dumps(request)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert out.stat().st_size > 44
    bad = subprocess.run(
        [sys.executable, "-m", "voxcast.serving.cli.main", "synth", "Hello.", "--out", str(tmp_path / "y.wav"),
         "--model", str(tiny_model_dir("custom_voice")), "--request", '{"task_type": "Clone"}'],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    assert bad.returncode == 2 and "task_type" in bad.stderr, bad.stderr


def test_a_ref_audio_url_is_fetched_from_an_allowed_host(base_engine, tmp_path: Path) -> None:
    """vLLM-Omni's ref_audio as a URL: fetched where VOXCAST_REF_AUDIO_URL_HOSTS names the host (a
    local file server here), refused naming ref_audio elsewhere; the clone equals the inline one."""
    import base64
    import functools
    import http.server
    import threading

    from tests.fixtures.engines import reference_wav
    from voxcast.service import ServiceConfig
    from voxcast.storage.local import LocalBlobStore

    (tmp_path / "files").mkdir()
    wav = reference_wav(24000, 3.0)
    (tmp_path / "files" / "ref.wav").write_bytes(wav)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "files"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/ref.wav"
    config = ServiceConfig(store_audio=False, ref_audio_url_hosts=frozenset({"127.0.0.1"}))
    service = Service.assemble(config, base_engine, LocalBlobStore(tmp_path / "store", fsync=False))
    try:
        common = {
            "text": "Hi.",
            "ref_text": "A reference.",
            "seed": 3,
            "max_frames": 4,
            "response_format": "pcm",
        }
        fetched = b"".join(
            c.data for c in service.synthesize({**common, "ref_audio": url, "task_type": "Base"})
        )
        inline = b"".join(
            c.data for c in service.synthesize({**common, "ref_audio": base64.b64encode(wav).decode()})
        )
        assert fetched and fetched == inline
        with pytest.raises(InvalidRequest) as e:
            list(service.synthesize({**common, "ref_audio": url.replace("127.0.0.1", "localhost")}))
        assert e.value.field == "ref_audio" and "localhost" in e.value.message
    finally:
        service.close()
        server.shutdown()
