"""The engine serving Chatterbox Turbo (tiny random checkpoint, official layout): the same request
schema, chunk protocol and timing as Qwen3-TTS; seeds, concurrency equal to one at a time,
cancellation, voices from reference audio, refused fields."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.fixtures.engines import audio_together, sharing_steps
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.errors import InvalidRequest
from voxcast.testing.signals import speech_like


@pytest.fixture(scope="module")
def engine(turbo_model_dir: Path) -> Iterator[Engine]:
    eng = Engine.load(EngineConfig(model=str(turbo_model_dir), device="cpu"))  # with warm-up
    yield eng
    eng.close()


def _run(engine: Engine, **request: object) -> tuple[np.ndarray, list, object]:
    stream = engine.synthesize({"text": "Hello there, how are you today?", **request})
    chunks = list(stream)
    return np.concatenate([c.pcm for c in chunks]), chunks, stream.timing


def _wav_b64(seconds: float) -> str:
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, 16000, seed=2), 16000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def test_warmed_and_described(engine: Engine) -> None:
    assert engine.model_type == "turbo" and engine.sample_rate == 24000
    assert engine.speakers == ("default",)
    # decode_thread=auto takes the model's choice on a CPU (a calibration run is shorter than the first chunk)
    assert engine.decode_calibration == {"decode_thread": True, "model_hint": True} and engine.decode_threaded


def test_builtin_voice_streams_in_chunks(engine: Engine) -> None:
    audio, chunks, timing = _run(engine, seed=3)
    assert timing.finish_reason == "eos" and len(chunks) >= 2
    # every token's 960 samples plus the three silence tokens upstream appends
    assert len(audio) == (timing.frames + 3) * 960
    assert sum(c.frames for c in chunks) == timing.frames
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert timing.ttfa_ms is not None and 0 < timing.ttfa_ms <= timing.total_ms
    assert np.abs(audio).max() <= 0.99


def test_seeds(engine: Engine) -> None:
    a, _, _ = _run(engine, seed=7)
    b, _, _ = _run(engine, seed=7)
    c, _, _ = _run(engine, seed=8)
    assert np.array_equal(a, b)
    assert not (len(a) == len(c) and np.array_equal(a, c))


def test_concurrent_streams_match_one_at_a_time(engine: Engine) -> None:
    seeds = [21, 22, 23]
    alone = {s: _run(engine, seed=s)[0] for s in seeds}
    requests = [{"text": "Hello there, how are you today?", "seed": s} for s in seeds]
    with sharing_steps(engine, len(seeds)) as ran:
        together = audio_together(engine, requests)
        steps, rows = ran()
    assert rows > steps  # they did run together
    for s, audio in zip(seeds, together, strict=True):
        assert np.array_equal(audio, alone[s])


def test_cancel_ends_the_stream_and_the_engine_keeps_serving(engine: Engine) -> None:
    stream = engine.synthesize({"text": "A long text to read. " * 10, "seed": 1})
    next(stream)
    stream.cancel()
    list(stream)
    assert stream.timing.finish_reason == "cancelled"
    assert _run(engine, seed=3)[2].finish_reason == "eos"


def test_reference_audio_in_the_request(engine: Engine) -> None:
    audio, _, timing = _run(engine, seed=2, ref_audio=_wav_b64(6.0))
    assert len(audio) > 0 and timing.voice_ms > 0
    with pytest.raises(InvalidRequest) as e:
        _run(engine, seed=2, ref_audio=_wav_b64(3.0))
    assert e.value.field == "ref_audio"


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"voice": "ryan"}, "voice"), ({"instruct": "sadly"}, "instruct"), ({"language": "german"}, "language")],
)
def test_refused_fields_name_the_field(engine: Engine, fields: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        _run(engine, **fields)
    assert e.value.field == field
    assert _run(engine, seed=3)[2].finish_reason == "eos"


def test_long_text_in_pieces_is_one_audio_stream(engine: Engine) -> None:
    text = "This is one sentence of a longer text. " * 12  # over 400 characters: sentence pieces
    audio, _, timing = _run(engine, text=text, seed=1)
    assert timing.pieces >= 2 and timing.frames > 0
    # one decoder across the pieces: the silence tail once, at the very end
    assert len(audio) == (timing.frames + 3) * 960


def test_text_arriving_in_sentences_sends_each_sentence_whole(engine: Engine) -> None:
    """Turbo takes whole sentences; while the next one has not arrived, the decoder's held-back audio
    (look-ahead) is flushed, so the listener hears the whole sentence spoken so far."""
    import time

    stream = engine.open({"text": "Hello there, my friend. How", "seed": 1})
    got: list = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the first sentence's audio, without waiting for the rest
        got.append(next(stream))
        frames = sum(c.frames for c in got)
        if frames and sum(len(c.pcm) for c in got) == frames * 960:
            break
    assert sum(c.frames for c in got) > 0 and sum(len(c.pcm) for c in got) == sum(c.frames for c in got) * 960
    stream.push(" are you?")
    stream.close_text()
    got.extend(stream)
    assert stream.timing.finish_reason == "eos"
    assert sum(len(c.pcm) for c in got) == (stream.timing.frames + 3) * 960


def test_derived_frame_limit_counts_turbo_frames(engine: Engine) -> None:
    from voxcast.config import max_frames_for_text

    # the runaway guard is written for 12.5 frames a second: Turbo's tokens are 25 a second
    assert engine._scheduler._pieces.frame_limit("Hi there.") == 2 * max_frames_for_text("Hi there.")


def test_family_settings_reach_the_model_from_the_environment(turbo_model_dir: Path) -> None:
    """``VOXCAST_TURBO_*`` are the family's settings: read and checked by the config, handed to the
    Turbo loader only, and part of the audio cache key (the model's render settings)."""
    env = {"VOXCAST_MODEL": str(turbo_model_dir), "VOXCAST_DEVICE": "cpu", "VOXCAST_WARMUP": "0"}
    config = EngineConfig.from_env({**env, "VOXCAST_TURBO_FIRST_TOKENS": "4", "VOXCAST_F32_ROWS": "off"})
    eng = Engine.load(config)
    try:
        stream = eng.render_settings["turbo_stream"]
        assert stream["first"] == 4 and stream["chunk"] == 32  # given, and the model's default
    finally:
        eng.close()
    with pytest.raises(ValueError, match="VOXCAST_TURBO_FIRST_TOKENS"):
        EngineConfig.from_env({**env, "VOXCAST_TURBO_FIRST_TOKENS": "0"})
