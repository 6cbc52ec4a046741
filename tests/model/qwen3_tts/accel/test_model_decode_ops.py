"""voxcast's fused decode operations (:mod:`voxcast.models.qwen3_tts.accel.decode_ops`): the RMSNorm and the
q/k norm + rotary embedding against PyTorch's operations, rows independent, bad inputs refused, and
the model's choice (on with int8 weights, off for float32 weights, whose parity with the official
implementation is bitwise), eager and recorded steps alike."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from voxcast.config import EngineConfig
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.accel import decode_ops
from voxcast.models.qwen3_tts.layers import Attention, RMSNorm, _rotate_half
from voxcast.models.qwen3_tts.model import Qwen3TTS

pytestmark = pytest.mark.skipif(
    not decode_ops.available(), reason="the fused operations cannot be built here"
)

TEXT = "The quick brown fox jumps over the lazy dog."


def _norm(dim: int, seed: int = 0) -> RMSNorm:
    norm = RMSNorm(dim, 1e-6)
    with torch.no_grad():
        norm.weight.normal_(generator=torch.Generator().manual_seed(seed))
    return norm


@pytest.mark.parametrize("shape", [(1, 1, 1024), (2, 3, 1024), (5, 128), (7,), (3, 1, 2, 37)])
def test_rms_norm_equals_pytorch(shape: tuple[int, ...]) -> None:
    norm = _norm(shape[-1])
    x = torch.randn(shape) * 3
    with torch.inference_mode():
        fused = torch.ops.voxcast.rms_norm(x, norm.weight, norm.eps)
        torch.testing.assert_close(fused, norm(x), rtol=2e-6, atol=2e-6)
        assert fused.shape == x.shape and fused.dtype == torch.float32


def test_rms_norm_rows_are_independent_and_strides_kept() -> None:
    norm = _norm(64)
    x = torch.randn(9, 128)[:, ::2]  # not contiguous
    with torch.inference_mode():
        whole = torch.ops.voxcast.rms_norm(x, norm.weight, norm.eps)
        alone = torch.cat([torch.ops.voxcast.rms_norm(x[i : i + 1], norm.weight, norm.eps) for i in range(9)])
        assert torch.equal(whole, alone)
        zero = torch.ops.voxcast.rms_norm(torch.zeros(1, 64), norm.weight, norm.eps)
        assert torch.equal(zero, torch.zeros(1, 64))


def _eager_norm_rope(
    x: torch.Tensor, norm: RMSNorm, cos: torch.Tensor, sin: torch.Tensor, d: int
) -> torch.Tensor:
    b, n, _ = x.shape
    h = norm(x.view(b, n, -1, d)).transpose(1, 2)
    return h * cos + _rotate_half(h) * sin


@pytest.mark.parametrize(
    ("b", "n", "heads", "d", "table_rows"), [(1, 1, 16, 128, 1), (3, 1, 8, 128, 3), (2, 5, 4, 64, 1)]
)
def test_norm_rope_equals_pytorch(b: int, n: int, heads: int, d: int, table_rows: int) -> None:
    norm = _norm(d, seed=1)
    fused_qkv = torch.randn(b, n, heads * d + 2 * 4 * d)
    x = fused_qkv[..., : heads * d]  # a view of the fused projection, as in Attention
    cos, sin = torch.randn(table_rows, 1, n, d), torch.randn(table_rows, 1, n, d)
    with torch.inference_mode():
        fused = torch.ops.voxcast.norm_rope(x, norm.weight, cos, sin, norm.eps, d)
        assert fused.shape == (b, heads, n, d) and fused.is_contiguous()
        torch.testing.assert_close(fused, _eager_norm_rope(x, norm, cos, sin, d), rtol=2e-6, atol=5e-6)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's attention as :class:`.layers.Attention` runs it: queries at the cache's last positions."""
    b, h, n, d = q.shape
    start = k.shape[2] - n
    mask = torch.arange(start, start + n)[:, None] >= torch.arange(start + n)[None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=d**-0.5, enable_gqa=h != k.shape[1]
    )
    return out.transpose(1, 2).reshape(b, n, h * d)


