"""The service flow on both storage backends: encoding, storing, cache hits, voices, failures."""

from __future__ import annotations

import base64
import io
import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.encode import stream_to_file
from voxcast.audio.formats import AudioFormat
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.errors import InvalidRequest, VoiceNotFound
from voxcast.service import Service, ServiceConfig
from voxcast.storage.base import BlobStore
from voxcast.storage.keys import voice_keys

Factory = Callable[[str], Path]


@pytest.fixture(scope="module")
def cv_engine(tiny_model_dir: Factory) -> Iterator[Engine]:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def base_engine(tiny_model_dir: Factory) -> Iterator[Engine]:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("base")), device="cpu", warmup=False))
    yield engine
    engine.close()


@pytest.fixture
def service(cv_engine: Engine, blob_store: BlobStore) -> Service:
    return Service.assemble(ServiceConfig(), cv_engine, blob_store)


def _collect(service: Service, **req: object) -> tuple[bytes, object]:
    stream = service.synthesize({"text": "Hello there.", "voice": "ryan", **req})
    data = b"".join(c.data for c in stream)
    return data, stream.result


def test_wav_stream_is_stored_and_cached(service: Service) -> None:
    data, result = _collect(service, seed=4, max_frames=6)
    assert result.timing.cache_hit is False and result.audio_key
    stored = service.store.get_bytes(result.audio_key)
    assert stored == stream_to_file(AudioFormat.WAV, 24000, data)
    pcm, sr = sf.read(io.BytesIO(stored), dtype="float32")
    assert sr == 24000 and len(pcm) == 6 * 1920

    again, hit = _collect(service, seed=4, max_frames=6)
    assert hit.timing.cache_hit and hit.audio_key == result.audio_key
    assert again == data  # a hit streams the live stream's bytes (streaming header), not the file's
    assert hit.timing.finish_reason == "cache" and hit.timing.prefill_parts == 0 and hit.timing.talker_ms == 0


@pytest.mark.parametrize("fmt", ["mulaw", "alaw", "pcm"])
def test_raw_formats_stream_raw_bytes_on_miss_and_hit(service: Service, fmt: str) -> None:
    miss, r1 = _collect(service, greedy=True, max_frames=5, response_format=fmt, sample_rate=8000)
    hit, r2 = _collect(service, greedy=True, max_frames=5, response_format=fmt, sample_rate=8000)
    assert r2.timing.cache_hit and not r1.timing.cache_hit
    assert miss == hit
    width = 2 if fmt == "pcm" else 1
    assert abs(len(miss) / width - 5 * 0.08 * 8000) < 8000 * 0.01


def test_unseeded_requests_are_not_cached(service: Service) -> None:
    _, r1 = _collect(service, max_frames=3)
    _, r2 = _collect(service, max_frames=3)
    assert not r1.timing.cache_hit and not r2.timing.cache_hit
    assert r1.audio_key != r2.audio_key and r1.audio_key.startswith("renders/")


def test_a_reused_request_id_never_overwrites_a_stored_render(service: Service) -> None:
    _, first = _collect(service, max_frames=3, request_id="same-id")
    data = service.store.get_bytes(first.audio_key)
    _, second = _collect(service, max_frames=4, request_id="same-id")
    assert first.audio_key == "renders/same-id.wav"
    assert second.audio_key.startswith("renders/same-id-") and second.audio_key != first.audio_key
    assert service.store.get_bytes(first.audio_key) == data  # untouched
    assert service.store.get_bytes(second.audio_key) != data


def test_cache_off_per_request(service: Service) -> None:
    _collect(service, seed=9, max_frames=3)
    _, result = _collect(service, seed=9, max_frames=3, cache=False)
    assert not result.timing.cache_hit


def test_flac_streams_and_is_stored_with_its_length(service: Service) -> None:
    """FLAC leaves in chunks as it is encoded (its header says "length unknown"); the stored file
    has the sample count filled in, so every reader (libsndfile too) knows its length."""
    stream = service.synthesize(
        {
            "text": "Hi",
            "voice": "ryan",
            "seed": 1,
            "max_frames": 12,
            "response_format": "flac",
            "cache": False,
        }
    )
    chunks = list(stream)
    assert sum(1 for c in chunks if c.data) >= 2 and sum(c.frames for c in chunks) == 12
    assert stream.result is not None and stream.result.audio_key is not None
    stored = service.store.get_bytes(stream.result.audio_key)
    assert stored == stream_to_file(AudioFormat.FLAC, 24000, b"".join(c.data for c in chunks))
    pcm, sr = sf.read(io.BytesIO(stored))
    assert sr == 24000 and len(pcm) == 12 * 1920


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_a_cache_hit_streams_the_bytes_of_the_live_stream(service: Service, fmt: str) -> None:
    """The same audio gives the same bytes: a hit streams the stored file with the live stream's
    header (WAV sizes and FLAC sample count unknown), while the stored file keeps its true sizes."""
    live, miss = _collect(service, seed=5, max_frames=7, response_format=fmt, sample_rate=16000)
    hit, result = _collect(service, seed=5, max_frames=7, response_format=fmt, sample_rate=16000)
    assert result.timing.cache_hit and not miss.timing.cache_hit
    assert hit == live
    assert service.store.get_bytes(result.audio_key) == stream_to_file(AudioFormat(fmt), 16000, live)


def test_unknown_speaker_is_a_field_error(service: Service) -> None:
    with pytest.raises(VoiceNotFound) as info:
        list(service.synthesize({"text": "Hi", "voice": "nobody"}))
    assert info.value.field == "voice"


