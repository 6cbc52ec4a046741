"""FrameGenerator on tiny random checkpoints: determinism, limits, end of speech, timing fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.models import eos_prone_copy
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXT = "The quick brown fox jumps over the lazy dog."
EOS = 2150


@pytest.fixture(scope="module")
def custom_voice(tiny_model_dir: Any) -> Qwen3TTS:
    return Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))


def _run(
    model: Qwen3TTS, sampling: SamplingParams, max_frames: int, text: str = TEXT
) -> tuple[torch.Tensor, Any]:
    gen = model.new_generator(model.build_prompt(text, speaker="ryan"), sampling, max_frames)
    gen.prefill()
    frames = []
    while (f := gen.step()) is not None:
        frames.append(f)
    return (torch.stack(frames) if frames else torch.zeros(0, 16, dtype=torch.long)), gen


def test_same_seed_same_codes(custom_voice: Qwen3TTS) -> None:
    a, _ = _run(custom_voice, SamplingParams(seed=42), 12)
    b, _ = _run(custom_voice, SamplingParams(seed=42), 12)
    c, _ = _run(custom_voice, SamplingParams(seed=43), 12)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_random_seed_is_recorded_and_replays(custom_voice: Qwen3TTS) -> None:
    a, gen = _run(custom_voice, SamplingParams(), 8)
    b, _ = _run(custom_voice, SamplingParams(seed=gen.seed), 8)
    assert torch.equal(a, b)


def test_greedy_is_deterministic_without_seed(custom_voice: Qwen3TTS) -> None:
    a, _ = _run(custom_voice, SamplingParams(greedy=True), 10)
    b, _ = _run(custom_voice, SamplingParams(greedy=True, seed=5), 10)
    assert torch.equal(a, b)


def test_frames_shape_and_ranges(custom_voice: Qwen3TTS) -> None:
    codes, gen = _run(custom_voice, SamplingParams(seed=1), 10)
    assert codes.shape == (10, 16) and codes.dtype == torch.long
    assert gen.finish_reason == "max_frames" and gen.frames == 10
    assert int(codes[:, 0].max()) < 2048  # control ids are suppressed
    assert int(codes[:, 1:].max()) < 2048 and int(codes.min()) >= 0
    assert gen.prefill_s > 0 and gen.code_predictor_s > 0 and gen.talker_s > 0
    assert gen.step() is None  # stays finished


@pytest.mark.parametrize("limit", [0, 1, 2, 5])
def test_max_frames_is_a_hard_limit(custom_voice: Qwen3TTS, limit: int) -> None:
    codes, gen = _run(custom_voice, SamplingParams(seed=3), limit)
    assert codes.shape[0] == limit
    assert gen.finish_reason == "max_frames"


def test_prefix_of_a_longer_run(custom_voice: Qwen3TTS) -> None:
    """A shorter budget gives a prefix of the longer run (same draws in the same order)."""
    short, _ = _run(custom_voice, SamplingParams(seed=9), 4)
    long, _ = _run(custom_voice, SamplingParams(seed=9), 9)
    assert torch.equal(short, long[:4])


def test_step_prefills_on_demand(custom_voice: Qwen3TTS) -> None:
    gen = custom_voice.new_generator(
        custom_voice.build_prompt(TEXT, speaker="ryan"), SamplingParams(seed=1), 2
    )
    assert gen.step() is not None
    with pytest.raises(RuntimeError):
        gen.prefill()


def test_stops_at_end_of_speech(tiny_model_dir: Any, tmp_path: Path) -> None:
    model = Qwen3TTS.from_pretrained(str(eos_prone_copy(tiny_model_dir("custom_voice"), tmp_path)))
    for seed in range(4):
        codes, gen = _run(model, SamplingParams(seed=seed), 60)
        assert gen.finish_reason == "eos"
        assert 2 <= gen.frames < 60  # end of speech is blocked for the first two samples
        assert EOS not in codes[:, 0].tolist()


def test_two_streams_are_independent(custom_voice: Qwen3TTS) -> None:
    """Interleaving the steps of two generators changes neither's output."""
    alone, _ = _run(custom_voice, SamplingParams(seed=4), 6)
    p = custom_voice.build_prompt(TEXT, speaker="ryan")
    g1 = custom_voice.new_generator(p, SamplingParams(seed=4), 6)
    g2 = custom_voice.new_generator(
        custom_voice.build_prompt("Another text.", speaker="vivian"), SamplingParams(seed=8), 6
    )
    got = []
    while (f := g1.step()) is not None:
        got.append(f)
        g2.step()
    assert torch.equal(torch.stack(got), alone)


def test_bfloat16_runs(tiny_model_dir: Any) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), dtype=torch.bfloat16)
    assert model.talker.codec_head.weight.dtype == torch.bfloat16
    codes, _ = _run(model, SamplingParams(seed=2), 5)
    assert codes.shape == (5, 16)
    pcm = model.new_decoder(None).decode(codes)
    assert pcm.shape == (5 * 1920,)
