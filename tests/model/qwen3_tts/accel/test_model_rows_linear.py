"""Batched decode rows on oneDNN (:mod:`voxcast.kernels.rows_linear`).

One row and every prefill keep PyTorch's kernel (bitwise the official model); rows of a batch run on
oneDNN wherever this PyTorch has it (a fixed rule, never a timing), equal to the single-row values up
to float rounding. On the tiny checkpoint greedy
codes stay identical to sequential decoding, with the recorded code-predictor steps too.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.model.qwen3_tts.test_model_batching import SPEAKERS, TEXTS, _sequential, batched_codes
from voxcast.engine.request import SamplingParams
from voxcast.kernels.rows_linear import (
    Linear,
    onednn_available,
    rows_linear,
    use_onednn_rows,
)
from voxcast.models.qwen3_tts.model import Qwen3TTS

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")


def test_one_row_is_bitwise_pytorch_many_rows_close() -> None:
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g), torch.randn(96, generator=g)
    one, rows = torch.randn(1, 2, 64, generator=g), torch.randn(4, 1, 64, generator=g)
    assert torch.equal(rows_linear(one, w, b, onednn=True), F.linear(one, w, b))
    torch.testing.assert_close(rows_linear(rows, w, b, onednn=True), F.linear(rows, w, b))
    assert torch.equal(rows_linear(rows, w, None, onednn=False), F.linear(rows, w))


def test_linear_is_an_nn_linear_with_the_same_state() -> None:
    lin = Linear(8, 4)
    assert isinstance(lin, nn.Linear) and set(lin.state_dict()) == {"weight", "bias"}
    holder = nn.Sequential(lin, nn.ReLU(), Linear(4, 2))
    assert use_onednn_rows(holder, True) == 2 and lin.onednn_rows
    x = torch.randn(3, 1, 8)
    torch.testing.assert_close(
        holder(x), F.linear(F.linear(x, lin.weight, lin.bias).relu(), *holder[2].parameters())
    )


def _gens(model: Qwen3TTS, limits: list[int], params: SamplingParams | None = None) -> list[Any]:
    """Generators for the test texts and speakers: greedy, or ``params`` with seeds 30, 31, ..."""
    base = params or SamplingParams(greedy=True)
    return [
        model.new_generator(
            model.build_prompt(t, speaker=s), base.model_copy(update={"seed": 30 + i}), limits[i]
        )
        for i, (t, s) in enumerate(zip(TEXTS, SPEAKERS, strict=True))
    ]


@pytest.mark.parametrize("trace_steps", [False, True])
def test_batched_greedy_on_onednn_equals_sequential(tiny_model_dir: Any, trace_steps: bool) -> None:
    path = str(tiny_model_dir("custom_voice"))
    fast = Qwen3TTS.from_pretrained(path, onednn_rows=True, trace_steps=trace_steps)
    plain = Qwen3TTS.from_pretrained(path, onednn_rows=False)
    assert fast.onednn_rows and not plain.onednn_rows
    limits = [9, 5, 7]
    with torch.inference_mode():
        assert batched_codes(_gens(fast, limits)) == _sequential(_gens(plain, limits))


def test_on_by_default_where_it_applies_whatever_a_timing_finds(
    tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batched rows go to oneDNN by rule: a timing that finds it far slower changes nothing."""
    from voxcast.kernels import rows_linear as module

    path = str(tiny_model_dir("custom_voice"))
    monkeypatch.setattr(module, "time_both", lambda *a, **k: (1.0, 10.0))  # oneDNN "10x slower"
    auto = Qwen3TTS.from_pretrained(path)
    assert auto.onednn_rows
    int8 = Qwen3TTS.from_pretrained(path, quant="int8")
    assert not int8.onednn_rows
