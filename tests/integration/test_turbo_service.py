"""Chatterbox Turbo through the service on both storage backends (a local folder, S3 over moto): a
voice registered from reference audio and stored (safetensors + JSON), renders stored and cached by
the same keys and timing record as Qwen3-TTS."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.encode import stream_to_file
from voxcast.audio.formats import AudioFormat
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.errors import InvalidRequest
from voxcast.service import Service, ServiceConfig
from voxcast.storage.base import BlobStore
from voxcast.testing.signals import speech_like


@pytest.fixture(scope="module")
def engine(turbo_model_dir: Path) -> Iterator[Engine]:
    eng = Engine.load(EngineConfig(model=str(turbo_model_dir), device="cpu", warmup=False))
    yield eng
    eng.close()


@pytest.fixture
def service(engine: Engine, blob_store: BlobStore) -> Service:
    return Service.assemble(ServiceConfig(), engine, blob_store)


def _wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, 22050, seed=5), 22050, format="WAV")
    return buf.getvalue()


def _collect(service: Service, **req: object) -> tuple[bytes, object]:
    stream = service.synthesize({"text": "Thanks for calling.", **req})
    return b"".join(c.data for c in stream), stream.result


def test_builtin_voice_render_is_stored_and_cached(service: Service) -> None:
    data, result = _collect(service, seed=4)
    assert result.timing.cache_hit is False and result.audio_key
    stored = service.store.get_bytes(result.audio_key)
    assert stored == stream_to_file(AudioFormat.WAV, 24000, data)
    pcm, sr = sf.read(io.BytesIO(stored), dtype="float32")
    assert sr == 24000 and len(pcm) == (result.timing.frames + 3) * 960
    again, hit = _collect(service, seed=4)
    assert hit.timing.cache_hit and again == data  # the live stream's bytes, streaming header included


def test_registered_voice_is_stored_and_used(service: Service) -> None:
    voice_id = service.register_voice(_wav(6.0))
    assert service.register_voice(_wav(6.0)) == voice_id  # content-addressed
    data, result = _collect(service, voice=voice_id, seed=1, response_format="pcm")
    pcm = np.frombuffer(data, dtype="<i2")
    assert len(pcm) == (result.timing.frames + 3) * 960
    builtin, _ = _collect(service, seed=1, response_format="pcm")
    assert builtin != data  # another voice, other audio


def test_short_reference_is_refused_naming_the_field(service: Service) -> None:
    with pytest.raises(InvalidRequest) as e:
        service.register_voice(_wav(3.0))
    assert e.value.field == "ref_audio"
