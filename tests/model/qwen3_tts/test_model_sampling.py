"""Sampling equals transformers' logits processors (same order, same ops) and the RNG order is fixed."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.sampling import (
    CodeSampler,
    SamplerSettings,
    TalkerSampler,
    make_generator,
    warp,
)

V, EOS = 3072, 2150


def _hf_talker(history: list[int], s: SamplerSettings) -> LogitsProcessorList:
    procs = LogitsProcessorList()
    if s.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    procs.append(MinNewTokensLengthLogitsProcessor(0, 2, torch.tensor([EOS])))
    procs.append(SuppressTokensLogitsProcessor([i for i in range(V - 1024, V) if i != EOS]))
    if not s.greedy:
        procs.extend(_hf_warpers(s))
    return procs


def _hf_warpers(s: SamplerSettings) -> list[object]:
    out: list[object] = []
    if s.temperature != 1.0:
        out.append(TemperatureLogitsWarper(s.temperature))
    if s.top_k:
        out.append(TopKLogitsWarper(top_k=s.top_k, min_tokens_to_keep=1))
    if s.top_p < 1.0:
        out.append(TopPLogitsWarper(top_p=s.top_p, min_tokens_to_keep=1))
    return out


SETTINGS = [
    SamplerSettings(),
    SamplerSettings(temperature=0.7, top_k=10, top_p=0.8, repetition_penalty=1.3),
    SamplerSettings(temperature=1.0, top_k=0, top_p=0.5, repetition_penalty=1.0),
    SamplerSettings(greedy=True),
]


@pytest.mark.parametrize("s", SETTINGS)
def test_talker_scores_equal_transformers(s: SamplerSettings) -> None:
    g = torch.Generator().manual_seed(0)
    sampler = TalkerSampler(V, EOS, s, torch.Generator().manual_seed(1))
    history: list[int] = []
    for step in range(5):
        logits = torch.randn(1, V, generator=g) * 3
        logits[0, EOS] = 50.0 if step < 3 else logits[0, EOS]  # eos would win if allowed
        ids = torch.tensor([history], dtype=torch.long)
        expected = _hf_talker(history, s)(ids, logits.clone())
        ours = sampler.scores(logits.clone())
        if not s.greedy:
            ours = warp(ours, s)
        assert torch.equal(ours, expected), f"step {step}"
        code = int(sampler(logits.clone())[0])
        history.append(code)
        if step < 2:
            assert code != EOS
        assert code < 2048 or code == EOS


def test_eos_allowed_from_the_third_sample() -> None:
    s = SamplerSettings(greedy=True)
    sampler = TalkerSampler(V, EOS, s, torch.Generator())
    logits = torch.zeros(1, V)
    logits[0, EOS] = 10.0
    assert [int(sampler(logits)[0]) for _ in range(3)][2] == EOS


def test_repetition_penalty_over_previous_codes() -> None:
    s = SamplerSettings(greedy=True, repetition_penalty=2.0)
    sampler = TalkerSampler(V, EOS, s, torch.Generator())
    logits = torch.zeros(1, V)
    logits[0, 5], logits[0, 6] = 3.0, 2.0
    assert int(sampler(logits)[0]) == 5
    assert int(sampler(logits)[0]) == 6  # 5 is now penalised to 1.5
    logits[0, 7] = -1.0
    scores = sampler.scores(logits)
    assert scores[0, 5] == 1.5 and scores[0, 6] == 1.0 and scores[0, 7] == -1.0


@pytest.mark.parametrize("s", SETTINGS[:3])
def test_code_sampler_draws_like_transformers(s: SamplerSettings) -> None:
    logits = torch.randn(1, 2048, generator=torch.Generator().manual_seed(3)) * 2
    expected_scores = LogitsProcessorList(_hf_warpers(s))(torch.zeros(1, 0, dtype=torch.long), logits.clone())
    torch.manual_seed(77)
    expected = [int(torch.multinomial(torch.softmax(expected_scores, -1), 1)[0, 0]) for _ in range(20)]
    sampler = CodeSampler(s, torch.Generator().manual_seed(77))
    assert [int(sampler(logits.clone())[0]) for _ in range(20)] == expected


def test_greedy_code_sampler_is_argmax() -> None:
    logits = torch.randn(2, 2048)
    assert torch.equal(
        CodeSampler(SamplerSettings(greedy=True), torch.Generator())(logits), logits.argmax(-1)
    )


def test_generator_seeding() -> None:
    a, seed_a = make_generator(123, "cpu")
    assert seed_a == 123
    torch.manual_seed(123)
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4))
    seeds = {make_generator(None, "cpu")[1] for _ in range(50)}
    assert len(seeds) == 50
    for s in seeds:  # a drawn seed can always be sent back in a request to replay the run
        SamplingParams(seed=s)


def test_settings_from_request_params() -> None:
    s = SamplerSettings.from_params(
        SamplingParams(temperature=0.5, top_k=7, top_p=0.9, repetition_penalty=1.2, greedy=True)
    )
    assert s == SamplerSettings(True, 0.5, 7, 0.9, 1.2)
    assert SamplerSettings.from_params(SamplingParams()) == SamplerSettings()
