"""bfloat16 only where the device computes it natively; elsewhere float32, with a warning."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from voxcast.config import EngineConfig
from voxcast.engine import engine as engine_module
from voxcast.engine.engine import Engine
from voxcast.engine.precision import Precision, native_bfloat16, resolve_precision
from voxcast.engine.runtime_info import runtime_choices

Factory = Callable[[str], Path]


@pytest.mark.parametrize(
    ("model", "codec", "native", "expected"),
    [
        ("float32", "auto", False, Precision("float32", "float32")),
        ("float32", "bfloat16", True, Precision("float32", "bfloat16")),
        ("float32", "bfloat16", False, Precision("float32", "float32", ("VOXCAST_CODEC_DTYPE",))),
        ("bfloat16", "auto", True, Precision("bfloat16", "bfloat16")),
        ("bfloat16", "auto", False, Precision("float32", "float32", ("VOXCAST_DTYPE",))),
        ("bfloat16", "float32", False, Precision("float32", "float32", ("VOXCAST_DTYPE",))),
        (
            "bfloat16",
            "bfloat16",
            False,
            Precision("float32", "float32", ("VOXCAST_DTYPE", "VOXCAST_CODEC_DTYPE")),
        ),
    ],
)
def test_resolve_precision(model: str, codec: str, native: bool, expected: Precision) -> None:
    assert resolve_precision(model, codec, native) == expected


@pytest.mark.parametrize(
    ("codec", "native", "expected"),
    [
        ("auto", True, Precision("float32", "bfloat16")),  # int8 gave up bit-exactness already
        ("auto", False, Precision("float32", "float32")),
        ("float32", True, Precision("float32", "float32")),  # an explicit setting wins
    ],
)
def test_auto_codec_dtype_with_int8_weights(codec: str, native: bool, expected: Precision) -> None:
    assert resolve_precision("float32", codec, native, quant="int8") == expected
    assert resolve_precision("float32", codec, native, quant="none").codec == (
        "float32" if codec == "auto" else codec
    )


def test_native_bfloat16_follows_the_cpu_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Native bfloat16 on a CPU means AVX-512 BF16 or AMX, never oneDNN's emulation on plain AVX-512."""
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    for bf16, amx, want in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=bf16: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
        assert native_bfloat16("cpu") is want
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert native_bfloat16("cpu") is False
    if not torch.cuda.is_available():
        assert native_bfloat16("cuda") is False


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "expected"),
    [(False, False, False), (True, False, True), (False, True, True), (True, True, True)],
)
def test_native_bfloat16_needs_the_bf16_instructions_not_just_avx512(
    monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool, expected: bool
) -> None:
    # Not oneDNN's check: it says yes on any AVX-512 CPU (emulated bf16, measured 3.3x slower).
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert native_bfloat16("cpu") is expected


def test_native_bfloat16_is_false_where_torch_lacks_the_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert native_bfloat16("cpu") is False


def test_engine_falls_back_to_float32_codec_without_native_bfloat16(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(engine_module, "native_bfloat16", lambda device: False)
    config = EngineConfig(
        model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, codec_dtype="bfloat16"
    )
    with caplog.at_level(logging.WARNING, logger="voxcast.engine.precision"):
        engine = Engine.load(config)
    try:
        assert engine.precision == Precision("float32", "float32", ("VOXCAST_CODEC_DTYPE",))
        assert next(engine.model.codec_decoder.parameters()).dtype == torch.float32
        assert any("VOXCAST_CODEC_DTYPE" in r.getMessage() for r in caplog.records)
        choices = json.loads(json.dumps(runtime_choices(engine)))
        assert choices["precision"] == {
            "model": "float32",
            "codec": "float32",
            "fallbacks": ["VOXCAST_CODEC_DTYPE"],
        }
        assert choices["device"] == "cpu" and choices["decode_thread"] is False
        assert choices["onednn_rows"] == engine.model.onednn_rows
        assert choices["codec_small_gemm"] == engine.model.codec_decoder.small_gemm
        chunks = list(engine.synthesize({"text": "Still speaks.", "voice": "ryan", "max_frames": 4}))
        assert sum(len(c.pcm) for c in chunks) > 0
    finally:
        engine.close()
