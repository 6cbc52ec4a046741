"""S3Gen's prompt cache (voxcast/models/chatterbox_turbo/s3gen_prefix.py) on tiny random weights.

Each module that takes a cache continues a recorded prompt exactly: recording the first rows and
reading the rest gives the rows a pass over all of them gives (the attention's keys and values and the
convolutions' inputs are per row, so the prompt's part is the same either way at one module). Over the
whole flow the prompt's rows are computed alone, which changes the audio by a measured amount; the
stream stays a function of its tokens and seed, and the exact windows stay available."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from voxcast.models.chatterbox_turbo.hift import HiFT
from voxcast.models.chatterbox_turbo.s3gen_encoder import LookAhead, RelAttention, Upsample, rel_positions
from voxcast.models.chatterbox_turbo.s3gen_estimator import Attention, CausalConv1d
from voxcast.models.chatterbox_turbo.s3gen_flow import MELS, S3GenFlow
from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache
from voxcast.models.chatterbox_turbo.s3gen_stream import (
    TAIL,
    StreamSettings,
    TurboAudioStream,
    one_pass,
    prompt_cache,
)
from voxcast.testing.chatterbox_turbo import flow_state, hift_state

P, N = 9, 7


def _randomize(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return module.eval()


def _continued(
    module: torch.nn.Module, first: torch.Tensor, rest: torch.Tensor, *args: object
) -> torch.Tensor:
    cache = PromptCache(P)
    module(first, *args[:1], cache) if args else module(first, cache)
    cache.freeze()
    return module(rest, *args[1:], cache) if args else module(rest, cache)


def test_relative_position_attention_continues_a_prompt_exactly() -> None:
    attn = _randomize(RelAttention(), 1)
    x = torch.randn(1, P + N, 512, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        full = attn(x, rel_positions(P + N))
        part = _continued(attn, x[:, :P], x[:, P:], rel_positions(P), rel_positions(P + N))
    torch.testing.assert_close(part, full[:, P:], rtol=0, atol=1e-5)
    # a batch of continuations reads the batch-1 cache
    with torch.inference_mode():
        cache = PromptCache(P)
        attn(x[:, :P], rel_positions(P), cache)
        two = attn(x[:, P:].expand(2, -1, -1), rel_positions(P + N), cache.freeze())
    torch.testing.assert_close(two[1:], full[:, P:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("make", [LookAhead, Upsample])
def test_the_encoders_convolutions_continue_a_prompt_exactly(make: type[torch.nn.Module]) -> None:
    m = _randomize(make(), 3)
    x = torch.randn(1, P + N, 512, generator=torch.Generator().manual_seed(4))
    if make is Upsample:
        x = x.transpose(1, 2)  # [B, C, T]; two frames a token out
    with torch.inference_mode():
        full = m(x)
        part = _continued(
            m, x[..., :P] if make is Upsample else x[:, :P], x[..., P:] if make is Upsample else x[:, P:]
        )
    rows = full[..., 2 * P :] if make is Upsample else full[:, P:]
    torch.testing.assert_close(part, rows, rtol=1e-4, atol=1e-4)  # float rounding of other conv shapes


def test_the_estimators_attention_and_causal_convolution_continue_a_prompt_exactly() -> None:
    g = torch.Generator().manual_seed(5)
    attn, conv = _randomize(Attention(64, 2, 32), 6), _randomize(CausalConv1d(64, 64, 3), 7)
    x = torch.randn(1, P + N, 64, generator=g)
    with torch.inference_mode():
        torch.testing.assert_close(_continued(attn, x[:, :P], x[:, P:]), attn(x)[:, P:], rtol=0, atol=1e-5)
        xc = x.transpose(1, 2)
        torch.testing.assert_close(
            _continued(conv, xc[..., :P], xc[..., P:]), conv(xc)[..., P:], rtol=0, atol=1e-6
        )


@pytest.fixture(scope="module")
def flow() -> S3GenFlow:
    return S3GenFlow.from_tensors(flow_state("tiny", seed=2))


def _inputs(prompt: int, new: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(8)
    return (
        torch.randint(0, 6561, (1, prompt), generator=g),
        torch.randn(1, MELS, 2 * prompt, generator=g) - 5.0,
        torch.randn(192, generator=g),
        torch.randint(0, 6561, (1, new), generator=g),
        torch.randn(1, MELS, 2 * (prompt + new), generator=g),
    )


def test_a_continued_window_is_close_to_the_exact_one_and_reads_nothing_it_did_not_record(
    flow: S3GenFlow,
) -> None:
    pt, pm, xv, nt, z = _inputs(20, 12)
    with torch.inference_mode():
        exact = flow(pt, pm, xv, nt, z)
        cache = flow.prompt_cache(pt, pm, xv, z[..., :40])
        cont = flow.continue_prompt(cache, xv, nt, z[..., 40:])
        again = flow.continue_prompt(cache, xv, nt, z[..., 40:])
        batch = flow.continue_prompt(cache, xv, nt.expand(3, -1), z[..., 40:].expand(3, -1, -1))
    assert cont.shape == exact.shape == (1, MELS, 24)
    assert torch.equal(cont, again)  # reading never writes
    torch.testing.assert_close(batch[2:], cont, rtol=0, atol=1e-5)
    snr = 10 * torch.log10(exact.pow(2).mean() / (cont - exact).pow(2).mean())
    assert snr > 20, snr  # the prompt's rows no longer see the new tokens (full-size figures: docs)
    assert not torch.equal(cont, exact)  # and a change: the cache is really used


def test_a_prompt_too_short_or_mismatched_is_refused(flow: S3GenFlow) -> None:
    pt, pm, xv, _, z = _inputs(1, 2)
    with pytest.raises(ValueError, match="2 prompt tokens"):
        flow.prompt_cache(pt, pm, xv, z[..., :2])
    pt, pm, xv, _, z = _inputs(6, 2)
    with pytest.raises(ValueError, match="2 prompt tokens"):
        flow.prompt_cache(pt, pm, xv, z[..., :10])


def _voice(flow: S3GenFlow) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    pt, pm, xv, _, _ = _inputs(30, 1)
    return pt, pm, xv


def _stream_audio(
    flow: S3GenFlow,
    hift: HiFT,
    tokens: list[int],
    step: int,
    settings: StreamSettings,
    cache: PromptCache | None = None,
) -> tuple[TurboAudioStream, np.ndarray]:
    s = TurboAudioStream(flow, hift, *_voice(flow), 5, settings, cache=cache)
    parts = [s.push(tokens[i : i + step]) for i in range(0, len(tokens), step)]
    return s, np.concatenate([*parts, s.finish()])


@pytest.fixture(scope="module")
def hift() -> HiFT:
    return HiFT.from_tensors(hift_state("tiny", seed=3))


def test_the_cached_stream_is_a_function_of_tokens_and_seed_and_close_to_one_pass(
    flow: S3GenFlow, hift: HiFT
) -> None:
    tokens = torch.randint(0, 6561, (60,), generator=torch.Generator().manual_seed(9)).tolist()
    on = StreamSettings()
    assert on.prompt_cache == 1  # the default
    s, one = _stream_audio(flow, hift, tokens, 1, on)
    assert s.cache is not None
    for step in (5, 60):
        assert np.array_equal(_stream_audio(flow, hift, tokens, step, on)[1], one)
    given = prompt_cache(flow, *_voice(flow))  # a voice's cache made once and shared gives the same audio
    assert np.array_equal(_stream_audio(flow, hift, tokens, 7, on, given)[1], one)
    ref = one_pass(
        flow,
        hift,
        s.prompt_tokens,
        s.prompt_mel,
        s.xvector,
        torch.tensor([tokens + list(TAIL)]),
        s.noise,
        s.hift_stream,
    ).numpy()
    err = one - ref
    assert 10 * np.log10(np.mean(ref**2) / np.mean(err**2)) > 30
    s0, exact = _stream_audio(flow, hift, tokens, 1, StreamSettings(prompt_cache=0))
    assert s0.cache is None and not np.array_equal(exact, one)


def test_threads_share_one_voices_cache(flow: S3GenFlow) -> None:
    pt, pm, xv, nt, z = _inputs(20, 12)
    with torch.inference_mode():
        cache = flow.prompt_cache(pt, pm, xv, z[..., :40])
        want = flow.continue_prompt(cache, xv, nt, z[..., 40:])
    got: list[torch.Tensor] = []

    def run() -> None:
        with torch.inference_mode():
            for _ in range(3):
                got.append(flow.continue_prompt(cache, xv, nt, z[..., 40:]))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 9 and all(torch.equal(g, want) for g in got)
