"""The HTTP server with real clients: the official ``openai`` SDK, httpx, curl and raw sockets, against
uvicorn on a free loopback port serving tiny checkpoints."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.fixtures.engines import reference_wav, sharing_steps
from tests.fixtures.http_server import Recorder, ended, loading_holder, running
from voxcast.audio.pcm import float_to_int16
from voxcast.audio.stretch import stretch
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.storage.local import LocalBlobStore

Factory = Callable[[str], Path]
KEY = "sk-test-key"
SAY = {"model": "tts", "input": "Hello there, how are you?", "voice": "ryan"}


@pytest.fixture(scope="module")
def server(tiny_service: Service) -> Iterator[tuple[str, Any, Recorder]]:
    """(base URL, app, recorder) of a server with an API key on the tiny CustomVoice model."""
    app = create_app(ServiceHolder(tiny_service), HttpConfig(api_key=KEY, max_body_bytes=64 * 1024))
    recorder = Recorder(tiny_service)
    with running(app) as url:
        yield url, app, recorder


@pytest.fixture
def client(server: tuple[str, Any, Recorder]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0)


def _direct(service: Service, **fields: Any) -> bytes:
    """The same request through the service directly (no HTTP)."""
    req = {k: v for k, v in {**SAY, **fields}.items() if k != "model"}
    req["text"] = req.pop("input")
    return b"".join(c.data for c in service.synthesize(req))


def _sse_events(lines: Iterator[str]) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]


# -- OpenAI SDK --------------------------------------------------------------------------------------
def test_openai_sdk_streams_audio_equal_to_the_service(client: openai.OpenAI, tiny_service: Service) -> None:
    extra = {"seed": 3, "max_frames": 10, "cache": False}
    with client.audio.speech.with_streaming_response.create(
        **SAY, response_format="pcm", extra_body=extra
    ) as response:
        assert response.headers["content-type"].startswith("audio/pcm")
        assert response.headers["x-accel-buffering"] == "no"
        assert float(response.headers["x-voxcast-ttfa-ms"]) > 0
        parts = list(response.iter_bytes())
    body = b"".join(parts)
    assert len(body) == 10 * 1920 * 2  # 10 frames of 24 kHz s16le
    assert body == _direct(tiny_service, response_format="pcm", **extra)


def test_default_mp3_streams_as_it_is_generated(client: openai.OpenAI, tiny_service: Service) -> None:
    """OpenAI's default format leaves the service chunk by chunk (not one file at the end), and the
    chunks make the one playable MP3 the server sends."""
    extra = {"seed": 4, "max_frames": 24, "cache": False, "first_chunk_frames": 2, "chunk_frames": 4}
    text = {"text": SAY["input"], "voice": SAY["voice"]}
    chunks = list(tiny_service.synthesize({**text, **extra, "response_format": "mp3"}))
    assert len(chunks) >= 5 and all(c.data for c in chunks) and sum(c.frames for c in chunks) == 24
    with client.audio.speech.with_streaming_response.create(**SAY, extra_body=extra) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        body = response.read()
    assert body == b"".join(c.data for c in chunks)
    audio, rate = sf.read(io.BytesIO(body))
    assert rate == 24000 and len(audio) >= 24 * 1920


def test_speed_is_the_engines_audio_stretched_and_streams_exactly(
    client: openai.OpenAI, tiny_service: Service
) -> None:
    """OpenAI's ``speed``: the streamed body is bit for bit the one-shot WSOLA stretch of the engine's
    audio for the same seed (pitch kept, 1 / speed as long), and the result reports it."""
    extra = {"seed": 5, "max_frames": 12, "cache": False}
    pcm = np.concatenate(
        [c.pcm for c in tiny_service.engine.synthesize({"text": SAY["input"], "voice": "ryan", **extra})]
    )
    for speed in (2.0, 0.75):
        with client.audio.speech.with_streaming_response.create(
            **SAY, response_format="pcm", speed=speed, extra_body=extra
        ) as response:
            parts = list(response.iter_bytes())
        body = b"".join(parts)
        assert len(body) == 2 * round(12 * 1920 / speed)
        assert body == float_to_int16(stretch(pcm, speed, 24000)).astype("<i2").tobytes()
    with client.audio.speech.with_streaming_response.create(
        **SAY, response_format="pcm", speed=2.0, extra_body={**extra, "stream_format": "sse"}
    ) as response:
        done = _sse_events(response.iter_lines())[-1]
    assert done["type"] == "speech.audio.done"
    assert done["result"]["duration_s"] == pytest.approx(12 * 0.08 / 2, abs=1e-3)
    assert done["timing"]["extra"]["speed"] == 2.0 and done["timing"]["audio_s"] == pytest.approx(0.96)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "flac", "opus", "aac", "mulaw"])
def test_openai_sdk_every_format(client: openai.OpenAI, tiny_service: Service, fmt: str) -> None:
    """Every OpenAI format (and mu-law), byte for byte what the service streams, and streamed: the
    bytes leave in several chunks as the audio is generated, not as one file at the end."""
    extra = {"seed": 5, "max_frames": 12, "cache": False, "first_chunk_frames": 2, "chunk_frames": 4}
    if fmt == "mulaw":
        extra["sample_rate"] = 8000
    audio = client.audio.speech.create(**SAY, response_format=fmt, extra_body=extra)  # type: ignore[arg-type]
    assert audio.content == _direct(tiny_service, response_format=fmt, **extra)
    chunks = list(
        tiny_service.synthesize(
            {"text": SAY["input"], "voice": SAY["voice"], "response_format": fmt, **extra}
        )
    )
    assert sum(1 for c in chunks[:-1] if c.data) >= 2
    if fmt in ("opus", "aac"):  # FFmpeg decodes what libsndfile cannot (AAC) or would resample (Opus)
        import av

        with av.open(io.BytesIO(audio.content)) as f:
            assert sum(fr.samples for fr in f.decode(audio=0)) >= 12 * 1920


def test_openai_sdk_sse_deltas_and_done_with_usage_and_timing(
    client: openai.OpenAI, tiny_service: Service
) -> None:
    extra = {"seed": 7, "max_frames": 9, "cache": False}
    with client.audio.speech.with_streaming_response.create(
        **SAY, response_format="pcm", stream_format="sse", extra_body=extra
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(response.iter_lines())
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert audio == _direct(tiny_service, response_format="pcm", **extra)
    done = events[-1]
    assert done["usage"]["output_tokens"] == 9 and done["usage"]["input_tokens"] == len(SAY["input"])
    assert done["timing"]["frames"] == 9 and done["timing"]["ttfa_ms"] > 0
    assert done["result"]["request_id"] == done["request_id"]


def test_a_cache_hit_streams_the_same_bytes(client: openai.OpenAI, server: tuple[str, Any, Recorder]) -> None:
    extra = {"seed": 11, "max_frames": 5}
    first = client.audio.speech.create(**SAY, response_format="wav", extra_body=extra).content
    miss = ended(server[2].streams[-1])
    again = client.audio.speech.create(**SAY, response_format="wav", extra_body=extra).content
    hit = ended(server[2].streams[-1])
    assert not miss.timing.cache_hit and hit.timing.cache_hit  # the second came from the cache
    # the miss streamed a header of unknown sizes, and so does the hit: the same audio, the same bytes
    assert first[:4] == b"RIFF" and first[4:8] == b"\xff" * 4 and again == first


def test_a_cache_hit_at_a_speed_reports_what_the_render_reported(tiny_service: Service) -> None:
    request = {"text": SAY["input"], "voice": "ryan", "seed": 12, "max_frames": 5, "speed": 1.5}
    streams = []
    for _ in range(2):
        stream = tiny_service.synthesize({**request, "response_format": "pcm"})
        streams.append((b"".join(c.data for c in stream), stream.result))
    (miss, a), (hit, b) = streams
    assert a is not None and b is not None and not a.timing.cache_hit and b.timing.cache_hit
    assert hit == miss and len(miss) == 2 * round(5 * 1920 / 1.5)
    assert a.duration_s == pytest.approx(b.duration_s, abs=1e-3) and a.duration_s == pytest.approx(
        0.4 / 1.5, abs=1e-3
    )
    assert a.timing.audio_s == pytest.approx(b.timing.audio_s, abs=1e-3) == 0.4
    assert a.timing.extra["speed"] == b.timing.extra["speed"] == 1.5


@contextlib.contextmanager
def _closing_all_but_the_engine(service: Service) -> Iterator[None]:
    """A second service on the module's engine: close its own parts, not the shared engine."""
    try:
        yield
    finally:
        service.voices.close(timeout=5)
        service.store.close()


