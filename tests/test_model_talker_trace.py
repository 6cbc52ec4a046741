"""The recorded one-row talker decode step (:mod:`voxcast.models.qwen3_tts.talker_trace`): bitwise the eager
step at every position, across key/value cache growth, in float32 and int8."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXT = "The recorded talker step replays the same operations at every position."


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_traced_step_equals_eager_at_every_position(tiny_model_dir: Any, quant: str) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant=quant)
    talker = model.talker
    rng = torch.Generator().manual_seed(0)
    hidden = talker.cfg.hidden_size
    prompt = torch.randn(1, 5, hidden, generator=rng)
    with torch.inference_mode():
        eager_cache = talker.new_cache(64, reserve=6)  # grows to 12, 24, 48 on the way
        traced_cache = talker.new_cache(64, reserve=6)
        talker(prompt, eager_cache, 0)
        talker(prompt, traced_cache, 0)
        talker.use_traced_step()
        assert talker.traced is not None
        for pos in range(5, 40):
            x = torch.randn(1, 1, hidden, generator=rng)
            talker.traced, traced = None, talker.traced
            want = talker(x, eager_cache, pos)
            talker.traced = traced
            got = talker(x, traced_cache, pos)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), pos
        assert traced_cache[0].capacity == eager_cache[0].capacity == 48
        for a, b in zip(eager_cache, traced_cache, strict=True):
            assert torch.equal(a.k[:, :, :40], b.k[:, :, :40]) and torch.equal(a.v[:, :, :40], b.v[:, :, :40])


def _codes(model: Qwen3TTS, greedy: bool) -> list[list[int]]:
    gen = model.new_generator(
        model.build_prompt(TEXT, speaker="ryan"), SamplingParams(seed=7, greedy=greedy), 12
    )
    frames = []
    while (f := gen.step()) is not None:
        frames.append(f.tolist())
    return frames


def test_traced_step_in_generation(tiny_model_dir: Any) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))
    eager = {g: _codes(model, g) for g in (True, False)}
    model.talker.use_traced_step()
    for greedy in (True, False):
        assert _codes(model, greedy) == eager[greedy]
    assert model.talker.traced is not None and model.talker.traced.ready  # recorded on first use


def test_engine_records_the_talker_step_with_trace_steps(tiny_model_dir: Any) -> None:
    on = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", decode_thread="off")
    )
    try:
        assert on.model.talker.traced is not None and on.model.talker.traced.ready  # recorded at warm-up
    finally:
        on.close()
    off = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, trace_steps=False)
    )
    try:
        assert off.model.talker.traced is None
    finally:
        off.close()
