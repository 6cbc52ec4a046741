"""Decode rows' Linears as blocks of outputs in one bmm (:func:`.rows_linear.split_linear`).

The split is a speed change only: every output is the same dot product through the same BLAS
kernel, so values, generated codes and recordings stay bitwise those of ``F.linear``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.model.qwen3_tts.accel.test_model_rows_linear import _gens
from tests.model.qwen3_tts.test_model_batching import _sequential, batched_codes
from voxcast.engine.request import SamplingParams
from voxcast.kernels.rows_linear import Linear, rows_linear, split_linear, split_rows_faster
from voxcast.models.qwen3_tts.model import Qwen3TTS

# The 0.6B model's one-row shapes (fused q/k/v, o, fused gate/up, down, heads) and the tiny test
# model's.
SHAPES = [
    (4096, 1024),
    (1024, 2048),
    (6144, 1024),
    (1024, 3072),
    (3072, 1024),
    (2048, 1024),
    (128, 64),
    (32, 64),
]


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_blocks_are_bitwise_f_linear(n: int, k: int, parts: int) -> None:
    g = torch.Generator().manual_seed(n + k)
    w, b = torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g)
    rows = [
        torch.randn(1, k, generator=g),
        torch.randn(1, 1, k, generator=g),
        torch.randn(1, 2, k, generator=g),
    ]
    for x in [*rows, torch.randn(3, 1, k, generator=g)]:
        assert torch.equal(split_linear(x, w, None, parts), F.linear(x, w))
        assert torch.equal(split_linear(x, w, b, parts), F.linear(x, w, b))
        assert torch.equal(rows_linear(x, w, b, False, parts), F.linear(x, w, b))


def test_only_few_float32_rows_of_large_enough_blocks_are_split(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    real = split_linear

    def spy(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, parts: int) -> torch.Tensor:
        calls.append(tuple(w.shape))
        return real(x, w, b, parts)

    monkeypatch.setattr("voxcast.kernels.rows_linear.split_linear", spy)
    w = torch.randn(128, 64)
    for x in (torch.randn(4, 1, 64), torch.randn(1, 5, 64)):  # 4 batched rows, a prefill
        assert torch.equal(rows_linear(x, w, None, False, 2), F.linear(x, w))
    rows_linear(torch.randn(1, 64), torch.randn(126, 64), None, False, 4)  # 126 outputs: not in 4 blocks
    rows_linear(torch.randn(1, 8), torch.randn(8, 8), None, False, 2)  # blocks below the minimum
    rows_linear(torch.randn(1, 64, dtype=torch.bfloat16), w.bfloat16(), None, False, 2)
    rows_linear(torch.randn(1, 64), w, None, False, 1)
    assert calls == []
    for x in (torch.randn(1, 1, 64), torch.randn(1, 2, 64), torch.randn(3, 1, 64)):
        assert torch.equal(rows_linear(x, w, None, False, 2), F.linear(x, w))
    assert calls == [(128, 64)] * 3


def test_linear_module_honours_row_parts() -> None:
    lin = Linear(64, 128)
    x = torch.randn(1, 1, 64)
    ref = lin(x)
    lin.row_parts = 2
    assert torch.equal(lin(x), ref)


def test_load_time_measurement() -> None:
    out = split_rows_faster(torch.randn(512, 256), 2, reps=2)
    assert out["linear_ms"] > 0 and out["split_ms"] > 0 and out["bitwise"] is True  # type: ignore[operator]
    assert out["parts"] in (1, 2)


@pytest.mark.parametrize("trace_steps", [False, True])
def test_codes_and_recordings_identical_with_blocks(tiny_model_dir: Any, trace_steps: bool) -> None:
    path = str(tiny_model_dir("custom_voice"))
    split = Qwen3TTS.from_pretrained(path, row_parts=2, trace_steps=trace_steps, onednn_rows=False)
    plain = Qwen3TTS.from_pretrained(path, row_parts=1, trace_steps=trace_steps, onednn_rows=False)
    assert split.row_parts == 2 and plain.row_parts == 1 and split.row_kernel is None
    assert all(m.row_parts == 2 for m in split.talker.modules() if hasattr(m, "row_parts"))
    limits = [9, 5, 7]
    with torch.inference_mode():
        for greedy in (True, False):
            params = SamplingParams(greedy=greedy)
            assert _sequential(_gens(split, limits, params)) == _sequential(_gens(plain, limits, params))
            # three streams in one batch: 3 rows, 2 once one has finished, then 1
            assert batched_codes(_gens(split, limits, params)) == batched_codes(_gens(plain, limits, params))


def test_measured_at_load_where_it_applies(tiny_model_dir: Any) -> None:
    path = str(tiny_model_dir("custom_voice"))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        auto = Qwen3TTS.from_pretrained(path)
        assert auto.row_kernel is not None and auto.row_parts == auto.row_kernel["parts"]
        int8 = Qwen3TTS.from_pretrained(path, quant="int8")
        assert int8.row_kernel is None and int8.row_parts == 1
        torch.set_num_threads(1)
        one = Qwen3TTS.from_pretrained(path)
        assert one.row_kernel is None and one.row_parts == 1
    finally:
        torch.set_num_threads(threads)
