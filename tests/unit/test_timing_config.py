"""Timing maths and configuration parsing (pure)."""

from __future__ import annotations

import pytest

from voxcast.config import DEFAULT_MAX_FRAMES_CAP, MIN_FRAMES, EngineConfig, max_frames_for_text
from voxcast.engine.timing import Timing, playback_stalls


def test_no_stall_when_chunks_arrive_ahead_of_playback() -> None:
    assert playback_stalls([0.0, 0.05, 0.1], [0.08, 0.32, 0.32]) == (0, 0.0)


def test_stall_is_the_gap_a_listener_hears() -> None:
    count, total = playback_stalls([0.0, 0.2, 0.3], [0.08, 0.32, 0.32])
    assert count == 1
    assert total == pytest.approx(0.12)


def test_stalls_of_an_empty_stream() -> None:
    assert playback_stalls([], []) == (0, 0.0)


def test_timing_to_dict_is_json_ready() -> None:
    t = Timing(request_id="r", talker_ms=10.0, code_predictor_ms=30.0, frames=4)
    d = t.to_dict()
    assert d["frame_ms"] == 10.0 and d["request_id"] == "r" and d["cache_hit"] is False


def test_max_frames_is_derived_from_text_and_capped() -> None:
    assert max_frames_for_text("Hi") == MIN_FRAMES + 5
    assert max_frames_for_text("word " * 2000) == DEFAULT_MAX_FRAMES_CAP
    assert max_frames_for_text("a b c", cap=10) == 10


def test_engine_config_from_env() -> None:
    cfg = EngineConfig.from_env({"VOXCAST_MODEL": "/m", "VOXCAST_CHUNK_FRAMES": "6", "VOXCAST_WARMUP": "no"})
    assert cfg.model == "/m" and cfg.chunk_frames == 6 and not cfg.warmup
    assert EngineConfig.from_env({}) == EngineConfig()
    assert EngineConfig(device="cpu").resolved_dtype() == "float32"


@pytest.mark.parametrize(
    "env", [{"VOXCAST_DTYPE": "fp8"}, {"VOXCAST_DEVICE": "tpu"}, {"VOXCAST_CHUNK_FRAMES": "0"}]
)
def test_engine_config_rejects_bad_values(env: dict) -> None:
    with pytest.raises(ValueError):
        EngineConfig.from_env(env)
