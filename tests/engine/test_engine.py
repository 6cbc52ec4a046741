"""The engine contract on tiny random checkpoints: lazy streams, chunking, exact streaming, seeds,
concurrency, cancellation, limits, errors, warm-up and timing."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from tests.fixtures.engines import holding_steps, sharing_steps
from voxcast.config import EngineConfig, max_frames_for_text
from voxcast.engine.active import ramp_frames
from voxcast.engine.engine import Engine
from voxcast.errors import InvalidRequest

Factory = Callable[[str], Path]


@pytest.fixture(scope="module")
def cv_engine(tiny_model_dir: Factory) -> Engine:
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", chunk_frames=3)
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def base_engine(tiny_model_dir: Factory) -> Engine:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("base")), device="cpu", warmup=False))
    yield engine
    engine.close()


def _run(engine: Engine, **request: object) -> tuple[list, object]:
    stream = engine.synthesize({"text": "Hello there, how are you?", "voice": "ryan", **request})
    chunks = list(stream)
    return chunks, stream.timing


def _ref_audio_b64(seconds: float = 2.0, sr: int = 16000, channels: int = 2) -> str:
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * 150 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 2 * t))
    buf = io.BytesIO()
    sf.write(buf, np.stack([x] * channels, axis=1), sr, format="FLAC")
    return base64.b64encode(buf.getvalue()).decode()


def test_load_warms_every_path_and_reports_it(cv_engine: Engine) -> None:
    assert cv_engine.warmed and cv_engine.warmup_ms > 0 and cv_engine.load_ms > 0
    parts = cv_engine.warmup_parts  # the split, in order, adding up to the whole
    assert list(parts) == ["prepare", "requests", "prefixes", "calibration"] and parts["requests"] > 0
    assert sum(parts.values()) == pytest.approx(cv_engine.warmup_ms, abs=1.0)
    _, timing = _run(cv_engine, greedy=True, max_frames=4)
    assert timing.cold is False and timing.load_ms == cv_engine.load_ms


def test_stream_is_lazy(cv_engine: Engine) -> None:
    stream = cv_engine.synthesize({"text": "Hello", "voice": "ryan", "max_frames": 3})
    held = {k: v for k, v in cv_engine.stats().items() if k in ("active", "prefilling", "waiting")}
    assert held == {"active": 0, "prefilling": 0, "waiting": 0}  # neither queued nor running...
    assert stream.timing.frames == 0 and stream.timing.total_ms == 0  # ...nor done
    assert len(list(stream)) > 0


def test_chunk_schedule_and_streamed_equals_offline(cv_engine: Engine) -> None:
    cv_engine.keep_codes = True
    try:
        chunks, timing = _run(cv_engine, seed=3, max_frames=11)
    finally:
        cv_engine.keep_codes = False
    # ramped up to chunk_frames=3, each chunk at most half the audio sent before it
    assert [c.frames for c in chunks] == [1, 1, 1, 1, 2, 3, 2]
    assert [c.seq for c in chunks] == list(range(7))
    assert all(c.sample_rate == 24000 and c.pcm.dtype == np.float32 for c in chunks)
    assert all(len(c.pcm) == c.frames * 1920 for c in chunks)
    codes = torch.tensor(timing.extra["codes"])
    assert codes.shape == (11, 16)
    offline = cv_engine.model.codec_decoder.decode_offline(codes)
    streamed = np.concatenate([c.pcm for c in chunks])
    assert streamed.shape == offline.shape
    assert np.max(np.abs(streamed - offline)) <= 1e-5


def test_request_chunk_sizes_override_config(cv_engine: Engine) -> None:
    chunks, _ = _run(cv_engine, greedy=True, max_frames=9, first_chunk_frames=2, chunk_frames=5)
    assert [c.frames for c in chunks] == [2, 2, 2, 3]  # never shorter than the first chunk


def test_fixed_chunk_schedule_without_ramp(tiny_model_dir: Factory) -> None:
    config = EngineConfig(
        model=str(tiny_model_dir("custom_voice")),
        device="cpu",
        chunk_frames=3,
        chunk_ramp=False,
        warmup=False,
    )
    engine = Engine.load(config)
    try:
        chunks, _ = _run(engine, greedy=True, max_frames=11)
        assert [c.frames for c in chunks] == [1, 3, 3, 3, 1]
    finally:
        engine.close()


def test_seed_reproduces_and_greedy_is_deterministic(cv_engine: Engine) -> None:
    a = np.concatenate([c.pcm for c in _run(cv_engine, seed=11, max_frames=8)[0]])
    b = np.concatenate([c.pcm for c in _run(cv_engine, seed=11, max_frames=8)[0]])
    c = np.concatenate([c.pcm for c in _run(cv_engine, seed=12, max_frames=8)[0]])
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    g1 = np.concatenate([c.pcm for c in _run(cv_engine, greedy=True, max_frames=8)[0]])
    g2 = np.concatenate([c.pcm for c in _run(cv_engine, greedy=True, max_frames=8)[0]])
    assert np.array_equal(g1, g2)


def test_concurrent_streams_interleave_and_match_sequential(cv_engine: Engine) -> None:
    seeds = [21, 22, 23]
    sequential = {
        s: np.concatenate([c.pcm for c in _run(cv_engine, seed=s, max_frames=12)[0]]) for s in seeds
    }
    results: dict[int, np.ndarray] = {}
    firsts: dict[int, float] = {}
    lasts: dict[int, float] = {}

    def worker(seed: int) -> None:
        chunks, _ = _run(cv_engine, seed=seed, max_frames=12)
        firsts[seed], lasts[seed] = chunks[0].t_emit, chunks[-1].t_emit
        results[seed] = np.concatenate([c.pcm for c in chunks])

    threads = [threading.Thread(target=worker, args=(s,)) for s in seeds]
    with sharing_steps(cv_engine, len(seeds)):  # none can finish before the last has started
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    for s in seeds:
        assert np.array_equal(results[s], sequential[s])
    # interleaved, not queued: every stream's first chunk comes before any stream's last chunk
    assert max(firsts.values()) < min(lasts.values())


def test_cancel_stops_within_one_frame(cv_engine: Engine) -> None:
    with holding_steps(cv_engine) as release:  # the engine cannot run ahead of the cancel
        stream = cv_engine.synthesize(
            {"text": "A long text " * 20, "voice": "ryan", "seed": 1, "chunk_frames": 1}
        )
        first = next(stream)
        assert first.frames == 1
        stream.cancel()
        steps = cv_engine.stats()["steps"]  # counted as they start (+1: one whose check came first)
        release.set()
        rest = list(stream)
    assert len(rest) <= 1
    assert stream.timing.finish_reason == "cancelled"
    assert stream.timing.frames <= 2 and cv_engine.stats()["steps"] <= steps + 1


def test_derived_frame_limit_flags_runaway(cv_engine: Engine) -> None:
    text = "Hi there."
    chunks, timing = _run(cv_engine, text=text, seed=5)
    limit = max_frames_for_text(text)
    if timing.finish_reason == "max_frames":
        assert timing.runaway and timing.frames == limit
    else:
        assert timing.finish_reason == "eos" and timing.frames < limit
    assert sum(c.frames for c in chunks) == timing.frames


def test_explicit_limit_is_not_runaway(cv_engine: Engine) -> None:
    _, timing = _run(cv_engine, greedy=True, max_frames=5)
    assert timing.frames <= 5 and not timing.runaway


def test_timing_record_is_complete(cv_engine: Engine) -> None:
    chunks, timing = _run(cv_engine, seed=2, max_frames=10, request_id="req-1")
    d = timing.to_dict()
    assert d["request_id"] == "req-1"
    assert timing.frames == 10 and timing.chunks == len(chunks)
    assert timing.audio_s == pytest.approx(10 * 0.08)
    assert 0 < timing.ttfa_ms <= timing.total_ms
    assert (
        timing.prefill_ms > 0
        and timing.talker_ms > 0
        and timing.code_predictor_ms > 0
        and timing.codec_ms > 0
    )
    assert timing.rtf == pytest.approx(timing.total_ms / 1000 / timing.audio_s)
    assert timing.extra["seed"] == 2
    assert timing.finish_reason == "max_frames"


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"voice": "ryan", "language": "klingon"}, "language"),
        ({"ref_audio": _ref_audio_b64()}, "ref_audio"),
    ],
)
def test_model_level_errors_name_the_field(cv_engine: Engine, request_: dict, field: str) -> None:
    stream = cv_engine.synthesize({"text": "Hello", **request_})
    with pytest.raises(InvalidRequest) as info:
        list(stream)
    assert info.value.field == field
    # the engine keeps serving
    assert len(_run(cv_engine, greedy=True, max_frames=2)[0]) > 0


def test_base_model_clones_from_reference_audio(base_engine: Engine) -> None:
    ref = _ref_audio_b64()
    for extra in ({"ref_text": "This is my voice."}, {"x_vector_only": True}, {}):
        stream = base_engine.synthesize(
            {"text": "Hello", "ref_audio": ref, "greedy": True, "max_frames": 4, **extra}
        )
        chunks = list(stream)
        assert sum(c.frames for c in chunks) == 4
        assert stream.timing.voice_ms > 0


def test_base_model_rejects_named_speaker(base_engine: Engine) -> None:
    with pytest.raises(InvalidRequest) as info:
        list(base_engine.synthesize({"text": "Hello", "voice": "ryan"}))
    assert info.value.field == "voice"


def test_bad_reference_audio_names_the_field(base_engine: Engine) -> None:
    junk = base64.b64encode(b"this is not audio at all" * 10).decode()
    with pytest.raises(InvalidRequest) as info:
        list(base_engine.synthesize({"text": "Hello", "ref_audio": junk}))
    assert info.value.field == "ref_audio"


def test_cloning_on_a_model_that_cannot_is_refused_in_the_models_words(
    cv_engine: Engine, base_engine: Engine
) -> None:
    """The refusal is the family's capability (Qwen3-TTS: only Base checkpoints clone), read at load."""
    assert base_engine.cloning_refusal is None and base_engine.clones_voices
    assert cv_engine.cloning_refusal == "voice cloning needs a Base model; this one is custom_voice"
    buf = io.BytesIO()
    sf.write(buf, np.zeros(24000, np.float32), 24000, format="WAV")
    with pytest.raises(InvalidRequest) as info:
        cv_engine.create_voice(buf.getvalue(), "Hello.")
    assert info.value.field == "ref_audio" and info.value.message == cv_engine.cloning_refusal


