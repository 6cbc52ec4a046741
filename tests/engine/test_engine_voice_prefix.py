"""A voice's prompt prefix is computed when the voice is built or loaded (and a CustomVoice model's
speakers' at warm-up), so its first request is already a prefix-cache hit."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.engines import audio_while_priming, reference_wav
from voxcast.audio.reference import synthetic_reference_audio
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt
from voxcast.service import Service, ServiceConfig
from voxcast.storage import BlobStore

Factory = Callable[[str], Path]
REF_TEXT = "This is a reference recording."
REQUEST = {"text": "Hello there, this is a test.", "max_frames": 5, "greedy": True}


@pytest.fixture(scope="module")
def engine(base_engine: Engine) -> Engine:
    return base_engine


def _wav(engine: Engine, seconds: float) -> bytes:
    return reference_wav(engine.sample_rate, seconds)


def _run(engine: Engine, voice: Any, **extra: Any) -> tuple[np.ndarray, Any]:
    stream = engine.synthesize({**REQUEST, **extra}, voice)
    pcm = np.concatenate([c.pcm for c in stream])
    return pcm, stream.timing


def test_create_voice_fills_the_prefix_so_the_first_request_hits(engine: Engine) -> None:
    voice = engine.create_voice(_wav(engine, 2.6), REF_TEXT)
    key = engine.model.build_prompt(REQUEST["text"], voice=voice).prefix_key
    assert key is not None and key in engine.model.prefix_kv
    _, timing = _run(engine, voice)
    assert timing.prefix_cache_hit and timing.prefix_positions > 0
    # another language has another prefix: computed by its first request, as before
    _, timing = _run(engine, voice, language="english")
    assert not timing.prefix_cache_hit


def test_x_vector_voices_get_their_prefix_too(engine: Engine) -> None:
    voice = engine.create_voice(_wav(engine, 2.7), None, x_vector_only=True)
    _, timing = _run(engine, voice)
    assert timing.prefix_cache_hit and timing.prefix_positions > 0


def test_a_request_with_its_own_reference_runs_the_one_pass_prefill(engine: Engine) -> None:
    ref = base64.b64encode(_wav(engine, 2.8)).decode()
    stream = engine.synthesize({**REQUEST, "ref_audio": ref, "ref_text": REF_TEXT})
    list(stream)
    assert stream.timing.voice_ms > 0 and not stream.timing.prefix_cache_hit


def test_prefix_filled_ahead_gives_what_a_prefix_filled_by_a_request_gives(engine: Engine) -> None:
    """float32: the prefix computed alone equals the one stored by a one-pass prefill up to rounding,
    and both hits give the same greedy audio (and the same audio as the one-pass miss)."""
    pcm = engine.model.make_voice_prompt(
        synthetic_reference_audio(engine.sample_rate, seconds=2.9), engine.sample_rate, REF_TEXT
    )

    def fresh() -> VoicePrompt:
        return VoicePrompt.from_bytes(pcm.to_bytes(), expected_identity=engine.identity)

    engine.model.prefix_kv.clear()
    miss, t_miss = _run(engine, fresh())  # one-pass prefill; stores the prefix
    by_request, t_hit = _run(engine, fresh())
    engine.model.prefix_kv.clear()
    ahead, t_ahead = _run(engine, engine.prime_voice(fresh()))
    assert not t_miss.prefix_cache_hit and t_hit.prefix_cache_hit and t_ahead.prefix_cache_hit
    np.testing.assert_array_equal(by_request, ahead)
    np.testing.assert_array_equal(miss, ahead)


def test_prime_voice_without_prefix_leaves_the_prefix_to_the_first_request(engine: Engine) -> None:
    voice = engine.prime_voice(
        engine.model.make_voice_prompt(
            synthetic_reference_audio(engine.sample_rate, seconds=3.1), engine.sample_rate, REF_TEXT
        ),
        prefix=False,
    )
    _, timing = _run(engine, voice)
    assert not timing.prefix_cache_hit


def test_filling_prefixes_from_many_threads_while_streams_run(engine: Engine) -> None:
    voices = [
        engine.model.make_voice_prompt(
            synthetic_reference_audio(engine.sample_rate, seconds=3.2 + 0.05 * i),
            engine.sample_rate,
            REF_TEXT,
        )
        for i in range(4)
    ]
    expected = [_run(engine, v)[0] for v in voices]  # misses, then stored
    engine.model.prefix_kv.clear()
    fresh = [VoicePrompt.from_bytes(v.to_bytes(), expected_identity=engine.identity) for v in voices]
    streams = [engine.synthesize(REQUEST, v) for v in voices]
    got = audio_while_priming(engine, streams, fresh)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
    for v in fresh:  # every fill landed (or found the prefix a stream stored first)
        assert engine.model.build_prompt("Hi.", voice=v).prefix_key in engine.model.prefix_kv


def test_service_fills_the_prefix_of_voices_it_loads_from_the_store(
    engine: Engine, blob_store: BlobStore
) -> None:
    config = ServiceConfig.from_env({})
    voice_id = Service.assemble(config, engine, blob_store).register_voice(_wav(engine, 3.4), REF_TEXT)
    engine.model.prefix_kv.clear()
    fresh = Service.assemble(config, engine, blob_store)  # a new worker: its voice LRU is empty
    prompt, lru_hit = fresh.voices.lookup(voice_id)
    assert not lru_hit
    _, timing = _run(engine, prompt)
    assert timing.prefix_cache_hit


def test_fill_prefix_needs_the_prefix_cache(tiny_model_dir: Factory) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), prefix_cache=False)
    assert not model.fill_prefix(speaker=model.speakers[0])
    assert model.fill_speaker_prefixes() == 0 and len(model.prefix_kv) == 0


def test_custom_voice_warm_up_fills_every_speaker_prefix(tiny_model_dir: Factory) -> None:
    config = EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", decode_thread="off")
    eng = Engine.load(config)
    try:
        model = eng.model
        assert len(model.speakers) > 1
        for speaker in model.speakers:
            assert model.build_prompt("Hi.", speaker=speaker).prefix_key in model.prefix_kv
        assert not model.fill_speaker_prefixes()  # nothing left to do
        stream = eng.synthesize({**REQUEST, "voice": model.speakers[-1]})
        list(stream)
        assert stream.timing.prefix_cache_hit
    finally:
        eng.close()
