"""T3 with int8 weights (``VOXCAST_QUANT=int8``, :mod:`voxcast.models.chatterbox_turbo.t3_quant`) on the
tiny random checkpoint: every block projection is replaced, the logits stay near float32's, one-
and two-row decode steps on voxcast's kernel give a stream the same tokens alone or batched, the
model refuses int8 off the CPU, and int8 renders are keyed apart from float ones."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from voxcast.errors import CheckpointError
from voxcast.kernels import native
from voxcast.kernels.int8_linear import KERNEL_ROWS, Int8Linear
from voxcast.models.base import LoadOptions
from voxcast.models.chatterbox_turbo.gpt2 import Conv1D
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo
from voxcast.models.chatterbox_turbo.sampling import TurboSampling
from voxcast.models.chatterbox_turbo.t3 import T3, next_many
from voxcast.models.chatterbox_turbo.t3_quant import quantize_t3

TEXTS = ("Hello there, this is a test.", "A second, longer sentence with more words.")


@pytest.fixture(scope="module")
def model(turbo_nostop_dir: Path) -> ChatterboxTurbo:
    return ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions())


@pytest.fixture(scope="module")
def int8_model(turbo_nostop_dir: Path) -> ChatterboxTurbo:
    return ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions(quant="int8"))


def test_every_block_projection_becomes_int8(model: ChatterboxTurbo) -> None:
    t3 = copy.deepcopy(model.t3)
    x = torch.randn(3, 5, t3.cfg.width)
    float_out = [(b.mlp.c_fc(x), b.attn.c_attn(x)) for b in t3.tfmr.h]
    report = quantize_t3(t3, kernel=False)
    assert report["linears"] == 4 * t3.cfg.layers and report["kernel"] is False
    assert not any(isinstance(m, Conv1D) for m in t3.tfmr.h.modules())
    assert sum(isinstance(m, Int8Linear) for m in t3.modules()) == 4 * t3.cfg.layers
    assert isinstance(t3.speech_head, torch.nn.Linear)  # the head keeps its float weights
    for b, (fc, attn) in zip(t3.tfmr.h, float_out, strict=True):
        for got, want in ((b.mlp.c_fc(x), fc), (b.attn.c_attn(x), attn)):
            assert got.shape == want.shape
            assert (got - want).abs().max() <= 0.05 * want.abs().max()  # int8 rounding, not another map


def _first_logits(t3: T3, model: ChatterboxTurbo, text: str) -> torch.Tensor:
    p = model.build_prompt(text)
    stream = t3.stream(p.text_ids, prefix=p.prefix)
    with torch.inference_mode():
        assert stream._embeds is not None
        hidden = t3.tfmr(stream._embeds, stream.cache)
        return t3.logits(hidden[:, -1])[0]


def test_int8_logits_stay_near_float(model: ChatterboxTurbo, int8_model: ChatterboxTurbo) -> None:
    assert int8_model.quant is not None and model.quant is None
    for text in TEXTS:
        ref = _first_logits(model.t3, model, text)
        got = _first_logits(int8_model.t3, int8_model, text)
        assert not torch.equal(ref, got)  # it is the int8 model
        # the weights' rounding moves the logits by a small part of their spread
        assert (got - ref).abs().max() <= 0.1 * ref.std()
        top_ref, top_got = set(ref.topk(10).indices.tolist()), set(got.topk(10).indices.tolist())
        assert len(top_ref & top_got) >= 7


def _tokens(
    model: ChatterboxTurbo, t3: T3, sampling: TurboSampling, n: int, batched: bool
) -> list[list[int]]:
    streams = []
    for seed, text in enumerate(TEXTS):
        p = model.build_prompt(text)
        streams.append(t3.stream(p.text_ids, prefix=p.prefix, sampling=sampling, seed=seed, max_tokens=n))
    out: list[list[int]] = [[s.next() or 0] for s in streams]  # each prefill alone
    for _ in range(n - 1):
        live = [i for i, s in enumerate(streams) if not s.done]
        if not live:
            break
        got = next_many(t3, [streams[i] for i in live]) if batched else [streams[i].next() for i in live]
        for i, t in zip(live, got, strict=True):
            if t is not None:
                out[i].append(t)
    return out


@pytest.mark.skipif(not native.load(), reason="voxcast's int8 kernel does not build here")
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_kernel_rows_give_the_same_tokens_alone_or_batched(
    model: ChatterboxTurbo, greedy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode rows (one stream, or two batched) run on voxcast's kernel, whose rows do not depend on
    the call's other rows: two streams batched draw what each draws alone."""
    assert len(TEXTS) <= KERNEL_ROWS
    t3 = copy.deepcopy(model.t3)
    report = quantize_t3(t3, kernel=True)
    assert report["kernel"] is True
    rows: list[int] = []
    linear = native.linear

    def counted(x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        rows.append(x.numel() // x.shape[-1])
        return linear(x, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "linear", counted)
    sampling = TurboSampling(greedy=greedy)
    alone = _tokens(model, t3, sampling, 24, batched=False)
    assert (
        set(rows) == {1} and len(rows) == 4 * t3.cfg.layers * 2 * 23
    )  # every decode step, all 4 projections
    rows.clear()
    assert alone == _tokens(model, t3, sampling, 24, batched=True)
    assert set(rows) == {2}
    assert all(len(t) == 24 for t in alone)


def test_int8_is_refused_off_the_cpu(turbo_nostop_dir: Path) -> None:
    with pytest.raises(CheckpointError, match="VOXCAST_QUANT=int8"):
        ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions(device="cuda", quant="int8"))
    with pytest.raises(CheckpointError, match="VOXCAST_QUANT"):
        ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions(quant="int4"))


