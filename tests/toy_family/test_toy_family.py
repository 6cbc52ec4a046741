"""The toy family (tests/toy_family, written from models/base.py alone) served by the unchanged
engine, service, HTTP server and RQ worker: the model contract is enough for a third family.

Registered with one line (:func:`_register`); the worker process gets it from ``VOXCAST_FAMILIES``.
"""

from __future__ import annotations

import base64
import io
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import redis
import soundfile as sf

from tests.fixtures.http_server import running
from tests.fixtures.models import build_cached
from tests.fixtures.rq_worker import WorkerProcess
from tests.toy_family.family import PITCHES, SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.toy_family.model import FRAMES_PER_WORD, sine
from voxcast import Engine, EngineConfig
from voxcast.audio.pcm import float_to_int16
from voxcast.errors import InvalidRequest, VoiceNotFound
from voxcast.models import registry
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.rq.client import QueueClient, StreamCapture
from voxcast.serving.rq.config import QueueConfig
from voxcast.storage.local import LocalBlobStore

FAMILY_MODULE = "tests.toy_family.family"
TEXT = "Thanks for calling us today."
AMPLITUDE = 0.5


def _register() -> None:
    registry.register(FAMILY_MODULE)  # the one line that adds the family to this process


def _expected(text: str, voice: str) -> np.ndarray:
    """The toy's audio of one whole text: three frames a word, one continuous tone."""
    frames = FRAMES_PER_WORD * len(text.split())
    return sine(PITCHES[voice], 0, frames * SAMPLES_PER_FRAME, SAMPLE_RATE, AMPLITUDE)


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    _register()
    return build_cached("toy_sine")  # its registered test-checkpoint builder


