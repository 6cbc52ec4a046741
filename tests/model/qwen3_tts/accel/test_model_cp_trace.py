"""Recorded code-predictor steps (:mod:`voxcast.models.qwen3_tts.accel.cp_trace`): bitwise the eager path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.model.qwen3_tts.test_model_batching import batched_codes
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.accel.cp_trace import use_traced_steps
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXTS = [
    "Recorded steps replay the same operations.",
    "A second stream, with another length.",
    "A third stream pads the batch to four rows.",
]


def _run(model: Qwen3TTS, greedy: bool, frames: int = 8) -> list[list[list[int]]]:
    gens = [
        model.new_generator(
            model.build_prompt(t, speaker="ryan"), SamplingParams(seed=4 + i, greedy=greedy), frames
        )
        for i, t in enumerate(TEXTS)
    ]
    return batched_codes(gens)


@pytest.mark.parametrize("quant", ["none", "int8"])
def test_traced_steps_equal_eager_bitwise(tiny_model_dir: Any, quant: str) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant=quant)
    cp = model.talker.code_predictor
    hidden = torch.randn(2, 1, model.talker.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    code0 = model.talker.codec_embed(torch.tensor([[3], [9]]))
    with torch.inference_mode():
        want = cp.predict_frame(hidden, code0, lambda logits: logits.argmax(-1))
        use_traced_steps(cp)
        got = cp.predict_frame(hidden, code0, lambda logits: logits.argmax(-1))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_traced_steps_in_generation(tiny_model_dir: Any) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))
    eager = {g: _run(model, g) for g in (True, False)}
    use_traced_steps(model.talker.code_predictor)
    assert model.talker.code_predictor.traced is not None
    for greedy in (True, False):
        assert _run(model, greedy) == eager[greedy]
    # single stream too (batch size 1 is recorded on first use)
    single = model.new_generator(model.build_prompt(TEXTS[0], speaker="ryan"), SamplingParams(greedy=True), 8)
    frames = []
    while (f := single.step()) is not None:
        frames.append(f.tolist())
    use_traced_steps(model.talker.code_predictor, False)
    again = model.new_generator(model.build_prompt(TEXTS[0], speaker="ryan"), SamplingParams(greedy=True), 8)
    want = []
    while (f := again.step()) is not None:
        want.append(f.tolist())
    assert frames == want


def test_engine_records_every_batch_bucket_at_warmup(tiny_model_dir: Any) -> None:
    from voxcast.config import EngineConfig
    from voxcast.engine.engine import Engine

    assert EngineConfig.from_env({}).trace_steps
    assert not EngineConfig.from_env({"VOXCAST_TRACE_STEPS": "0"}).trace_steps
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", max_active=3))
    try:
        traced = engine.model.talker.code_predictor.traced
        assert traced is not None and sorted(traced._steps) == [1, 2, 4]
    finally:
        engine.close()
    off = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, trace_steps=False)
    )
    try:
        assert off.model.talker.code_predictor.traced is None
    finally:
        off.close()
