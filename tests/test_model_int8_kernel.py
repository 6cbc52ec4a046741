"""voxcast's int8 decode kernel (:mod:`voxcast.models.qwen3_tts.int8_kernel`): built here with the
machine's compiler, then checked against float64 arithmetic, for row independence, against bad
inputs, as routed by :class:`.quant.Int8Linear`, inside a model (eager and recorded steps), and for
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
from voxcast.models.qwen3_tts import int8_kernel
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.quant import KERNEL_ROWS, Int8Linear, _int8

pytestmark = pytest.mark.skipif(not int8_kernel.load(), reason="the int8 kernel cannot be built here")

TEXT = "The quick brown fox jumps over the lazy dog."


def _weights(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    bias = torch.randn(n, generator=g)
    return w, scale, bias


@pytest.mark.parametrize("n", [1, 4, 6, 37, 256])
@pytest.mark.parametrize("k", [8, 64, 1032])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_equals_float64_arithmetic(n: int, k: int, with_bias: bool) -> None:
    w, scale, bias = _weights(n, k)
    b = bias if with_bias else None
    packed = int8_kernel.pack(w)
    g = torch.Generator().manual_seed(k + n)
    for rows in (1, 2, 3, 4, 5, 9):
        x = torch.randn(rows, k, generator=g)
        ref = (x.double() @ w.double().T) * scale.double() + (0 if b is None else b.double())
        out = int8_kernel.linear(x, packed, scale, b)
        assert out.shape == (rows, n) and out.dtype == torch.float32
        # float32 sums of k products: error bounded relative to the sum of their magnitudes
        bound = 1e-5 * (x.double().abs() @ w.double().abs().T) * scale.double() + 1e-6
        assert bool(((out.double() - ref).abs() <= bound).all())


def test_rows_do_not_depend_on_each_other() -> None:
    """Every row of a call is bitwise the row computed alone, whatever the row count and grouping."""
    w, scale, bias = _weights(96, 1024, seed=1)
    packed = int8_kernel.pack(w)
    x = torch.randn(7, 1024)
    alone = torch.cat([int8_kernel.linear(x[i : i + 1], packed, scale, bias) for i in range(7)])
    for rows in (2, 3, 4, 5, 7):
        assert torch.equal(int8_kernel.linear(x[:rows], packed, scale, bias), alone[:rows])


def test_leading_dimensions_and_strides_are_kept() -> None:
    w, scale, _ = _weights(16, 64)
    packed = int8_kernel.pack(w)
    x = torch.randn(3, 2, 128)[..., ::2]  # not contiguous
    out = int8_kernel.linear(x, packed, scale, None)
    assert out.shape == (3, 2, 16)
    assert torch.equal(
        out, int8_kernel.linear(x.contiguous().view(6, 64), packed, scale, None).view(3, 2, 16)
    )


def test_bad_inputs_are_refused() -> None:
    w, scale, _ = _weights(8, 64)
    packed = int8_kernel.pack(w)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        int8_kernel.pack(torch.zeros(4, 12, dtype=torch.int8))
    with pytest.raises(RuntimeError, match="int8"):
        int8_kernel.pack(torch.zeros(4, 16))
    with pytest.raises(RuntimeError, match="does not match"):
        int8_kernel.linear(torch.randn(1, 72), packed, scale, None)
    with pytest.raises(RuntimeError, match="float32"):
        int8_kernel.linear(torch.randn(1, 64, dtype=torch.float64), packed, scale, None)
    with pytest.raises(RuntimeError, match="bias"):
        int8_kernel.linear(torch.randn(1, 64), packed, scale, torch.zeros(3))


def test_int8_linear_routes_few_rows_to_the_kernel() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 40)
    m = Int8Linear(_int8(lin))
    assert m.pack_kernel()
    assert m.packed is not None and m.scale is not None
    few, many = torch.randn(KERNEL_ROWS, 1, 64), torch.randn(KERNEL_ROWS + 1, 1, 64)
    assert torch.equal(m(few), m.q(few))  # kernel_rows is 0 until set
    m.kernel_rows = KERNEL_ROWS
    assert torch.equal(m(few), int8_kernel.linear(few, m.packed, m.scale, m.bias))
    assert torch.equal(m(many), m.q(many))
    # same weights: the kernel differs from fbgemm only by fbgemm's activation rounding
    torch.testing.assert_close(m(few), m.q(few), rtol=0.05, atol=0.05)
    m.drop_kernel()
    assert m.packed is None and torch.equal(m(few), m.q(few))


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
    assert kernel_model.int8_kernel is True
    linears = [m for m in kernel_model.talker.modules() if isinstance(m, Int8Linear)]
    assert linears and all(m.packed is not None and m.kernel_rows == KERNEL_ROWS for m in linears)
    a = _codes(kernel_model)
    assert a.shape == (8, 16) and torch.equal(a, _codes(kernel_model))


def test_recorded_steps_equal_eager_steps_with_the_kernel(tiny_model_dir: Any) -> None:
    eager = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant="int8", int8_kernel=True)
    traced = Qwen3TTS.from_pretrained(
        str(tiny_model_dir("custom_voice")), quant="int8", int8_kernel=True, trace_steps=True
    )
    assert torch.equal(_codes(eager), _codes(traced))


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
