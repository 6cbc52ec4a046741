"""A voice's audio-decoder state is primed when the voice is built or loaded, not by its first request."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.engines import audio_while_priming, reference_wav
from voxcast.audio.reference import synthetic_reference_audio
from voxcast.engine.engine import Engine
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt
from voxcast.service import Service, ServiceConfig
from voxcast.storage import BlobStore

Factory = Callable[[str], Path]
REF_TEXT = "This is a reference recording."


@pytest.fixture(scope="module")
def engine(base_engine: Engine) -> Engine:
    return base_engine


def _wav(engine: Engine, seconds: float) -> bytes:
    return reference_wav(engine.sample_rate, seconds)


class _PrimeSpy:
    """Counts codec-decoder primings (``new_stream`` with reference codes) and the threads they ran on."""

    def __init__(self, model: Qwen3TTS, monkeypatch: pytest.MonkeyPatch) -> None:
        self.threads: list[str] = []
        real = model.codec_decoder.new_stream

        def new_stream(prime_codes: Any = None) -> Any:
            if prime_codes is not None:
                self.threads.append(threading.current_thread().name)
            return real(prime_codes=prime_codes)

        monkeypatch.setattr(model.codec_decoder, "new_stream", new_stream)


def _audio(engine: Engine, voice: Any) -> np.ndarray:
    stream = engine.synthesize({"text": "Hello there.", "max_frames": 6, "seed": 3}, voice)
    return np.concatenate([c.pcm for c in stream])


def test_create_voice_primes_off_the_scheduler_and_the_first_request_does_not(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = _PrimeSpy(engine.model, monkeypatch)
    voice = engine.create_voice(_wav(engine, 2.1), REF_TEXT)
    assert spy.threads == ["voxcast-oneoff"]
    _audio(engine, voice)
    _audio(engine, voice)
    assert spy.threads == ["voxcast-oneoff"]  # neither request primed again


def test_primed_ahead_or_on_first_use_gives_the_same_audio(engine: Engine) -> None:
    pcm = engine.model.make_voice_prompt(
        synthetic_reference_audio(engine.sample_rate, seconds=2.2), engine.sample_rate, REF_TEXT
    )
    lazy = VoicePrompt.from_bytes(pcm.to_bytes(), expected_identity=engine.identity)
    ahead = engine.prime_voice(VoicePrompt.from_bytes(pcm.to_bytes(), expected_identity=engine.identity))
    np.testing.assert_array_equal(_audio(engine, lazy), _audio(engine, ahead))


def test_x_vector_only_voices_need_no_priming(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    spy = _PrimeSpy(engine.model, monkeypatch)
    voice = engine.create_voice(_wav(engine, 2.3), None, x_vector_only=True)
    assert voice.ref_codes is None and engine.prime_voice(voice) is voice
    assert len(_audio(engine, voice)) > 0 and spy.threads == []


def test_priming_from_many_threads_while_streams_run(engine: Engine) -> None:
    voices = [
        engine.model.make_voice_prompt(
            synthetic_reference_audio(engine.sample_rate, seconds=2.0 + 0.05 * i),
            engine.sample_rate,
            REF_TEXT,
        )
        for i in range(4)
    ]
    expected = [_audio(engine, v) for v in voices]
    fresh = [VoicePrompt.from_bytes(v.to_bytes(), expected_identity=engine.identity) for v in voices]
    streams = [engine.synthesize({"text": "Hello there.", "max_frames": 6, "seed": 3}, v) for v in fresh]
    got = audio_while_priming(engine, streams, fresh)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_service_primes_voices_it_loads_from_the_store(
    engine: Engine, blob_store: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServiceConfig.from_env({})
    voice_id = Service.assemble(config, engine, blob_store).register_voice(_wav(engine, 2.4), REF_TEXT)
    spy = _PrimeSpy(engine.model, monkeypatch)
    fresh = Service.assemble(config, engine, blob_store)  # a new worker: its voice LRU is empty
    prompt, lru_hit = fresh.voices.lookup(voice_id)
    assert not lru_hit and spy.threads == ["voxcast-oneoff"]
    _audio(engine, prompt)
    assert spy.threads == ["voxcast-oneoff"]