def test_voice_aliases_such_as_openais_names(tiny_service: Service, tmp_path: Path) -> None:
    """``VOXCAST_VOICE_ALIASES``: an OpenAI client's ``alloy`` is the deployment's ``serena`` (any case):
    the engine speaks the speaker (uncached requests, so no cache hit can hide a wrong voice), and an
    alias shares its voice's cache entry; an alias of a voice the model lacks fails naming the field;
    the voice list shows the aliases."""
    config = ServiceConfig(store_audio=False, voice_aliases={"alloy": "serena", "ghost": "nobody"})
    service = Service.assemble(config, tiny_service.engine, LocalBlobStore(tmp_path, fsync=False))
    with (
        running(create_app(ServiceHolder(service), HttpConfig())) as url,
        _closing_all_but_the_engine(service),
    ):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

        def say(voice: str, **extra: Any) -> bytes:
            return client.audio.speech.create(
                **{**SAY, "voice": voice},
                response_format="pcm",
                extra_body={"seed": 13, "max_frames": 5, **extra},
            ).content

        uncached = [say(voice, cache=False) for voice in ("ALLOY", "alloy", "serena")]
        assert uncached[0] == uncached[1] == uncached[2] and len(uncached[0]) == 5 * 1920 * 2
        # not alloy's default (ryan): the deployment's alias wins (the tiny model's ryan and vivian speak
        # alike for 5 frames, so the alias names serena)
        assert say("ryan", cache=False) != uncached[0]
        assert say("alloy") == uncached[0]  # the alias first: its render fills serena's entry
        assert say("serena") == uncached[0]
        assert len([p for p in (tmp_path / "audio").rglob("*") if p.is_file()]) == 1  # one cache entry
        with pytest.raises(openai.BadRequestError) as err:
            client.audio.speech.create(**{**SAY, "voice": "ghost"})
        body = err.value.body
        assert isinstance(body, dict) and body["param"] == "voice" and body["code"] == "voice_not_found"
        assert "an alias of 'nobody'" in body["message"]
        voices = httpx.get(url + "/v1/audio/voices").json()["data"]
        alloy = {
            "id": "alloy",
            "object": "audio.voice",
            "name": "alloy",
            "type": "alias",
            "alias_of": "serena",
        }
        assert alloy in voices
        assert "ryan" in [v["id"] for v in voices]


