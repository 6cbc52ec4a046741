"""voxcast's float32 decode-row kernels (:mod:`.f32_rows`): the BLAS's order, its bits, the model's choice.

The kernels are a speed change only where this CPU's BLAS sums a one-row product in the order they
reproduce; the model checks that on every weight at load. The order itself is tested on any machine
against a NumPy statement of it; bitwise ``F.linear`` and identical codes where the BLAS matches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.model.qwen3_tts.accel.test_model_rows_linear import _gens
from tests.model.qwen3_tts.test_model_batching import _sequential, batched_codes
from voxcast.engine.request import SamplingParams
from voxcast.kernels.rows_linear import FusedLinear
from voxcast.models.qwen3_tts.accel import f32_rows
from voxcast.models.qwen3_tts.accel.graphs import use_static_decode
from voxcast.models.qwen3_tts.layers import MLP, Attention
from voxcast.models.qwen3_tts.model import Qwen3TTS

pytestmark = pytest.mark.skipif(not f32_rows.available(), reason="voxcast's C++ kernels do not build here")

# The 0.6B model's one-row shapes (fused q/k/v, o, fused gate/up, down, a head) and small ones.
SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072), (2048, 1024), (128, 64), (40, 36)]


def _order(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, columns: int = 1) -> np.ndarray:
    """The order the kernels reproduce, in NumPy float32 (each product and sum rounded on its own)."""
    peel = 4 - (w.data_ptr() >> 2) % 4  # scalar inputs first: to the first 16-byte aligned weight, or 4
    p = w.numpy() * x.reshape(-1).numpy()  # [N, K] products
    lanes = np.zeros((w.shape[0], 4), dtype=np.float32)
    if columns == 2:  # the two-column product (aligned rows): the first four products start the lanes
        lanes = lanes + p[:, :4]
    else:
        s = p[:, 0]
        for k in range(1, peel):
            s = s + p[:, k]
        lanes[:, 0] = s
    k = peel
    while k + 4 <= w.shape[1]:
        lanes = lanes + p[:, k : k + 4]
        k += 4
    y = (lanes[:, 0] + lanes[:, 2]) + (lanes[:, 1] + lanes[:, 3])
    for j in range(k, w.shape[1]):
        y = y + p[:, j]
    return y if b is None else y + b.numpy()


def _data(n: int, k: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [1, 1, k], a weight [n, k] starting ``offset`` floats past a 64-byte aligned address, a bias."""
    g = torch.Generator().manual_seed(n * 31 + k)
    flat = torch.randn(n * k + offset, generator=g) * 0.05
    return torch.randn(1, 1, k, generator=g), flat[offset:].view(n, k), torch.randn(n, generator=g)


