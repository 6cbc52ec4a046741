"""GemmSeanet computes transformers' Mimi SEANet encoder (the codec encoder's convolutions)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from transformers.models.mimi.modeling_mimi import MimiEncoder, MimiResnetBlock

from voxcast.kernels import native as int8_kernel
from voxcast.kernels.seanet_gemm import GemmSeanet, supports
from voxcast.models.qwen3_tts.codec_encoder import CodecEncoder, build_mimi_encoder
from voxcast.testing.qwen3_tts_parts import speech_tokenizer_config


def _mimi(**overrides: Any) -> Any:
    cfg = dict(speech_tokenizer_config("tiny")["encoder_config"])
    cfg.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        mimi = build_mimi_encoder(cfg).eval()
        for name, buf in mimi.named_buffers():
            if name.endswith("embed_sum"):
                buf.copy_(torch.randn(buf.shape))  # distinct codebook entries
    return mimi


def _audio(samples: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(samples) * 0.2).astype(np.float32)


@pytest.mark.parametrize("samples", [1, 5, 1919, 1920, 1921, 7 * 1920 + 333])
@pytest.mark.parametrize("filters", [4, 16])
def test_equals_transformers_encoder(samples: int, filters: int) -> None:
    mimi = _mimi(num_filters=filters)
    fast = GemmSeanet(mimi.encoder)
    x = torch.from_numpy(_audio(samples))[None, None]
    with torch.inference_mode():
        want = mimi.encoder(x)
        got = fast(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_batch_of_two_equals_each_alone() -> None:
    fast = GemmSeanet(_mimi().encoder)
    x = torch.from_numpy(np.stack([_audio(4000, 1), _audio(4000, 2)]))[:, None]
    with torch.inference_mode():
        both = fast(x)
        alone = [fast(x[i : i + 1])[0] for i in range(2)]
    assert both.shape == (2, 32, 4000 // 960 + 1)
    for i in range(2):
        assert torch.allclose(both[i], alone[i])


def test_input_is_not_modified() -> None:
    fast = GemmSeanet(_mimi().encoder)
    x = torch.from_numpy(_audio(3000))[None, None]
    before = x.clone()
    with torch.inference_mode():
        fast(x)
    assert torch.equal(x, before)


def test_codes_equal_transformers_path() -> None:
    mimi = _mimi()
    ours = CodecEncoder(copy.deepcopy(mimi))
    theirs = CodecEncoder(mimi, gemm_seanet=False)
    assert isinstance(ours.mimi.encoder, GemmSeanet)
    assert isinstance(theirs.mimi.encoder, MimiEncoder)
    for seconds in (0.3, 1.0, 2.345):
        wav = _audio(int(seconds * 24000), seed=int(seconds * 1000))
        assert torch.equal(ours.encode(wav), theirs.encode(wav))


@pytest.mark.parametrize(
    "overrides",
    [
        {"use_causal_conv": False},
        {"use_conv_shortcut": True},
        {"pad_mode": "reflect"},
        {"dilation_growth_rate": 2, "num_residual_layers": 2},
    ],
)
def test_unsupported_layouts_keep_transformers_module(overrides: dict[str, Any]) -> None:
    mimi = _mimi(**overrides)
    assert not supports(mimi.encoder)
    with pytest.raises(ValueError, match="does not compute"):
        GemmSeanet(mimi.encoder)
    assert isinstance(CodecEncoder(mimi).mimi.encoder, MimiEncoder)


def test_streaming_padding_cache_is_refused() -> None:
    fast = GemmSeanet(_mimi().encoder)
    with pytest.raises(ValueError, match="padding_cache"):
        fast(torch.zeros(1, 1, 100), padding_cache=object())


needs_kernel = pytest.mark.skipif(not int8_kernel.load(), reason="voxcast's C++ library cannot be built here")


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


@needs_kernel
def test_fast_elu_within_an_ulp_of_the_exact_value() -> None:
    x = torch.cat(
        [
            torch.linspace(-100.0, 5.0, 200_001),
            torch.randn(100_003, generator=torch.Generator().manual_seed(0)) * 3,
            torch.tensor([0.0, -0.0, float("-inf"), float("inf"), -1e-30, -1e-7, 88.5, -88.5]),
        ]
    )
    out = torch.empty_like(x)
    torch.ops.voxcast.elu_into(x, out)
    exact = torch.where(x >= 0, x.double(), torch.expm1(x.double())).float()
    assert int(_ulps(out, exact).max()) <= 1
    assert torch.equal(out[-8:], torch.nn.functional.elu(x[-8:]))  # signs of zero and infinities
    nan = torch.tensor([float("nan")] * 9)
    torch.ops.voxcast.elu_into(nan, nan)  # in place, with a tail shorter than a vector
    assert bool(nan.isnan().all())


@needs_kernel
def test_fast_elu_refuses_what_it_cannot_take() -> None:
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match="x must be a contiguous float32"):
        torch.ops.voxcast.elu_into(x.t(), torch.empty(6, 4))
    with pytest.raises(RuntimeError, match="out must be"):
        torch.ops.voxcast.elu_into(x, torch.empty(5))


@needs_kernel
def test_fast_elu_encoder_gives_the_same_codes() -> None:
    mimi = _mimi(num_filters=16)
    fast = CodecEncoder(copy.deepcopy(mimi))
    assert fast.use_fast_elu(True)
    plain = CodecEncoder(mimi)
    x = torch.from_numpy(_audio(9000))[None, None]
    with torch.inference_mode():
        a, b = fast.mimi.encoder(x), plain.mimi.encoder(x)
    assert not torch.equal(a, b)  # it did run
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))
    for seconds in (0.5, 1.7):
        wav = _audio(int(seconds * 24000), seed=7)
        assert torch.equal(fast.encode(wav), plain.encode(wav))
    assert not CodecEncoder(_mimi(), gemm_seanet=False).use_fast_elu(True)  # transformers' module


def test_a_stack_starting_with_a_residual_block_is_not_taken() -> None:
    """A residual block adds into its input in place, so the first step must be a convolution."""
    encoder = _mimi().encoder
    encoder.layers.insert(0, encoder.layers[1])  # the first residual block, ahead of the first conv
    assert not supports(encoder)


def test_an_elu_not_followed_by_a_convolution_is_not_taken() -> None:
    """GemmSeanet applies each ELU while filling the next convolution's input: one before a residual
    block or at the end would be lost, so such a stack stays transformers' module."""
    encoder = _mimi().encoder
    assert supports(encoder)
    resblock = next(i for i, layer in enumerate(encoder.layers) if isinstance(layer, MimiResnetBlock))
    encoder.layers.insert(resblock, torch.nn.ELU())
    assert not supports(encoder)
    encoder = _mimi().encoder
    encoder.layers.append(torch.nn.ELU())
    assert not supports(encoder)