def test_models_lists_the_loaded_model(client: openai.OpenAI, tiny_service: Service) -> None:
    assert [m.id for m in client.models.list()] == [tiny_service.engine.identity]


# -- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"input": ""}, "input", "invalid_request"),
        ({"voice": "nobody"}, "voice", "voice_not_found"),
        ({"speed": 0.1}, "speed", "invalid_request"),
        ({"speed": 9}, "speed", "invalid_request"),
        ({"response_format": "ogg"}, "response_format", "invalid_request"),
        ({"stream_format": "chunks"}, "stream_format", "invalid_request"),
        ({"extra_body": {"sample_rate": 5}}, "sample_rate", "invalid_request"),
        ({"extra_body": {"seed": "x"}}, "seed", "invalid_request"),
    ],
)
def test_bad_fields_are_400_naming_the_field(
    client: openai.OpenAI, fields: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.speech.create(**{**SAY, **fields})
    assert err.value.status_code == 400
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and body["code"] == code, body


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tts", "voice": "ryan"}, "input"),  # missing: named as OpenAI's clients know it
        ({"voice": "ryan", "input": "   "}, "input"),
        ({"voice": "ryan", "text": "   "}, "text"),  # voxcast's own name, when that is what was sent
    ],
)
def test_a_missing_or_bad_text_is_named_as_sent(
    server: tuple[str, Any, Recorder], body: dict[str, Any], param: str
) -> None:
    with httpx.Client(base_url=server[0], timeout=30) as http:
        r = http.post("/v1/audio/speech", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()


def test_auth_body_limit_json_and_routes(server: tuple[str, Any, Recorder]) -> None:
    url = server[0]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).audio.speech.create(**SAY)
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/v1/audio/speech", json=SAY).status_code == 401  # no key at all
        auth = {"Authorization": f"Bearer {KEY}"}
        big = http.post("/v1/audio/speech", json={**SAY, "input": "x" * 70_000}, headers=auth)
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        bad = http.post("/v1/audio/speech", content=b"{not json", headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "request"
        array = http.post("/v1/audio/speech", json=[1, 2], headers=auth)
        assert array.status_code == 400 and array.json()["error"]["param"] == "request"
        assert http.get("/v1/nothing", headers=auth).status_code == 404
        assert http.get("/ping").status_code == 200  # health needs no key
        assert http.get("/health").json()["status"] == "ready"
        # the server still serves after all of that
        ok = http.post(
            "/v1/audio/speech", json={**SAY, "max_frames": 3, "response_format": "pcm"}, headers=auth
        )
        assert ok.status_code == 200 and len(ok.content) == 3 * 3840


def test_curl_streams_a_wav(server: tuple[str, Any, Recorder]) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = json.dumps({**SAY, "response_format": "wav", "max_frames": 4, "seed": 1})
    out = subprocess.run(
        [
            "curl",
            "-sSN",
            "--fail-with-body",
            "-H",
            f"Authorization: Bearer {KEY}",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            server[0] + "/v1/audio/speech",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    assert out[:4] == b"RIFF" and out[8:12] == b"WAVE"


# -- cancellation and back-pressure ------------------------------------------------------------------
def test_a_client_that_disconnects_cancels_its_generation(server: tuple[str, Any, Recorder]) -> None:
    url, app, recorder = server
    before = app.state.counters.disconnected
    n = len(recorder.streams)
    auth = {"Authorization": f"Bearer {KEY}"}
    request = {**SAY, "response_format": "pcm", "max_frames": 3000}
    with (
        httpx.Client(base_url=url, timeout=30, headers=auth) as http,
        http.stream("POST", "/v1/audio/speech", json=request) as r,
    ):
        assert r.status_code == 200
        next(r.iter_raw())  # the first audio, then hang up
    stream = recorder.stream(n)
    result = ended(stream)
    assert result.timing.finish_reason == "cancelled"
    assert result.timing.frames < 3000
    deadline = time.monotonic() + 10
    while app.state.counters.disconnected == before:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_client_that_stops_reading_is_cancelled_and_counted(tiny_service: Service) -> None:
    config = HttpConfig(queue_chunks=1, stall_s=0.3)
    app = create_app(ServiceHolder(tiny_service), config)
    recorder = Recorder(tiny_service)
    try:
        with running(app) as url:
            port = int(url.rsplit(":", 1)[1])
            body = json.dumps(
                {**SAY, "response_format": "pcm", "sample_rate": 48000, "max_frames": 8000}
            ).encode()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port))
            sock.sendall(
                b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            try:
                result = ended(recorder.stream(0), timeout_s=120)  # never read: the server gives up
            finally:
                sock.close()
            assert result.timing.finish_reason == "cancelled" and result.timing.frames < 8000
            assert app.state.counters.stalled == 1
            # and the server goes on serving others
            ok = httpx.post(
                url + "/v1/audio/speech", json={**SAY, "max_frames": 2, "response_format": "pcm"}, timeout=30
            )
            assert ok.status_code == 200 and len(ok.content) == 2 * 3840
    finally:
        recorder.restore()


def test_eight_concurrent_streams_equal_the_same_requests_one_at_a_time(
    client: openai.OpenAI, server: tuple[str, Any, Recorder], tiny_service: Service
) -> None:
    disconnected = server[1].state.counters.disconnected

    def say(seed: int) -> bytes:
        extra = {"seed": seed, "max_frames": 6 + seed % 3, "cache": False}
        return client.audio.speech.create(**SAY, response_format="pcm", extra_body=extra).content

    alone = [say(seed) for seed in range(8)]
    with sharing_steps(tiny_service.engine, 8) as ran, ThreadPoolExecutor(8) as pool:
        together = list(pool.map(say, range(8)))
        steps, rows = ran()
    assert rows > steps  # they shared the engine's steps
    assert together == alone
    assert len(set(alone)) == 8
    assert server[1].state.counters.disconnected == disconnected  # complete responses are not "gone"


# -- voices ------------------------------------------------------------------------------------------
def test_voices_upload_list_use_delete(tiny_model_dir: Factory, tmp_path: Path) -> None:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("base")), device="cpu", warmup=False))
    service = Service.assemble(ServiceConfig(), engine, LocalBlobStore(tmp_path / "store", fsync=False))
    try:
        with (
            running(create_app(ServiceHolder(service), HttpConfig())) as url,
            httpx.Client(base_url=url, timeout=60) as http,
        ):
            wav = reference_wav(24000, 2.0)
            made = http.post(
                "/v1/audio/voices",
                files={"audio": ("ref.wav", wav, "audio/wav")},
                data={"ref_text": "A test voice."},
            )
            assert made.status_code == 201, made.text
            voice = made.json()
            assert voice["id"].startswith("vx_") and voice["ref_text"] == "A test voice."
            # the same upload as JSON gives the same id
            again = http.post(
                "/v1/audio/voices",
                json={"ref_audio": base64.b64encode(wav).decode(), "ref_text": "A test voice."},
            )
            assert again.status_code == 201 and again.json()["id"] == voice["id"]
            listed = http.get("/v1/audio/voices").json()["data"]
            entry = next(v for v in listed if v["id"] == voice["id"])
            # as created (before: created_at 0 and the id as its name), without the transcript
            assert entry["created_at"] == voice["created_at"] > 0 and entry["name"] == voice["name"]
            assert "ref_text" not in entry
            assert http.get(f"/v1/audio/voices/{voice['id']}").json()["ref_text"] == "A test voice."

            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            audio = client.audio.speech.create(
                model="tts",
                input="Hello.",
                voice={"id": voice["id"]},
                response_format="pcm",
                extra_body={"max_frames": 4},
            )
            assert len(audio.content) == 4 * 3840

            deleted = http.delete(f"/v1/audio/voices/{voice['id']}").json()
            assert deleted == {"id": voice["id"], "object": "audio.voice.deleted", "deleted": True}
            assert http.delete(f"/v1/audio/voices/{voice['id']}").status_code == 404
            assert http.get(f"/v1/audio/voices/{voice['id']}").status_code == 404
            gone = http.post("/v1/audio/speech", json={"input": "Hi.", "voice": voice["id"]})
            assert gone.status_code == 400 and gone.json()["error"]["code"] == "voice_not_found"
            assert gone.json()["error"]["param"] == "voice"
            # bad uploads name their field
            empty = http.post("/v1/audio/voices", files={"audio": ("ref.wav", b"", "audio/wav")})
            assert empty.status_code == 400 and empty.json()["error"]["param"] == "audio"
            junk = http.post(
                "/v1/audio/voices", files={"audio": ("ref.wav", b"not audio at all", "audio/wav")}
            )
            assert junk.status_code == 400, junk.text
            nofile = http.post("/v1/audio/voices", data={"ref_text": "x"}, files={"other": ("a", b"1")})
            assert nofile.status_code == 400 and nofile.json()["error"]["param"] == "audio"

            def chunked() -> Iterator[bytes]:
                yield b'--x\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n\r\n'
                yield wav + b"\r\n--x--\r\n"

            unsized = http.post(
                "/v1/audio/voices",
                content=chunked(),
                headers={"Content-Type": "multipart/form-data; boundary=x"},
            )
            assert unsized.status_code == 411 and unsized.json()["error"]["code"] == "length_required"
            b64 = http.post("/v1/audio/voices", json={"ref_audio": "@@@"})
            assert b64.status_code == 400 and b64.json()["error"]["param"] == "ref_audio"
    finally:
        service.close()