def _blas_order() -> bool:
    return f32_rows.matches_blas(torch.randn(1024, 512))


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_kernels_compute_the_documented_order(n: int, k: int, offset: int) -> None:
    x, w, b = _data(n, k, offset)
    for bias in (None, b):
        want = _order(x, w, bias)
        assert np.array_equal(f32_rows.linear(x, w, bias).reshape(-1).numpy(), want)
        if n % 8 == 0:
            assert np.array_equal(f32_rows.packed_linear(x, f32_rows.pack(w), bias).reshape(-1).numpy(), want)


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_bitwise_f_linear_where_the_blas_takes_that_order(n: int, k: int, offset: int) -> None:
    if not _blas_order():
        pytest.skip("this CPU's BLAS sums one row in another order (the model keeps PyTorch's kernel)")
    x, w, b = _data(n, k, offset)
    for bias in (None, b):
        assert torch.equal(f32_rows.linear(x, w, bias), F.linear(x, w, bias))
        if n % 8 == 0:
            assert torch.equal(f32_rows.packed_linear(x, f32_rows.pack(w), bias), F.linear(x, w, bias))
    assert f32_rows.matches_blas(w, b, f32_rows.pack(w) if n % 8 == 0 else None)


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_pairs_of_positions_in_the_two_column_order(n: int, k: int) -> None:
    _, w, b = _data(n, k)
    pair = torch.randn(3, 2, k, generator=torch.Generator().manual_seed(k))  # 3 streams' two positions
    for bias in (None, b):
        want = np.stack([_order(pair[i // 2, i % 2], w, bias, columns=2) for i in range(6)])
        assert np.array_equal(f32_rows.linear(pair, w, bias, 2).reshape(6, -1).numpy(), want)
        if n % 8 == 0:
            got = f32_rows.packed_linear(pair, f32_rows.pack(w), bias, 2)
            assert np.array_equal(got.reshape(6, -1).numpy(), want)
        if _blas_order():
            alone = torch.cat([F.linear(pair[i : i + 1], w, bias) for i in range(3)])
            assert torch.equal(f32_rows.linear(pair, w, bias, 2), alone)


@pytest.mark.parametrize("rows", [2, 3, 5, 8])
@pytest.mark.parametrize(("n", "k"), [(4096, 1024), (1024, 3072), (40, 36)])
def test_rows_of_a_batch_get_the_bits_each_gets_alone(n: int, k: int, rows: int) -> None:
    _, w, b = _data(n, k, offset=1)
    x = torch.randn(rows, 1, k, generator=torch.Generator().manual_seed(rows))
    packed = f32_rows.pack(w)
    alone = torch.cat([f32_rows.linear(x[i : i + 1], w, b) for i in range(rows)])
    assert torch.equal(f32_rows.linear(x, w, b), alone)
    assert torch.equal(f32_rows.packed_linear(x, packed, b), alone)
    assert torch.equal(
        torch.cat([f32_rows.packed_linear(x[i : i + 1], packed, b) for i in range(rows)]), alone
    )
    if _blas_order():
        assert torch.equal(alone, torch.cat([F.linear(x[i : i + 1], w, b) for i in range(rows)]))


def test_rows_linear_sends_one_position_rows_and_pairs_to_the_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from voxcast.kernels import rows_linear as rl

    calls: list[tuple[tuple[int, ...], int]] = []
    real = torch.ops.voxcast.f32_rows_linear

    class Spy:
        def __getattr__(self, name: str) -> Any:
            if name == "f32_rows_linear":
                return lambda x, w, b, c: (calls.append((tuple(x.shape), c)), real(x, w, b, c))[1]
            return getattr(torch.ops.voxcast, name)

    monkeypatch.setattr(rl.torch.ops, "voxcast", Spy(), raising=False)
    w = torch.randn(128, 64)
    shifted = torch.randn(128 * 64 + 2)[2:].view(128, 64)  # rows start 8 bytes past alignment
    for x in (torch.randn(64), torch.randn(1, 64), torch.randn(1, 1, 64), torch.randn(4, 1, 64)):
        rl.rows_linear(x, w, None, True, 2, f32_rows=True)
    for x in (torch.randn(1, 2, 64), torch.randn(4, 2, 64)):
        rl.rows_linear(x, w, None, True, 2, f32_rows=True)
    for x in (torch.randn(1, 3, 64), torch.randn(3, 64), torch.randn(5, 1, 64), torch.randn(5, 2, 64)):
        # more positions, rows that are not streams' positions, more than F32_ROWS_MAX streams
        assert torch.equal(
            rl.rows_linear(x, w, None, False, 2, f32_rows=True), rl.rows_linear(x, w, None, False, 2)
        )
    rl.rows_linear(torch.randn(1, 2, 64), shifted, None, False, 2, f32_rows=True)  # pairs: aligned rows only
    assert calls == [
        ((64,), 1),
        ((1, 64), 1),
        ((1, 1, 64), 1),
        ((4, 1, 64), 1),
        ((1, 2, 64), 2),
        ((4, 2, 64), 2),
    ]


def test_output_shape_follows_x_and_threads_do_not_change_values() -> None:
    x, w, _ = _data(256, 128)
    for shape in ((128,), (1, 128), (1, 1, 128)):
        assert f32_rows.linear(x.reshape(shape), w).shape == (*shape[:-1], 256)
    threads = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append((f32_rows.linear(x, w), f32_rows.packed_linear(x, f32_rows.pack(w))))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(o[0], outs[0][0]) and torch.equal(o[1], outs[0][0]) for o in outs)


def test_other_shapes_and_strides_go_to_pytorch() -> None:
    odd = torch.randn(64, 66)  # K not a multiple of 4: the BLAS sums rows of every alignment
    x66 = torch.randn(1, 66)
    assert torch.equal(f32_rows.linear(x66, odd), F.linear(x66, odd))
    x, w, _ = _data(64, 64)
    strided = w.t().contiguous().t()  # not contiguous
    assert torch.equal(f32_rows.linear(x, strided), F.linear(x, strided))


def test_bad_arguments_are_refused_by_name() -> None:
    x, w, _ = _data(64, 64)
    packed = torch.ops.voxcast.f32_rows_packed_linear
    with pytest.raises(RuntimeError, match="1 to 8 rows of 64"):
        f32_rows.linear(torch.randn(9, 1, 64), w)
    with pytest.raises(RuntimeError, match="bias"):
        f32_rows.linear(x, w, torch.randn(3))
    with pytest.raises(RuntimeError, match="multiple of 8"):
        f32_rows.pack(torch.randn(60, 64))
    with pytest.raises(RuntimeError, match="rows of 64"):
        f32_rows.packed_linear(torch.randn(1, 32), f32_rows.pack(w))
    with pytest.raises(RuntimeError, match="f32_rows_pack"):
        packed(x, w, None, 4)
    with pytest.raises(RuntimeError, match="peel"):
        packed(x, f32_rows.pack(w).weight, None, 5)
    with pytest.raises(RuntimeError, match="order"):
        f32_rows.linear(x, w, None, 3)
    shifted = f32_rows.pack(_data(64, 64, offset=1)[1])
    with pytest.raises(RuntimeError, match="order"):
        packed(torch.randn(1, 2, 64), shifted.weight, None, shifted.peel, 2)
    with pytest.raises(RuntimeError, match="float32"):
        f32_rows.linear(x.double(), w)


def test_row_weights_names_each_matmul_once(tiny_model_dir: Any) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), f32_rows=False)
    entries = f32_rows.row_weights(model.talker)
    talker_layers = len(model.talker.model.layers)
    cp = model.talker.code_predictor
    # per layer: fused q/k/v, o, fused gate/up, down; then the codec head and the 15 code heads
    assert len(entries) == 4 * (talker_layers + len(cp.model.layers)) + 1 + cp.num_codes
    assert len({id(w) for _, w, _ in entries}) == len(entries)
    owners = {id(m) for m, _, _ in entries}
    layers = [*model.talker.model.layers, *cp.model.layers]
    assert all(isinstance(layer.self_attn.qkv, FusedLinear) for layer in layers)
    assert all(id(layer.self_attn.qkv) in owners and id(layer.mlp.gate_up) in owners for layer in layers)
    assert not any(isinstance(m, (Attention, MLP)) for m, _, _ in entries)


@pytest.mark.parametrize("trace_steps", [False, True])
def test_codes_identical_on_the_kernels(tiny_model_dir: Any, trace_steps: bool) -> None:
    path = str(tiny_model_dir("custom_voice"))
    fast = Qwen3TTS.from_pretrained(path, f32_rows=True, trace_steps=trace_steps, row_parts=2)
    plain = Qwen3TTS.from_pretrained(path, f32_rows=False, trace_steps=trace_steps, row_parts=2)
    assert fast.f32_rows is not None and plain.f32_rows == {"rows": False, "packed": False, "packed_mb": 0.0}
    if not fast.f32_rows["bitwise"]:
        assert not fast.f32_rows["rows"] and not fast.f32_rows["packed"]
        pytest.skip("this CPU's BLAS sums one row in another order: the model kept PyTorch's kernel")
    assert fast.f32_rows["rows"] and fast.f32_rows["packed"] and fast.f32_rows["packed_mb"] > 0  # type: ignore[operator]
    cp_layers = fast.talker.code_predictor.model.layers
    assert all(m.row_packed is not None for m, _, _ in f32_rows.row_weights(cp_layers))
    assert all(m.row_packed is None for m, _, _ in f32_rows.row_weights(fast.talker.model.layers))
    limits = [9, 5, 7]
    with torch.inference_mode():
        for greedy in (True, False):
            params = SamplingParams(greedy=greedy)
            assert _sequential(_gens(fast, limits, params)) == _sequential(_gens(plain, limits, params))
            # three streams in one batch: 3 rows, 2 once one has finished, then 1, on the kernels
            assert batched_codes(_gens(fast, limits, params)) == _sequential(_gens(plain, limits, params))


def test_choice_is_measured_only_for_float32_cpu_models(tiny_model_dir: Any) -> None:
    path = str(tiny_model_dir("custom_voice"))
    auto = Qwen3TTS.from_pretrained(path)
    assert auto.f32_rows is not None
    if auto.f32_rows.get("bitwise"):
        assert "rows_ms" in auto.f32_rows and "packed_ms" in auto.f32_rows
    int8 = Qwen3TTS.from_pretrained(path, quant="int8")
    assert int8.f32_rows is None
    assert all(not getattr(m, "f32_rows", False) for m in int8.talker.modules())


def test_setting_from_the_environment() -> None:
    from voxcast.config import EngineConfig

    assert "f32_rows" not in EngineConfig.from_env({}).settings  # auto: the family's default
    assert EngineConfig.from_env({"VOXCAST_F32_ROWS": "0"}).settings["f32_rows"] is False
    assert EngineConfig.from_env({"VOXCAST_F32_ROWS": "ON"}).settings["f32_rows"] is True
    with pytest.raises(ValueError, match="VOXCAST_F32_ROWS"):
        EngineConfig.from_env({"VOXCAST_F32_ROWS": "maybe"})


def test_compiled_steps_go_back_to_pytorch_kernels(tiny_model_dir: Any) -> None:
    model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), f32_rows=True)
    use_static_decode(model.talker, backend="eager")  # the custom operations have no compiled form
    assert not any(getattr(m, "f32_rows", False) for m in model.talker.modules())
    assert all(getattr(m, "row_packed", None) is None for m in model.talker.modules())
