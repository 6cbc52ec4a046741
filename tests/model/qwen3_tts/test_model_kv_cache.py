"""The talker's key/value cache grows with the positions written, and growing changes no output."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import voxcast.models.qwen3_tts.generator as generator
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.generator import step_many
from voxcast.models.qwen3_tts.kv_cache import KVCache
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXT = "The quick brown fox jumps over the lazy dog."


def _kv(n: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32).view(1, 1, n, 1).expand(1, 2, n, 3).clone()


def test_grows_by_doubling_keeps_positions_and_stops_at_the_limit() -> None:
    cache = KVCache(1, 2, 10, 3, dtype=torch.float32, device="cpu", reserve=2)
    assert cache.capacity == 2 and cache.max_len == 10
    sizes = []
    for pos in range(10):
        k_all, v_all = cache.update(pos, _kv(1, pos), -_kv(1, pos))
        sizes.append(cache.capacity)
        assert torch.equal(k_all, _kv(pos + 1)) and torch.equal(v_all, -_kv(pos + 1))
    assert sizes == [2, 2, 4, 4, 8, 8, 8, 8, 10, 10]
    with pytest.raises(ValueError, match="overflow"):
        cache.update(10, _kv(1), _kv(1))


def test_a_chunk_past_the_capacity_grows_to_fit() -> None:
    cache = KVCache(1, 2, 64, 3, dtype=torch.float32, device="cpu", reserve=4)
    cache.update(0, _kv(3), _kv(3))
    k_all, _ = cache.update(3, _kv(20, 3), _kv(20, 3))
    assert cache.capacity == 23 and torch.equal(k_all, _kv(23))


def test_without_reserve_everything_is_allocated_up_front() -> None:
    cache = KVCache(1, 2, 16, 3, dtype=torch.float32, device="cpu")
    assert cache.capacity == cache.max_len == 16
    wrapped = KVCache.wrap(cache.k, cache.v)
    assert wrapped.capacity == wrapped.max_len == 16


@pytest.fixture(scope="module")
def custom_voice(tiny_model_dir: Any) -> Qwen3TTS:
    return Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))


def _codes(model: Qwen3TTS, seeds: list[int], frames: int) -> list[torch.Tensor]:
    prompt = model.build_prompt(TEXT, speaker="ryan")
    gens = [model.new_generator(prompt, SamplingParams(seed=s), frames) for s in seeds]
    out: list[list[torch.Tensor]] = [[] for _ in gens]
    active = list(range(len(gens)))
    while active:
        for i, f in zip(active, step_many([gens[i] for i in active]), strict=True):
            if f is not None:
                out[i].append(f)
        active = [i for i in active if not gens[i].done]
    return [torch.stack(o) for o in out]


@pytest.mark.parametrize("seeds", [[7], [7, 8, 9]])
def test_growing_caches_give_the_same_codes_as_whole_ones(
    custom_voice: Qwen3TTS, seeds: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One stream and a batch of three, 40 frames: reserve 1 frame (grows 6 times) vs 4096 (never)."""
    monkeypatch.setattr(generator, "KV_RESERVE_FRAMES", 4096)
    whole = _codes(custom_voice, seeds, 40)
    monkeypatch.setattr(generator, "KV_RESERVE_FRAMES", 1)
    grown = _codes(custom_voice, seeds, 40)
    for a, b in zip(whole, grown, strict=True):
        assert a.shape == (40, 16) and torch.equal(a, b)


def test_a_generator_allocates_for_its_prompt_and_reserve_not_its_limit(custom_voice: Qwen3TTS) -> None:
    prompt = custom_voice.build_prompt(TEXT, speaker="ryan")
    gen = custom_voice.new_generator(prompt, SamplingParams(seed=1), 2400)
    cache = gen._cache[0]
    assert cache.max_len == prompt.length + 2400
    assert cache.capacity == prompt.length + generator.KV_RESERVE_FRAMES
