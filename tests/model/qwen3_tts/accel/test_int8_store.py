"""The int8 store (``VOXCAST_INT8_CACHE_DIR``): a first int8 load writes the quantized weights, a later
one reads them and is bitwise the same model, never touching the float weights they replace; a bad or
foreign file is quantized again; ``off`` stores nothing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from voxcast.engine.request import SamplingParams
from voxcast.kernels import int8_store
from voxcast.kernels.int8_linear import Int8Linear
from voxcast.models.qwen3_tts.checkpoint import _read_tensors, locate_checkpoint
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(int8_store.INT8_CACHE_ENV, str(tmp_path / "int8"))
    return tmp_path / "int8"


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir: Any) -> str:
    return str(tiny_model_dir("custom_voice"))


def _codes(model: Qwen3TTS, greedy: bool) -> torch.Tensor:
    gen = model.new_generator(
        model.build_prompt(TEXT, speaker="ryan"), SamplingParams(seed=4, greedy=greedy), 8
    )
    frames = []
    while (f := gen.step()) is not None:
        frames.append(f)
    return torch.stack(frames)


def _int8_linears(model: Qwen3TTS) -> dict[str, Int8Linear]:
    return {n: m for n, m in model.talker.named_modules() if isinstance(m, Int8Linear)}


def test_a_second_load_reads_the_same_int8_model(store: Path, checkpoint: str) -> None:
    first = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    assert first.accel.int8_store == "written" and len(list(store.glob("int8-*.safetensors"))) == 1
    second = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    assert second.accel.int8_store == "read"
    a, b = _int8_linears(first), _int8_linears(second)
    assert a.keys() == b.keys() and len(a) > 0
    for name, m in a.items():
        wa, wb = m.q._weight_bias()[0], b[name].q._weight_bias()[0]
        assert torch.equal(wa.int_repr(), wb.int_repr()), name
        assert torch.equal(wa.q_per_channel_scales(), wb.q_per_channel_scales()), name
        assert m.variant == b[name].variant
        if m.packed is not None:
            assert b[name].packed is not None and torch.equal(m.packed, b[name].packed), name
    for greedy in (True, False):
        assert torch.equal(_codes(first, greedy), _codes(second, greedy))


def test_a_kernel_layout_missing_from_the_store_is_added(store: Path, checkpoint: str) -> None:
    """A store written while fbgemm ran the decode rows holds no kernel layout; a load that picks the
    kernel packs it and stores it too, and the next load reads it."""
    fbgemm = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=False)
    assert fbgemm.accel.int8_store == "written"
    kernel = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    assert kernel.accel.int8_store == "written" and kernel.accel.int8_kernel
    again = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    assert again.accel.int8_store == "read"
    packed = {n: m.packed for n, m in _int8_linears(kernel).items() if m.packed is not None}
    assert packed and all(torch.equal(t, _int8_linears(again)[n].packed) for n, t in packed.items())
    assert torch.equal(_codes(kernel, True), _codes(again, True))


def test_the_replaced_float_weights_are_left_as_stored(checkpoint: str) -> None:
    files = locate_checkpoint(Path(checkpoint))
    key = "talker.model.layers.0.mlp.gate_proj.weight"
    read = _read_tensors(files.weights, torch.device("cpu"), torch.float64, unused=frozenset({key}))
    assert read[key].dtype != torch.float64  # not converted (so never read from the mapped file)
    other = "talker.model.layers.0.mlp.up_proj.weight"
    assert read[other].dtype == torch.float64


def test_an_unreadable_store_is_quantized_again_and_rewritten(
    store: Path, checkpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    (path,) = store.glob("int8-*.safetensors")
    path.write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING, logger="voxcast.kernels.int8_store"):
        again = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    assert again.accel.int8_store == "written" and "unreadable" in caplog.text
    assert torch.equal(_codes(first, True), _codes(again, True))
    assert Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True).accel.int8_store == "read"


def test_a_store_of_another_checkpoint_is_not_used(store: Path, checkpoint: str) -> None:
    Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    (path,) = store.glob("int8-*.safetensors")
    assert int8_store.load("another-checkpoint") is None
    # the same file under another identity's name: its recorded identity does not match
    other = int8_store.store_path("another-checkpoint")
    assert other is not None
    other.write_bytes(path.read_bytes())
    assert int8_store.load("another-checkpoint") is None


def test_off_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint: str) -> None:
    monkeypatch.setenv(int8_store.INT8_CACHE_ENV, "off")
    monkeypatch.setenv("HOME", str(tmp_path))
    model = Qwen3TTS.from_pretrained(checkpoint, quant="int8", int8_kernel=True)
    assert model.accel.int8_store is None and int8_store.store_path(model.identity) is None
    assert not any(tmp_path.rglob("int8-*"))


def test_float_models_neither_read_nor_write_the_store(store: Path, checkpoint: str) -> None:
    model = Qwen3TTS.from_pretrained(checkpoint)
    assert model.accel.int8_store is None and not store.exists()