@pytest.mark.parametrize(
    ("b", "heads", "kv_heads", "n", "cached", "d"),
    [
        (1, 16, 8, 1, 300, 128),
        (1, 16, 8, 2, 0, 128),
        (2, 16, 8, 1, 16, 128),
        (1, 8, 8, 4, 37, 64),
        (1, 4, 2, 1, 0, 64),
    ],
)
def test_decode_attention_equals_pytorch(
    b: int, heads: int, kv_heads: int, n: int, cached: int, d: int
) -> None:
    g = torch.Generator().manual_seed(n + cached)
    q = torch.randn(b, heads, n, d, generator=g)
    # the cache's filled part: a view of a longer buffer, as KVCache.update returns it
    k = torch.randn(b, kv_heads, cached + n + 5, d, generator=g)[:, :, : cached + n]
    v = torch.randn(b, kv_heads, cached + n + 5, d, generator=g)[:, :, : cached + n]
    with torch.inference_mode():
        out = torch.ops.voxcast.decode_attention(q, k, v, d**-0.5)
        assert out.shape == (b, n, heads * d)
        torch.testing.assert_close(out, _sdpa(q, k, v), rtol=1e-5, atol=2e-6)
        # batch rows are independent: each equals its own call
        alone = torch.cat(
            [
                torch.ops.voxcast.decode_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], d**-0.5)
                for i in range(b)
            ]
        )
        assert torch.equal(out, alone)


def test_bad_inputs_name_what_is_wrong() -> None:
    w = torch.ones(8)
    with pytest.raises(RuntimeError, match="weight must be a contiguous float32 vector of 8"):
        torch.ops.voxcast.rms_norm(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="x must be float32"):
        torch.ops.voxcast.rms_norm(torch.randn(2, 8, dtype=torch.float64), w, 1e-6)
    cos = torch.ones(1, 1, 1, 8)
    with pytest.raises(RuntimeError, match="whole heads"):
        torch.ops.voxcast.norm_rope(torch.randn(1, 1, 20), w, cos, cos, 1e-6, 8)
    with pytest.raises(RuntimeError, match=r"cos/sin must be float32 \[1 or B, 1, L, D\]"):
        torch.ops.voxcast.norm_rope(torch.randn(1, 2, 16), w, cos, cos, 1e-6, 8)
    with pytest.raises(RuntimeError, match="contiguous in its last dimension"):
        torch.ops.voxcast.norm_rope(torch.randn(1, 1, 32)[..., ::2], w, cos, cos, 1e-6, 8)
    q, kv = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 3, 8)
    with pytest.raises(RuntimeError, match="must be float32"):
        torch.ops.voxcast.decode_attention(q.double(), kv, kv, 0.3)
    with pytest.raises(RuntimeError, match="4 query heads are not a multiple of 3"):
        torch.ops.voxcast.decode_attention(q, torch.randn(1, 3, 3, 8), torch.randn(1, 3, 3, 8), 0.3)
    with pytest.raises(RuntimeError, match="at least as many cached positions"):
        torch.ops.voxcast.decode_attention(torch.randn(1, 4, 4, 8), kv, kv, 0.3)
    with pytest.raises(RuntimeError, match="k and v must be"):
        torch.ops.voxcast.decode_attention(q, kv, torch.randn(1, 2, 4, 8), 0.3)


def _codes(model: Qwen3TTS, frames: int = 8) -> torch.Tensor:
    gen = model.new_generator(
        model.build_prompt(TEXT, speaker="ryan"), SamplingParams(seed=3, greedy=True), frames
    )
    out = []
    while (f := gen.step()) is not None:
        out.append(f)
    return torch.stack(out)


def _fused_modules(model: Qwen3TTS) -> list[bool]:
    return [decode_ops.is_fused(m) for m in model.talker.modules() if isinstance(m, (RMSNorm, Attention))]


