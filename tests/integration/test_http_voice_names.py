"""Voices as an OpenAI client and a careless one use them, against a real uvicorn server on tiny
checkpoints: OpenAI's voice names out of the box, the default voice, the ``openai`` SDK's voices API,
a WebSocket config naming an alias, and the bounds of voice upload (transcript, name, path ids)."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

from tests.fixtures.engines import reference_wav
from tests.fixtures.http_server import running
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.storage.local import LocalBlobStore
from voxcast.voices.defaults import OPENAI_VOICES, openai_aliases

Factory = Callable[[str], Path]
FIELDS = {"seed": 3, "max_frames": 3, "cache": False}


@contextlib.contextmanager
def _serving(engine: Engine, store_dir: Path, **config: Any) -> Iterator[str]:
    """A server on a service of its own around ``engine`` (closed after, the engine kept)."""
    service = Service.assemble(
        ServiceConfig(store_audio=False, **config), engine, LocalBlobStore(store_dir, fsync=False)
    )
    try:
        with running(create_app(ServiceHolder(service), HttpConfig())) as url:
            yield url
    finally:
        service.voices.close(timeout=5)
        service.store.close()


def _pcm(url: str, **body: Any) -> httpx.Response:
    return httpx.post(
        url + "/v1/audio/speech",
        json={"input": "Good morning.", "response_format": "pcm", **FIELDS, **body},
        timeout=60,
    )


@pytest.fixture(scope="module")
def base_engine(tiny_model_dir: Factory) -> Iterator[Engine]:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("base")), device="cpu", warmup=False))
    yield engine
    engine.close()


# -- OpenAI's names and the default voice ---------------------------------------------------------------
def test_openai_voice_names_and_an_omitted_voice_work_out_of_the_box(
    tiny_service: Service, tmp_path: Path
) -> None:
    engine = tiny_service.engine
    mapping = openai_aliases(engine.speakers)
    assert set(mapping) == set(OPENAI_VOICES) and set(mapping.values()) <= set(engine.speakers)
    assert mapping["alloy"] == "ryan" and mapping["nova"] == "vivian"  # the documented table
    with _serving(engine, tmp_path) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for name in ("alloy", "Nova", "shimmer"):
            audio = client.audio.speech.create(
                model="tts", input="Good morning.", voice=name, response_format="pcm", extra_body=FIELDS
            ).content
            assert audio == _pcm(url, voice=mapping[name.lower()]).content, name
        omitted = _pcm(url)
        assert omitted.status_code == 200, omitted.text
        assert omitted.content == _pcm(url, voice="ryan").content  # alloy's speaker
        listed = httpx.get(url + "/v1/audio/voices", timeout=30).json()["data"]
        aliases = {v["id"]: v["alias_of"] for v in listed if v["type"] == "alias"}
        assert aliases == mapping


def test_configured_aliases_and_default_voice_replace_the_defaults(
    tiny_service: Service, tmp_path: Path
) -> None:
    engine = tiny_service.engine
    with _serving(engine, tmp_path, voice_aliases={"alloy": "sohee"}, default_voice="nova") as url:
        assert _pcm(url, voice="alloy").content == _pcm(url, voice="sohee").content
        assert _pcm(url).content == _pcm(url, voice="vivian").content  # default nova -> vivian
    with _serving(engine, tmp_path / "off", openai_voices=False) as url:
        r = _pcm(url, voice="alloy")
        assert r.status_code == 400 and r.json()["error"]["param"] == "voice"


def test_websocket_config_with_an_alias_speaks_its_speaker(tiny_service: Service, tmp_path: Path) -> None:
    with _serving(tiny_service.engine, tmp_path, voice_aliases={"support": "vivian"}) as url:
        ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        with connect(ws_url, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "config", "voice": "SUPPORT", "text_mode": "sentences", **FIELDS}))
            ws.send(json.dumps({"type": "text", "text": "Good morning."}))
            ws.send(json.dumps({"type": "flush"}))
            audio, events = b"", []
            while not events or events[-1]["type"] not in ("segment_done", "error"):
                raw = ws.recv(timeout=60)
                if isinstance(raw, bytes):
                    audio += raw
                else:
                    events.append(json.loads(raw))
        assert events[-1]["type"] == "segment_done", events
        assert audio == _pcm(url, voice="vivian").content


def test_a_base_model_says_what_a_voice_needs(base_engine: Engine, tmp_path: Path) -> None:
    with _serving(base_engine, tmp_path) as url:
        omitted = _pcm(url)
        assert omitted.status_code == 400 and omitted.json()["error"]["param"] == "voice"
        assert "no built-in speakers" in omitted.json()["error"]["message"]
        alloy = _pcm(url, voice="alloy")
        assert alloy.status_code == 400 and "VOXCAST_VOICE_ALIASES=alloy=" in alloy.json()["error"]["message"]


# -- the openai SDK's voices API ------------------------------------------------------------------------
def test_openai_sdk_creates_uses_and_deletes_a_voice(base_engine: Engine, tmp_path: Path) -> None:
    wav = reference_wav(24000, 2.0)
    with _serving(base_engine, tmp_path) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        voice = client.audio.voices.create(
            audio_sample=("me.wav", wav, "audio/wav"), consent="cons_1234", name="Front desk"
        )
        assert voice.object == "audio.voice" and voice.name == "Front desk" and voice.type == "audio_sample"
        assert voice.id.startswith("vx_") and voice.created_at > 0
        audio = client.audio.speech.create(
            model="tts", input="Hello.", voice={"id": voice.id}, response_format="pcm", extra_body=FIELDS
        )
        assert len(audio.content) == 3 * 3840
        shown = httpx.get(f"{url}/v1/audio/voices/{voice.id}", timeout=30).json()
        assert shown["object"] == "audio.voice" and shown["name"] == "Front desk"
        deleted = client.audio.voices.delete(voice.id)
        assert deleted.object == "audio.voice.deleted" and deleted.deleted and deleted.id == voice.id


def test_a_registered_voice_as_the_default_voice(base_engine: Engine, tmp_path: Path) -> None:
    wav = reference_wav(24000, 2.0)
    with _serving(base_engine, tmp_path) as url:
        made = httpx.post(url + "/v1/audio/voices", files={"audio": ("a.wav", wav, "audio/wav")}, timeout=60)
        voice_id = made.json()["id"]
        expected = _pcm(url, voice=voice_id).content
    with _serving(base_engine, tmp_path, default_voice=voice_id) as url:
        assert _pcm(url).content == expected


# -- upload bounds and leaks ----------------------------------------------------------------------------
def test_voice_upload_bounds_its_fields_and_leaks_nothing(base_engine: Engine, tmp_path: Path) -> None:
    wav = reference_wav(24000, 2.0)
    b64 = base64.b64encode(wav).decode()
    with _serving(base_engine, tmp_path) as url, httpx.Client(base_url=url, timeout=60) as http:

        def error(r: httpx.Response, status: int = 400) -> dict[str, Any]:
            assert r.status_code == status, r.text
            err: dict[str, Any] = r.json()["error"]
            return err

        # the data URI that speech requests accept
        uri = http.post("/v1/audio/voices", json={"ref_audio": "data:audio/wav;base64," + b64})
        assert (
            uri.status_code == 201
            and uri.json()["id"] == http.post("/v1/audio/voices", json={"ref_audio": b64}).json()["id"]
        )
        long_text = error(http.post("/v1/audio/voices", json={"ref_audio": b64, "ref_text": "x" * 2001}))
        assert long_text["param"] == "ref_text" and "2000" in long_text["message"]
        surrogate = http.post(
            "/v1/audio/voices",
            content='{"ref_audio": "' + b64 + '", "ref_text": "a \\ud800 b"}',
            headers={"Content-Type": "application/json"},
        )
        assert error(surrogate)["param"] == "ref_text"
        name = error(http.post("/v1/audio/voices", json={"ref_audio": b64, "name": "n" * 10_000}))
        assert name["param"] == "name" and "n" * 200 not in json.dumps(name)
        deep = error(
            http.post("/v1/audio/voices", content="[" * 100_000, headers={"Content-Type": "application/json"})
        )
        assert deep["param"] == "request" and "nested too deeply" in deep["message"]
        junk = error(http.post("/v1/audio/voices", files={"audio": ("a.wav", b"not audio", "audio/wav")}))
        assert junk["param"] == "audio" and "0x" not in junk["message"] and "BytesIO" not in junk["message"]
        newline = error(http.get("/v1/audio/voices/vx_" + "0" * 32 + "%0A"), 404)
        assert "voices/" not in newline["message"] and newline["param"] == "voice_id"
        huge = error(http.get("/v1/audio/voices/" + "v" * 10_000), 404)
        assert "v" * 200 not in json.dumps(huge)