def test_int8_renders_are_keyed_apart(model: ChatterboxTurbo, int8_model: ChatterboxTurbo) -> None:
    assert "t3_quant" not in model.render_settings()  # float renders keep their cache keys
    assert int8_model.render_settings()["t3_quant"] == "int8"
    report = int8_model.runtime_report()["t3_quant"]
    assert isinstance(report, dict) and report["linears"] == 4 * int8_model.t3.cfg.layers


def test_int8_store_is_written_then_read_bitwise(
    turbo_nostop_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first int8 load quantizes and stores; the next reads the same int8 weights and scales."""
    from voxcast.kernels import int8_store

    monkeypatch.setenv(int8_store.INT8_CACHE_ENV, str(tmp_path / "int8"))
    first = ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions(quant="int8"))
    assert first.quant is not None and first.quant["store"] == "written"
    assert len(list((tmp_path / "int8").glob("int8-*.safetensors"))) == 1
    second = ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions(quant="int8"))
    assert second.quant is not None and second.quant["store"] in (
        "read",
        "written",
    )  # written: a new kernel layout
    pairs = [
        (a, b)
        for a, b in zip(first.t3.modules(), second.t3.modules(), strict=True)
        if isinstance(a, Int8Linear) and isinstance(b, Int8Linear)
    ]
    assert len(pairs) == 4 * first.t3.cfg.layers
    for a, b in pairs:
        (wa, ba), (wb, bb) = a.q._weight_bias(), b.q._weight_bias()
        assert torch.equal(wa.int_repr(), wb.int_repr())
        assert torch.equal(wa.q_per_channel_scales(), wb.q_per_channel_scales())
        assert ba is not None and bb is not None and torch.equal(ba, bb)


def test_int8_store_of_one_checkpoint_is_not_read_for_another(
    turbo_nostop_dir: Path, turbo_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop-bias-free copy differs from the tiny checkpoint in one bias only: its own identity,
    its own store file."""
    from voxcast.kernels import int8_store

    monkeypatch.setenv(int8_store.INT8_CACHE_ENV, str(tmp_path / "int8"))
    a = ChatterboxTurbo.from_pretrained(turbo_nostop_dir, LoadOptions(quant="int8"))
    b = ChatterboxTurbo.from_pretrained(turbo_model_dir, LoadOptions(quant="int8"))
    assert a.identity != b.identity
    assert a.quant is not None and b.quant is not None and b.quant["store"] == "written"
    assert len(list((tmp_path / "int8").glob("int8-*.safetensors"))) == 2
