"""int8 weights (``quant="int8"``, ``VOXCAST_QUANT=int8``) on a tiny checkpoint: runs, valid, deterministic.

int8 is not bit-exact, so codes are not compared with float32 here; scripts/bench_decode.py
``--quant int8`` measures the agreement rate.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from voxcast.config import EngineConfig
from voxcast.engine.request import SamplingParams
from voxcast.kernels.int8_linear import Int8Linear
from voxcast.models.base import capabilities
from voxcast.models.qwen3_tts.generator import step_many
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def int8_model(tiny_model_dir: Any) -> Qwen3TTS:
    return Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant="int8")


def _codes(model: Qwen3TTS, greedy: bool, seed: int = 3) -> torch.Tensor:
    gen = model.new_generator(
        model.build_prompt(TEXT, speaker="ryan"), SamplingParams(seed=seed, greedy=greedy), 10
    )
    frames = []
    while (f := gen.step()) is not None:
        frames.append(f)
    return torch.stack(frames)


def test_int8_codes_are_valid_and_deterministic(int8_model: Qwen3TTS) -> None:
    a = _codes(int8_model, greedy=True)
    assert a.shape == (10, 16)
    assert torch.equal(a, _codes(int8_model, greedy=True))
    assert (
        int(a[:, 1:].min()) >= 0 and int(a[:, 1:].max()) < int8_model.config.talker.code_predictor.vocab_size
    )
    assert torch.equal(_codes(int8_model, False, 5), _codes(int8_model, False, 5))


def test_int8_weights_are_the_ones_that_run(int8_model: Qwen3TTS, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decoder layer of the talker and the code predictor has int8 projections, and a frame
    runs through them (not through float32 weights left beside them)."""
    layers = list(int8_model.talker.model.layers) + list(int8_model.talker.code_predictor.model.layers)
    assert all(any(isinstance(m, Int8Linear) for m in layer.modules()) for layer in layers)
    calls: list[int] = []
    forward = Int8Linear.forward

    def counted(self: Int8Linear, x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return forward(self, x)

    monkeypatch.setattr(Int8Linear, "forward", counted)
    _codes(int8_model, greedy=True)
    assert len(calls) >= 10 * len(layers)  # 10 frames, at least one int8 product per layer and frame


def test_int8_batches(int8_model: Qwen3TTS) -> None:
    prompt = int8_model.build_prompt(TEXT, speaker="ryan")
    gens = [int8_model.new_generator(prompt, SamplingParams(seed=i, greedy=True), 4) for i in range(2)]
    for _ in range(4):
        frames = step_many(gens)
        assert all(f is not None and f.shape == (16,) for f in frames)


def test_unknown_quant_is_refused(tiny_model_dir: Any) -> None:
    with pytest.raises(ValueError, match="quant"):
        Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), quant="int4")


def test_config_field() -> None:
    assert EngineConfig.from_env({}).quant == "none"
    assert EngineConfig.from_env({"VOXCAST_QUANT": "INT8"}).quant == "int8"
    with pytest.raises(ValueError, match="VOXCAST_QUANT"):
        EngineConfig.from_env({"VOXCAST_QUANT": "fp8"})
    assert "int8_kernel" not in EngineConfig.from_env({}).settings  # auto: the family's default
    assert EngineConfig.from_env({"VOXCAST_INT8_KERNEL": "0"}).settings["int8_kernel"] is False
    assert EngineConfig.from_env({"VOXCAST_INT8_KERNEL": "On"}).settings["int8_kernel"] is True
    with pytest.raises(ValueError, match="VOXCAST_INT8_KERNEL"):
        EngineConfig.from_env({"VOXCAST_INT8_KERNEL": "fbgemm"})


@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_equals_quantize_dynamic(bias: bool) -> None:
    """quant._int8 builds (in its fbgemm Linear) what torch's quantize_dynamic builds (same int8 weights, scales, outputs)."""
    import warnings

    from torch import nn

    from voxcast.models.qwen3_tts.accel.quant import _int8

    torch.manual_seed(0)
    parts = [nn.Linear(64, n, bias=bias) for n in (48, 16, 16)]
    fused = nn.Linear(64, 80, bias=bias)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if bias:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        ref = torch.ao.quantization.quantize_dynamic(nn.Sequential(fused), spec, dtype=torch.qint8)[0]
    ours = _int8(*parts).q
    (w_ref, b_ref), (w_ours, b_ours) = ref._weight_bias(), ours._weight_bias()
    assert torch.equal(w_ref.int_repr(), w_ours.int_repr())
    assert torch.equal(w_ref.q_per_channel_scales(), w_ours.q_per_channel_scales())
    assert torch.equal(w_ref.q_per_channel_zero_points(), w_ours.q_per_channel_zero_points())
    assert (b_ref is None) == (b_ours is None) and (b_ref is None or torch.equal(b_ref, b_ours))
    assert (ours.in_features, ours.out_features) == (64, 80)
    x = torch.randn(3, 5, 64)
    assert torch.equal(ref(x), ours(x))


def test_int8_renders_are_keyed_apart(int8_model: Qwen3TTS, tiny_model_dir: Any) -> None:
    """int8 draws other codes than float32: its renders get their own audio-cache key (the render
    settings the engine adds to it); float renders keep theirs (no settings, the key as before)."""
    assert capabilities(int8_model).render_settings == {"quant": "int8"}
    float_model = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))
    assert capabilities(float_model).render_settings == {}