def test_voice_design_needs_and_uses_instruct(tiny_model_dir: Factory) -> None:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("voice_design")), device="cpu", warmup=False))
    try:
        chunks = list(
            engine.synthesize(
                {"text": "Hello", "instruct": "A warm low voice.", "greedy": True, "max_frames": 3}
            )
        )
        assert sum(c.frames for c in chunks) == 3
    finally:
        engine.close()


def test_closed_engine_refuses_work(tiny_model_dir: Factory) -> None:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    engine.close()
    from voxcast.errors import EngineUnavailable

    with pytest.raises(EngineUnavailable):
        list(engine.synthesize({"text": "Hello", "voice": "ryan"}))


@pytest.mark.parametrize(
    ("first", "size", "frames"), [(1, 4, 13), (1, 3, 9), (2, 5, 18), (4, 4, 8), (1, 1, 2), (3, 2, 5)]
)
def test_ramp_frames_reach_a_full_size_chunk(first: int, size: int, frames: int) -> None:
    # 1, 1, 1, 1, 2, 3, 4 = 13; 1, 1, 1, 1, 2, 3 = 9; 2, 2, 2, 3, 4, 5 = 18; 4, 4; 1, 1; 3, 2
    assert ramp_frames(first, size) == frames


def test_first_chunks_are_handed_off_once_per_stream_and_change_no_audio(tiny_model_dir: Factory) -> None:
    """The scheduler's pause after a step with first chunks (``handoff_ms``, CPU): counted once per
    stream, never for later chunks, and the audio is what an engine without it gives."""
    audio = {}
    for ms in (0.0, 3.0):
        engine = Engine.load(
            EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, handoff_ms=ms)
        )
        try:
            streams = [
                engine.synthesize({"text": "Hello there.", "voice": "ryan", "seed": s, "max_frames": 12})
                for s in (1, 2)
            ]
            out = [[c.pcm for c in stream] for stream in streams]  # read one after the other
            assert all(len(chunks) > 1 for chunks in out)
            assert engine.handoffs == (2 if ms else 0)
            audio[ms] = [np.concatenate(chunks) for chunks in out]
        finally:
            engine.close()
    for a, b in zip(audio[0.0], audio[3.0], strict=True):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="VOXCAST_HANDOFF_MS"):
        EngineConfig(handoff_ms=-1)
