"""The recorded one-row talker decode step (:mod:`voxcast.models.qwen3_tts.accel.talker_trace`): bitwise the eager
step at every position, across key/value cache growth, in float32 and int8."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.model.qwen3_tts.test_model_batching import batched_codes
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.accel.talker_trace import use_traced_step
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
        use_traced_step(talker)
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
    use_traced_step(model.talker)
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


def _row_caches(talker: Any, prompts: list[torch.Tensor]) -> list[list[Any]]:
    caches = []
    for p in prompts:
        cache = talker.new_cache(64, reserve=p.shape[1] + 1)  # grows on the way
        talker(p, cache, 0)
        caches.append(cache)
    return caches


@pytest.mark.parametrize("quant", ["none", "int8"])
@pytest.mark.parametrize("batch", [2, 4])
def test_traced_rows_equal_eager_rows(tiny_model_dir: Any, quant: str, batch: int) -> None:
    """Batched rows at their own positions, a bucket's size: bitwise the eager batched step."""
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant=quant)
    talker = model.talker
    rng = torch.Generator().manual_seed(1)
    hidden = talker.cfg.hidden_size
    prompts = [torch.randn(1, 3 + 2 * r, hidden, generator=rng) for r in range(batch)]
    with torch.inference_mode():
        eager, traced_caches = _row_caches(talker, prompts), _row_caches(talker, prompts)
        use_traced_step(talker)
        traced = talker.traced
        assert traced is not None
        starts = [p.shape[1] for p in prompts]
        for _ in range(30):
            x = torch.randn(batch, 1, hidden, generator=rng)
            talker.traced = None
            want = talker.forward_rows(x, eager, starts)
            talker.traced = traced
            got = talker.forward_rows(x, traced_caches, starts)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), starts
            starts = [s + 1 for s in starts]
        assert traced.row_buckets == [batch]
        for a, b, end in zip(eager, traced_caches, starts, strict=True):
            assert a[0].capacity == b[0].capacity > prompts[0].shape[1] + 1  # grew
            for ca, cb in zip(a, b, strict=True):
                assert torch.equal(ca.k[:, :, :end], cb.k[:, :, :end])
                assert torch.equal(ca.v[:, :, :end], cb.v[:, :, :end])


def test_traced_rows_fill_a_bucket_with_zero_rows(tiny_model_dir: Any) -> None:
    """Three rows run in the four-row recording: equal to the eager four-row step with a zero row."""
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant="int8")
    talker = model.talker
    rng = torch.Generator().manual_seed(2)
    hidden = talker.cfg.hidden_size
    prompts = [torch.randn(1, 4 + r, hidden, generator=rng) for r in range(3)]
    with torch.inference_mode():
        eager, traced_caches = _row_caches(talker, prompts), _row_caches(talker, prompts)
        spare = talker.new_cache(1)
        use_traced_step(talker)
        traced = talker.traced
        assert traced is not None
        starts = [p.shape[1] for p in prompts]
        for _ in range(6):
            x = torch.randn(3, 1, hidden, generator=rng)
            talker.traced = None
            want = talker.forward_rows(
                torch.cat((x, x.new_zeros(1, 1, hidden))), [*eager, spare], [*starts, 0]
            )
            talker.traced = traced
            got = talker.forward_rows(x, traced_caches, starts)
            assert got[0].shape[0] == 3
            assert torch.equal(got[0], want[0][:3]) and torch.equal(got[1], want[1][:3])
            assert not want[0][3].any()  # the zero row stays zero
            starts = [s + 1 for s in starts]
        assert traced.row_buckets == [4]


def test_traced_rows_in_batched_generation(tiny_model_dir: Any) -> None:
    """Greedy and seeded codes of three streams decoded together: the same with and without recordings."""
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))
    texts = [TEXT, "A second, longer sentence with another length.", "Third."]

    def run(greedy: bool) -> list[list[list[int]]]:
        gens = [
            model.new_generator(
                model.build_prompt(t, speaker="ryan"), SamplingParams(seed=3 + i, greedy=greedy), 10
            )
            for i, t in enumerate(texts)
        ]
        return batched_codes(gens)

    eager = {g: run(g) for g in (True, False)}
    use_traced_step(model.talker)
    model.prepare_batches(4)
    assert model.talker.traced is not None and model.talker.traced.row_buckets == [2, 4]
    for greedy in (True, False):
        assert run(greedy) == eager[greedy]