def _ref_audio() -> bytes:
    t = np.arange(48000) / 24000
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 180 * t), 24000, format="WAV")
    return buf.getvalue()


def test_registered_voice_by_id_and_inline_reference(base_engine: Engine, blob_store: BlobStore) -> None:
    service = Service.assemble(ServiceConfig(), base_engine, blob_store)
    ref = _ref_audio()
    vid = service.register_voice(ref, ref_text="A short reference.")
    assert vid == service.register_voice(ref, ref_text="A short reference.")
    data, result = _collect(service, voice=vid, greedy=True, max_frames=4)
    assert result.voice_id == vid and len(data) > 0
    inline = base64.b64encode(ref).decode()
    _, r2 = _collect(
        service, voice=None, ref_audio=inline, ref_text="A short reference.", greedy=True, max_frames=4
    )
    assert r2.voice_id == vid
    assert r2.timing.cache_hit  # same voice, same request: served from the cache
    with pytest.raises(VoiceNotFound):
        list(service.synthesize({"text": "Hi", "voice": "vx_" + "0" * 32}))


def test_first_audio_counts_from_the_request_including_voice_building(
    base_engine: Engine, blob_store: BlobStore
) -> None:
    service = Service.assemble(ServiceConfig(), base_engine, blob_store)
    t = np.arange(36000) / 24000  # a reference no other test registers
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 150 * t), 24000, format="WAV")
    req = {
        "text": "Hello there.",
        "ref_audio": base64.b64encode(buf.getvalue()).decode(),
        "ref_text": "Mine.",
    }
    stream = service.synthesize({**req, "voice": None, "max_frames": 3, "cache": False})
    chunks = list(stream)
    timing = stream.result.timing
    assert timing.voice_cache_hit is False and timing.voice_ms > 0
    # what a caller waited for: the first chunk's own time stamp, voice building included
    assert timing.ttfa_ms >= timing.voice_ms
    assert abs(timing.ttfa_ms - chunks[0].t_ms) < 5.0
    assert timing.total_ms >= timing.ttfa_ms


def test_a_new_reference_is_served_before_its_voice_reaches_the_store(
    base_engine: Engine, blob_store: BlobStore
) -> None:
    service = Service.assemble(ServiceConfig(), base_engine, blob_store)
    gate = threading.Event()
    service.voices._writer.submit(_holding(gate))  # type: ignore[union-attr]  # a slow store
    t = np.arange(30000) / 24000  # a reference no other test registers
    buf = io.BytesIO()
    sf.write(buf, 0.3 * np.sin(2 * np.pi * 210 * t), 24000, format="WAV")
    req = {"text": "Hi.", "ref_audio": base64.b64encode(buf.getvalue()).decode(), "ref_text": "Mine."}
    stream = service.synthesize({**req, "max_frames": 3, "cache": False})
    assert list(stream)  # the whole request ran while the voice's write waited
    vid = stream.result.voice_id
    assert vid is not None and not blob_store.exists(voice_keys(base_engine.identity, vid)[0])
    gate.set()
    assert service.voices.close(timeout=30)
    assert blob_store.exists(voice_keys(base_engine.identity, vid)[0])
    assert service.register_voice(buf.getvalue(), ref_text="Mine.") == vid  # stored: nothing to build


_UNIQUE = itertools.count()


def test_prompt_prefix_of_a_registered_voice_is_ready_and_a_new_reference_stores_it_in_its_prefill(
    base_engine: Engine, blob_store: BlobStore
) -> None:
    service = Service.assemble(ServiceConfig(), base_engine, blob_store)

    def wav(freq: float) -> bytes:
        buf = io.BytesIO()
        sf.write(buf, 0.3 * np.sin(2 * np.pi * freq * np.arange(30000) / 24000), 24000, format="WAV")
        return buf.getvalue()

    def timing(**req: object) -> Any:
        stream = service.synthesize({"text": "Hi.", "max_frames": 2, "cache": False, **req})
        list(stream)
        return stream.result.timing

    base = 230 + 20 * next(_UNIQUE)  # voices this engine's caches have not seen (one engine per module)
    vid = service.register_voice(wav(base), ref_text="Mine.")
    first = timing(voice=vid)
    assert first.prefix_cache_hit and first.prefix_positions > 0  # computed by register_voice
    inline = {"ref_audio": base64.b64encode(wav(base + 10)).decode(), "ref_text": "Mine."}
    new, again = timing(**inline), timing(**inline)
    assert new.voice_cache_hit is False and not new.prefix_cache_hit  # one pass: the voice was just built
    assert again.voice_cache_hit and again.prefix_cache_hit  # that pass stored the prefix
    service.voices.close(timeout=30)


def test_clone_on_custom_voice_is_refused(service: Service) -> None:
    with pytest.raises(InvalidRequest) as info:
        list(service.synthesize({"text": "Hi", "ref_audio": base64.b64encode(_ref_audio()).decode()}))
    assert info.value.field == "ref_audio"


def test_storage_outage_never_fails_synthesis(cv_engine: Engine, s3_server, s3_store: BlobStore) -> None:
    service = Service.assemble(ServiceConfig(), cv_engine, s3_store)
    s3_server.stop()
    try:
        data, result = _collect(service, seed=77, max_frames=4)
    finally:
        s3_server.start()
    assert len(data) > 0
    assert result.audio_key is None and result.cache_error
    assert not result.timing.cache_hit


def _holding(gate: threading.Event) -> Callable[[], None]:
    """A background-writer job that holds the writer until ``gate`` is set (a store that is slow)."""

    def hold() -> None:
        gate.wait(30)

    return hold