def test_on_with_int8_weights_off_with_float32_ones(tiny_model_dir: Any) -> None:
    path = str(tiny_model_dir("custom_voice"))
    int8 = Qwen3TTS.from_pretrained(path, quant="int8")
    assert int8.fused_ops is True and all(_fused_modules(int8))
    fp32 = Qwen3TTS.from_pretrained(path)
    assert fp32.fused_ops is False and not any(_fused_modules(fp32))
    off = Qwen3TTS.from_pretrained(path, quant="int8", fused_ops=False)
    assert off.fused_ops is False and not any(_fused_modules(off))
    # float32 weights on request: close to PyTorch's hidden states, not bitwise
    fused_fp32 = Qwen3TTS.from_pretrained(path, fused_ops=True)
    assert fused_fp32.fused_ops is True
    prompt = fp32.build_prompt(TEXT, speaker="ryan")
    with torch.inference_mode():
        n = prompt.embeds.shape[1]
        ref = fp32.talker(prompt.embeds, fp32.talker.new_cache(n + 1), 0)[0]
        out = fused_fp32.talker(prompt.embeds, fused_fp32.talker.new_cache(n + 1), 0)[0]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_base_models_codec_encoder_follows(tiny_model_dir: Any) -> None:
    """The codec encoder's ELUs run on the C++ operation, and the speaker encoder's convolutions as
    products, exactly when the decode operations are on (not bit-exact anyway)."""
    path = str(tiny_model_dir("base"))
    int8 = Qwen3TTS.from_pretrained(path, quant="int8")
    fp32 = Qwen3TTS.from_pretrained(path)
    assert int8.codec_encoder is not None and fp32.codec_encoder is not None
    assert int8.codec_encoder.mimi.encoder.fast_elu is True
    assert fp32.codec_encoder.mimi.encoder.fast_elu is False
    assert int8.net.speaker_encoder is not None and int8.net.speaker_encoder.gemm is True
    assert fp32.net.speaker_encoder is not None and fp32.net.speaker_encoder.gemm is False


def test_off_with_compile(tiny_model_dir: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The compiled static steps trace the model's operations; the fused ones have no traceable form."""
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), fused_ops=True, compile=True)
    assert model.fused_ops is False and not any(_fused_modules(model))
    assert "off with compile" in caplog.text


def test_recorded_steps_equal_eager_steps_with_fused_ops(tiny_model_dir: Any) -> None:
    path = str(tiny_model_dir("custom_voice"))
    eager = Qwen3TTS.from_pretrained(path, quant="int8")
    traced = Qwen3TTS.from_pretrained(path, quant="int8", trace_steps=True)
    assert eager.fused_ops and traced.fused_ops
    assert torch.equal(_codes(eager), _codes(traced))


def test_batched_rows_equal_single_rows_with_fused_ops(tiny_model_dir: Any) -> None:
    """The batched step's fused attention runs per row over its own cache, like a single row."""
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), fused_ops=True)
    talker = model.talker
    prompt = model.build_prompt(TEXT, speaker="ryan")
    n = prompt.embeds.shape[1]
    with torch.inference_mode():
        caches = [talker.new_cache(n + 4) for _ in range(2)]
        for c in caches:
            talker(prompt.embeds, c, 0)
        step = torch.randn(2, 1, prompt.embeds.shape[2])
        rows = talker.forward_rows(step, caches, [n, n])[0]
        ref_caches = [talker.new_cache(n + 4) for _ in range(2)]
        for c in ref_caches:
            talker(prompt.embeds, c, 0)
        ref = torch.cat([talker(step[i : i + 1], ref_caches[i], n)[0] for i in range(2)])
    # float32 weights batched vs one row: the projections' matmuls differ in the last bits
    torch.testing.assert_close(rows, ref, rtol=1e-4, atol=1e-4)


def test_config_field() -> None:
    assert "fused_ops" not in EngineConfig.from_env({}).settings  # auto: the family's default
    assert EngineConfig.from_env({"VOXCAST_FUSED_OPS": "0"}).settings["fused_ops"] is False
    assert EngineConfig.from_env({"VOXCAST_FUSED_OPS": "ON"}).settings["fused_ops"] is True
    with pytest.raises(ValueError, match="VOXCAST_FUSED_OPS"):
        EngineConfig.from_env({"VOXCAST_FUSED_OPS": "maybe"})
