"""S3Gen's flow and its meanflow estimator against the official chatterbox-tts 0.1.7
``CausalMaskedDiffWithXvec`` / ``ConditionalDecoder`` (built as ``S3Gen(meanflow=True)`` builds them) on
the same random weights: the same velocity, and the same mel for the same noise, with and without a
voice prompt, in float32 and bfloat16. Needs ``diffusers==0.29.0`` and ``conformer==0.3.2`` beside
chatterbox-tts (``--no-deps``); skipped without them."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.parity._official_chatterbox_flow import (
    official_flow,
    official_flow_mel,
    official_flow_modules,
    pinned_noise,
)
from voxcast.models.chatterbox_turbo.s3gen_flow import S3GenFlow
from voxcast.testing.chatterbox_turbo import flow_state

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        official_flow_modules() is None,
        reason="chatterbox-tts, diffusers==0.29.0 or conformer==0.3.2 not importable",
    ),
]

Pair = tuple[S3GenFlow, Any]


def _pair(size: str, dtype: torch.dtype = torch.float32) -> Pair:
    state = flow_state(size, seed=3)
    ours = S3GenFlow.from_tensors(state)
    official = official_flow(state, ours.decoder.estimator.cfg)
    return ours.to(dtype), official.to(dtype)


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def tiny(request: pytest.FixtureRequest) -> Pair:
    return _pair("tiny", request.param)


def _assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit, except in bfloat16 on a CPU with AMX: there oneDNN's AMX kernels (which it takes at
    one thread) block the two implementations' matmuls differently, the same math rounded in another
    order, so the results may differ by a bf16 step of the largest value, at most two (not of each
    value's own size: a rounding difference carried through the layers lands on small values too)."""
    if torch.equal(got, want):
        return
    diff = float((got.float() - want.float()).abs().max())
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    assert got.dtype == torch.bfloat16 and amx, diff  # bitwise wherever the kernels are the same
    step = 2.0 ** (math.floor(math.log2(max(float(want.float().abs().max()), 1e-30))) - 7)
    assert diff <= 2 * step, (diff, step)


def _check_estimator(pair: Pair, frames: int, t: float, r: float) -> None:
    ours, official = pair
    dtype = ours.encoder_proj.weight.dtype
    g = torch.Generator().manual_seed(frames)
    x, mu, cond = (torch.randn(1, 80, frames, generator=g).to(dtype) for _ in range(3))
    spks = torch.randn(1, 80, generator=g).to(dtype)
    tt, rr = torch.tensor([t], dtype=dtype), torch.tensor([r], dtype=dtype)
    with torch.inference_mode():
        want = official.decoder.estimator(x, mask=torch.ones(1, 1, frames, dtype=dtype), mu=mu, t=tt,
                                          spks=spks, cond=cond, r=rr)  # fmt: skip
        got = ours.decoder.estimator(x, mu, tt, rr, spks, cond)
    assert got.shape == want.shape == (1, 80, frames)
    _assert_same(got, want)


def _check_mel(pair: Pair, prompt: int, new: int, seed: int = 0) -> None:
    ours, official = pair
    dtype = ours.encoder_proj.weight.dtype
    g = torch.Generator().manual_seed(100 * prompt + new)
    prompt_tokens = torch.randint(0, 6561, (1, prompt), generator=g)
    new_tokens = torch.randint(0, 6561, (1, new), generator=g)
    prompt_mel = torch.randn(1, 80, 2 * prompt, generator=g) - 5.0
    x_vector = torch.randn(1, 192, generator=g)
    want = official_flow_mel(official, prompt_tokens, prompt_mel, x_vector, new_tokens, seed, dtype)
    noise = pinned_noise(seed, 2 * prompt, 2 * new, dtype)
    with torch.inference_mode():
        got = ours(prompt_tokens, prompt_mel.to(dtype), x_vector.to(dtype), new_tokens, noise)
    assert got.shape == want.shape == (1, 80, 2 * new) and got.dtype == want.dtype == dtype
    _assert_same(got, want)


@pytest.mark.parametrize(("frames", "t", "r"), [(1, 0.0, 0.5), (7, 0.5, 1.0), (40, 0.0, 0.5), (40, 0.5, 1.0)])
def test_estimator_equals_the_official(tiny: Pair, frames: int, t: float, r: float) -> None:
    _check_estimator(tiny, frames, t, r)


@pytest.mark.parametrize(("prompt", "new"), [(0, 1), (0, 9), (5, 6), (30, 20)])
def test_mel_equals_the_official(tiny: Pair, prompt: int, new: int) -> None:
    _check_mel(tiny, prompt, new)


@pytest.mark.slow
def test_full_size_equals_the_official() -> None:
    pair = _pair("full")
    _check_estimator(pair, 33, 0.0, 0.5)
    _check_mel(pair, 0, 4)
    _check_mel(pair, 12, 7, seed=1)