@pytest.fixture(scope="module")
def engine(checkpoint: Path) -> Iterator[Engine]:
    eng = Engine.load(EngineConfig(model=str(checkpoint), device="cpu", settings={"toy_amplitude": 50}))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def service(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Service:
    return Service.assemble(ServiceConfig(), engine, LocalBlobStore(tmp_path_factory.mktemp("store")))


def test_engine_streams_the_toy_family(engine: Engine) -> None:
    assert engine.warmed and engine.model_type == "sine" and engine.speakers == ("low", "high")
    assert engine.render_settings == {"toy_amplitude": 50}  # its family setting, through its capability
    stream = engine.synthesize({"text": TEXT, "voice": "high", "seed": 1})
    chunks = list(stream)
    assert [c.seq for c in chunks] == list(range(len(chunks))) and len(chunks) >= 3  # the chunk ramp
    np.testing.assert_allclose(np.concatenate([c.pcm for c in chunks]), _expected(TEXT, "high"), atol=1e-6)
    assert stream.timing.frames == FRAMES_PER_WORD * 5 and stream.timing.finish_reason == "eos"


def test_engine_speaks_text_in_pieces_sentence_by_sentence(engine: Engine) -> None:
    stream = engine.open({"voice": "low", "seed": 2})  # the toy has no open prompt: whole sentences
    stream.push("One two. Three")
    stream.push(" four five.")
    stream.close_text()
    pcm = np.concatenate([c.pcm for c in stream])
    want = np.concatenate([_expected("One two.", "low"), _expected("Three four five.", "low")])
    np.testing.assert_allclose(pcm, want, atol=1e-6)


def test_family_settings_are_checked_naming_the_variable() -> None:
    env = {"VOXCAST_FAMILIES": FAMILY_MODULE, "VOXCAST_TOY_AMPLITUDE": "80"}
    assert EngineConfig.from_env(env).settings["toy_amplitude"] == 80
    with pytest.raises(ValueError, match="VOXCAST_TOY_AMPLITUDE"):
        EngineConfig.from_env({**env, "VOXCAST_TOY_AMPLITUDE": "101"})
    with pytest.raises(ValueError, match="VOXCAST_FAMILIES"):
        EngineConfig.from_env({"VOXCAST_FAMILIES": "tests.toy_family.nothing_here"})


def test_service_renders_stores_and_caches(service: Service) -> None:
    request = {"text": TEXT, "voice": "low", "response_format": "pcm", "seed": 3, "sample_rate": SAMPLE_RATE}
    first = service.synthesize(request)  # seeded: cached
    data = b"".join(c.data for c in first)
    assert data == float_to_int16(_expected(TEXT, "low")).tobytes()
    assert first.result is not None and first.result.timing.cache_hit is False
    again = service.synthesize(request)
    assert b"".join(c.data for c in again) == data and again.result.timing.cache_hit


def test_service_resamples_from_the_models_rate(service: Service) -> None:
    """The toy decodes 16 kHz: a file asked at the default 24 kHz is resampled, not relabelled."""
    stream = service.synthesize({"text": TEXT, "voice": "low", "response_format": "wav"})
    pcm, rate = sf.read(io.BytesIO(b"".join(c.data for c in stream)), dtype="float32")
    want = _expected(TEXT, "low")
    assert rate == 24000 and abs(len(pcm) - len(want) * 24000 // SAMPLE_RATE) <= 2
    spectrum = np.abs(np.fft.rfft(pcm))
    assert abs(np.argmax(spectrum) * rate / len(pcm) - PITCHES["low"]) < 2  # the same pitch


def test_service_refuses_what_the_family_cannot_do(service: Service, engine: Engine) -> None:
    with pytest.raises(VoiceNotFound) as e:
        list(service.synthesize({"text": "Hi.", "voice": "ryan"}))
    assert e.value.field == "voice"
    wav = io.BytesIO()
    sf.write(wav, np.zeros(16000, np.float32), 16000, format="WAV")
    with pytest.raises(InvalidRequest) as refused:
        list(service.synthesize({"text": "Hi.", "ref_audio": base64.b64encode(wav.getvalue()).decode()}))
    assert refused.value.field == "ref_audio" and refused.value.message == engine.cloning_refusal
    assert engine.cloning_refusal and "sine" in engine.cloning_refusal  # the contract's default words


def test_http_server_serves_the_toy_family(service: Service) -> None:
    with running(create_app(ServiceHolder(service), HttpConfig())) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        with client.audio.speech.with_streaming_response.create(
            model="tts",
            input=TEXT,
            voice="high",
            response_format="pcm",
            extra_body={"sample_rate": SAMPLE_RATE},
        ) as r:  # type: ignore[arg-type]
            body = b"".join(r.iter_bytes())
        assert body == float_to_int16(_expected(TEXT, "high")).tobytes()
        with httpx.Client(base_url=url, timeout=60) as http:
            made = http.post("/v1/audio/voices", files={"audio": ("ref.wav", b"RIFF", "audio/wav")})
        assert made.status_code == 400 and made.json()["error"]["message"] == service.engine.cloning_refusal


@pytest.mark.slow
def test_rq_worker_serves_the_toy_family(
    checkpoint: Path, tmp_path: Path, redis_client: redis.Redis, redis_url: str
) -> None:
    env = {"VOXCAST_FAMILIES": FAMILY_MODULE, "VOXCAST_TOY_AMPLITUDE": "50"}
    worker = WorkerProcess(redis_url, checkpoint, tmp_path / "store", tmp_path / "worker.log", "vx-toy", env)
    try:
        client = QueueClient(redis_client, QueueConfig(queues=("vx-toy",), retries=0))
        job = client.enqueue({"text": TEXT, "voice": "high", "sample_rate": SAMPLE_RATE})
        worker.wait_ready(redis_client, timeout_s=120)
        result = client.wait(job, timeout_s=120)
        cap = StreamCapture()
        for entry in client.follow(job, idle_timeout_s=10):
            cap.add(entry)
        assert cap.gaps == 0 and len(cap.chunks) == result["timing"]["chunks"]
        pcm, rate = sf.read(io.BytesIO(cap.audio), dtype="int16")
        assert rate == SAMPLE_RATE and np.array_equal(pcm, float_to_int16(_expected(TEXT, "high")))
        assert worker.alive
    finally:
        if worker.alive:
            worker.proc.send_signal(signal.SIGTERM)
        worker.stop()