def test_voice_upload_on_a_model_that_cannot_clone_is_refused(server: tuple[str, Any, Recorder]) -> None:
    r = httpx.post(
        server[0] + "/v1/audio/voices",
        files={"audio": ("ref.wav", reference_wav(24000, 1.0), "audio/wav")},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "audio"
    listed = httpx.get(
        server[0] + "/v1/audio/voices", headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    ).json()
    own = [v for v in listed["data"] if v["type"] != "alias"]  # OpenAI's names are aliases of these
    assert all(v["builtin"] for v in own) and "ryan" in [v["id"] for v in own]


# -- readiness ---------------------------------------------------------------------------------------
def test_ping_is_204_while_loading_then_200_and_requests_wait_with_503(tiny_service: Service) -> None:
    holder, release = loading_holder(tiny_service)
    with running(create_app(holder, HttpConfig())) as url:
        assert httpx.get(url + "/ping").status_code == 204
        busy = httpx.post(url + "/v1/audio/speech", json=SAY)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
        assert busy.json()["error"]["code"] == "engine_unavailable"
        release.set()
        assert holder.wait(30)
        assert httpx.get(url + "/ping").status_code == 200
        ok = httpx.post(
            url + "/v1/audio/speech", json={**SAY, "max_frames": 2, "response_format": "pcm"}, timeout=30
        )
        assert ok.status_code == 200


def test_a_failed_load_is_reported_by_ping() -> None:
    holder = ServiceHolder()
    failures: list[BaseException] = []

    def load(metrics: Any) -> Service:
        raise RuntimeError("no such checkpoint")

    holder.load_in_background(load, on_failure=failures.append)
    assert not holder.wait(30)
    with running(create_app(holder, HttpConfig())) as url:
        r = httpx.get(url + "/ping")
        assert r.status_code == 503 and "no such checkpoint" in r.json()["error"]
    assert len(failures) == 1
