"""voxcast's int8 decode kernel (:mod:`voxcast.kernels.native`): built here with the
machine's compiler, then checked against float64 arithmetic, for row independence, against bad
inputs, as routed by :class:`voxcast.kernels.int8_linear.Int8Linear`, inside a model (eager and recorded steps), and for
its fallback to fbgemm where it cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from voxcast.engine.request import SamplingParams
from voxcast.kernels import native as int8_kernel
from voxcast.kernels.int8_linear import KERNEL_ROWS, Int8Linear
from voxcast.models.qwen3_tts.accel.quant import _int8
from voxcast.models.qwen3_tts.model import Qwen3TTS

pytestmark = pytest.mark.skipif(not int8_kernel.load(), reason="the int8 kernel cannot be built here")

TEXT = "The quick brown fox jumps over the lazy dog."


def _weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    bias = torch.randn(n, generator=g)
    return w, scale, bias


#: The variants this machine runs (AVX2 at least; AVX-512 VNNI where the CPU has it).
VARIANTS = int8_kernel.variants()


def test_variants_are_named_and_unknown_ones_refused() -> None:
    assert VARIANTS and VARIANTS[-1] == "avx2" and set(VARIANTS) <= set(int8_kernel.VARIANTS)
    with pytest.raises(ValueError, match="variant"):
        int8_kernel.pack(torch.zeros(4, 8, dtype=torch.int8), "avx3")


def _bound(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, variant: str) -> torch.Tensor:
    """How far a variant may be from float64 arithmetic on the same int8 weights."""
    mags = (x.double().abs() @ w.double().abs().T) * scale.double()
    bound = 1e-5 * mags + 1e-6  # float32 sums of k products, relative to their magnitudes
    if variant == "vnni":  # x rounded to 16 bits of its row's largest magnitude
        step = x.double().abs().amax(-1, keepdim=True) / 32767
        bound = bound + step / 2 * (w.double().abs().sum(1) * scale.double())
    return bound


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 4, 6, 37, 256])
@pytest.mark.parametrize("k", [8, 64, 1032])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_equals_float64_arithmetic(variant: str, n: int, k: int, with_bias: bool) -> None:
    w, scale, bias = _weights(n, k)
    b = bias if with_bias else None
    packed = int8_kernel.pack(w, variant)
    g = torch.Generator().manual_seed(k + n)
    for rows in (1, 2, 3, 4, 5, 9):
        x = torch.randn(rows, k, generator=g)
        ref = (x.double() @ w.double().T) * scale.double() + (0 if b is None else b.double())
        out = int8_kernel.linear(x, packed, scale, b, variant)
        assert out.shape == (rows, n) and out.dtype == torch.float32
        assert bool(((out.double() - ref).abs() <= _bound(x, w, scale, variant)).all())


@pytest.mark.skipif("vnni" not in VARIANTS, reason="this CPU lacks AVX-512 VNNI")
def test_vnni_handles_extreme_rows_and_shapes() -> None:
    """Zero rows, outliers, -128 weights, K a multiple of 4 only, the largest K; NaN and inf propagate."""
    w, scale, bias = _weights(70, 12)
    w[0] = -128
    packed = int8_kernel.pack(w, "vnni")
    x = torch.randn(4, 12)
    x[1] = 0.0
    x[2, 3] = 1e4  # one outlier: the rest of its row keeps 16 bits of 1e4
    ref = (x.double() @ w.double().T) * scale.double() + bias.double()
    out = int8_kernel.linear(x, packed, scale, bias, "vnni")
    assert torch.equal(out[1], bias)
    assert bool(((out.double() - ref).abs() <= _bound(x, w, scale, "vnni")).all())
    x[0, 5], x[3, 0] = float("nan"), float("inf")
    out = int8_kernel.linear(x, packed, scale, bias, "vnni")
    assert bool(out[0].isnan().all()) and bool(out[3].isnan().all()) and bool(out[1:3].isfinite().all())
    big, big_scale, _ = _weights(3, 65536, seed=2)
    big[:] = -128  # the largest int32 sums the kernel admits
    xb = torch.full((1, 65536), 3.0)
    ref = (xb.double() @ big.double().T) * big_scale.double()
    out = int8_kernel.linear(xb, int8_kernel.pack(big, "vnni"), big_scale, None, "vnni")
    assert bool(((out.double() - ref).abs() <= _bound(xb, big, big_scale, "vnni")).all())


@pytest.mark.parametrize("variant", VARIANTS)
def test_rows_do_not_depend_on_each_other(variant: str) -> None:
    """Every row of a call is bitwise the row computed alone, whatever the row count and grouping."""
    w, scale, bias = _weights(96, 1024, seed=1)
    packed = int8_kernel.pack(w, variant)
    x = torch.randn(7, 1024)
    alone = torch.cat([int8_kernel.linear(x[i : i + 1], packed, scale, bias, variant) for i in range(7)])
    for rows in (2, 3, 4, 5, 7):
        assert torch.equal(int8_kernel.linear(x[:rows], packed, scale, bias, variant), alone[:rows])


@pytest.mark.parametrize("variant", VARIANTS)
def test_leading_dimensions_and_strides_are_kept(variant: str) -> None:
    w, scale, _ = _weights(16, 64)
    packed = int8_kernel.pack(w, variant)
    x = torch.randn(3, 2, 128)[..., ::2]  # not contiguous
    out = int8_kernel.linear(x, packed, scale, None, variant)
    assert out.shape == (3, 2, 16)
    assert torch.equal(
        out, int8_kernel.linear(x.contiguous().view(6, 64), packed, scale, None, variant).view(3, 2, 16)
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_inputs_are_refused(variant: str) -> None:
    w, scale, _ = _weights(8, 64)
    packed = int8_kernel.pack(w, variant)
    with pytest.raises(RuntimeError, match=f"multiple of {8 if variant == 'avx2' else 4}"):
        int8_kernel.pack(torch.zeros(4, 6, dtype=torch.int8), variant)
    with pytest.raises(RuntimeError, match="int8"):
        int8_kernel.pack(torch.zeros(4, 16), variant)
    with pytest.raises(RuntimeError, match="does not match"):
        int8_kernel.linear(torch.randn(1, 72), packed, scale, None, variant)
    with pytest.raises(RuntimeError, match="float32"):
        int8_kernel.linear(torch.randn(1, 64, dtype=torch.float64), packed, scale, None, variant)
    with pytest.raises(RuntimeError, match="bias"):
        int8_kernel.linear(torch.randn(1, 64), packed, scale, torch.zeros(3), variant)
    if variant == "vnni":
        with pytest.raises(RuntimeError, match="at most 65536 inputs"):
            int8_kernel.pack(torch.zeros(1, 65540, dtype=torch.int8), variant)
        other = int8_kernel.pack(w, "avx2")  # another variant's layout
        with pytest.raises(RuntimeError, match="does not match"):
            int8_kernel.linear(torch.randn(1, 64), other, scale, None, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_int8_linear_routes_few_rows_to_the_kernel(variant: str) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 40)
    m = _int8(lin)
    assert m.pack_kernel(variant)
    assert m.packed is not None and m.scale is not None and m.variant == variant
    few, many = torch.randn(KERNEL_ROWS, 1, 64), torch.randn(KERNEL_ROWS + 1, 1, 64)
    assert torch.equal(m(few), m.q(few))  # kernel_rows is 0 until set
    m.kernel_rows = KERNEL_ROWS
    assert torch.equal(m(few), int8_kernel.linear(few, m.packed, m.scale, m.bias, variant))
    assert torch.equal(m(many), m.q(many))
    # same weights: the kernel differs from fbgemm only by fbgemm's activation rounding
    torch.testing.assert_close(m(few), m.q(few), rtol=0.05, atol=0.05)
    m.drop_kernel()
    assert m.packed is None and m.variant is None and torch.equal(m(few), m.q(few))


@pytest.fixture(scope="module")
def kernel_model(tiny_model_dir: Any) -> Qwen3TTS:
    return Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant="int8", int8_kernel=True)


def _codes(model: Qwen3TTS, frames: int = 8, seed: int = 3) -> torch.Tensor:
    gen = model.new_generator(
        model.build_prompt(TEXT, speaker="ryan"), SamplingParams(seed=seed, greedy=True), frames
    )
    out = []
    while (f := gen.step()) is not None:
        out.append(f)
    return torch.stack(out)


def test_model_uses_the_kernel_and_is_deterministic(kernel_model: Qwen3TTS) -> None:
    assert kernel_model.int8_kernel is True and kernel_model.int8_variant == VARIANTS[0]
    linears = [m for m in kernel_model.talker.modules() if isinstance(m, Int8Linear)]
    assert linears and all(m.packed is not None and m.kernel_rows == KERNEL_ROWS for m in linears)
    assert all(m.variant == VARIANTS[0] for m in linears)
    a = _codes(kernel_model)
    assert a.shape == (8, 16) and torch.equal(a, _codes(kernel_model))


@pytest.mark.parametrize("variant", VARIANTS)
def test_recorded_steps_equal_eager_steps_with_the_kernel(tiny_model_dir: Any, variant: str) -> None:
    kw: dict[str, Any] = {"quant": "int8", "int8_kernel": True, "int8_variant": variant}
    eager = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), **kw)
    traced = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), trace_steps=True, **kw)
    assert eager.int8_variant == traced.int8_variant == variant
    assert torch.equal(_codes(eager), _codes(traced))


def test_a_variant_the_cpu_cannot_run_is_refused(tiny_model_dir: Any) -> None:
    for variant in ("avx3", *(v for v in int8_kernel.VARIANTS if v not in VARIANTS)):
        with pytest.raises(ValueError, match=f"variant {variant!r}"):
            Qwen3TTS.from_pretrained(
                str(tiny_model_dir("custom_voice")), quant="int8", int8_kernel=True, int8_variant=variant
            )


def test_model_falls_back_to_fbgemm_where_the_kernel_cannot_be_built(
    tiny_model_dir: Any, tmp_path: Path
) -> None:
    """A kernel directory that cannot be created: the model logs why and keeps PyTorch's kernel."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    script = textwrap.dedent(
        f"""
        import logging
        logging.basicConfig(level=logging.WARNING)
        from voxcast.models.qwen3_tts.model import Qwen3TTS
        m = Qwen3TTS.from_pretrained({str(tiny_model_dir("custom_voice"))!r}, quant="int8")
        print("int8_kernel", m.int8_kernel)
        """
    )
    env = dict(os.environ, VOXCAST_KERNEL_DIR=str(blocker / "kernels"))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "int8_kernel False" in res.stdout
    assert "int8 decode kernel unavailable" in res.stderr
