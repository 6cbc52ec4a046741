"""Chatterbox Turbo behind the HTTP server, with the official ``openai`` SDK and httpx: streamed speech
equal to the service's, a voice uploaded and used, refused fields as 4xx errors naming the field."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import soundfile as sf

from tests.fixtures.http_server import running
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.storage.local import LocalBlobStore
from voxcast.testing.signals import speech_like

SAY: dict[str, Any] = {"model": "tts", "input": "Hello there [laugh] how are you?", "voice": "default"}


@pytest.fixture(scope="module")
def served(turbo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Service]]:
    engine = Engine.load(EngineConfig(model=str(turbo_model_dir), device="cpu", warmup=False))
    store = LocalBlobStore(tmp_path_factory.mktemp("store"), fsync=False)
    service = Service.assemble(ServiceConfig(store_audio=False), engine, store)
    try:
        with running(create_app(ServiceHolder(service), HttpConfig())) as url:
            yield url, service
    finally:
        service.close()


def test_openai_sdk_streams_the_services_audio(served: tuple[str, Service]) -> None:
    url, service = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    extra = {"seed": 3, "cache": False}
    with client.audio.speech.with_streaming_response.create(
        **SAY, response_format="pcm", extra_body=extra
    ) as r:
        body = b"".join(r.iter_bytes())
    direct = service.synthesize({"text": SAY["input"], "voice": "default", "response_format": "pcm", **extra})
    assert body == b"".join(c.data for c in direct) and len(body) % (960 * 2) == 0 and body


def test_uploaded_voice_is_used(served: tuple[str, Service]) -> None:
    url, _ = served
    buf = io.BytesIO()
    sf.write(buf, speech_like(6.0, 16000, seed=4), 16000, format="WAV")
    with httpx.Client(base_url=url, timeout=120) as http:
        made = http.post("/v1/audio/voices", files={"audio": ("ref.wav", buf.getvalue(), "audio/wav")})
        assert made.status_code == 201, made.text
        voice = made.json()["id"]
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        audio = client.audio.speech.create(
            model="tts", input="Hello.", voice={"id": voice}, response_format="pcm", extra_body={"seed": 1}
        )  # type: ignore[arg-type]
        assert len(audio.content) > 0 and len(audio.content) % (960 * 2) == 0
        short = io.BytesIO()
        sf.write(short, speech_like(3.0, 16000, seed=4), 16000, format="WAV")
        refused = http.post("/v1/audio/voices", files={"audio": ("ref.wav", short.getvalue(), "audio/wav")})
        # the problem names the field the audio came in (the form's "audio"; JSON's "ref_audio")
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "audio"


@pytest.mark.parametrize(
    ("fields", "field"), [({"instructions": "whisper"}, "instructions"), ({"voice": "ryan"}, "voice")]
)
def test_refused_fields_are_400_naming_the_field(
    served: tuple[str, Service], fields: dict[str, str], field: str
) -> None:
    url, _ = served
    with httpx.Client(base_url=url, timeout=60) as http:
        r = http.post("/v1/audio/speech", json={**SAY, **fields, "response_format": "pcm"})
        assert r.status_code in (400, 404), r.text
        assert r.json()["error"]["param"] == field  # OpenAI's error shape names the field "param"
