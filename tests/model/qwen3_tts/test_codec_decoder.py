"""The stateful streaming codec decoder equals the one-pass decode for every chunk schedule."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from voxcast.kernels.rows_linear import onednn_available
from voxcast.models.qwen3_tts.codec_decoder import SAMPLES_PER_FRAME, CodecDecoder, load_codec_decoder
from voxcast.models.qwen3_tts.codec_layers import CausalConv
from voxcast.testing.qwen3_tts_parts import write_random_speech_tokenizer

TOL = 1e-5


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_speech_tokenizer(tmp_path_factory.mktemp("codec") / "speech_tokenizer", "tiny", 0)


@pytest.fixture(scope="module")
def decoder(tokenizer_dir: Path) -> CodecDecoder:
    """Tiny decoder with every part made to matter: LayerScale 1, random SnakeBeta, ConvNeXt gamma 0.5."""
    torch.manual_seed(1)
    dec = load_codec_decoder(tokenizer_dir)
    with torch.no_grad():
        for name, p in dec.named_parameters():
            if name.endswith(".scale"):
                p.fill_(1.0)
            elif name.endswith((".alpha", ".beta")):
                p.normal_(0.0, 0.3)
            elif name.endswith(".gamma"):
                p.fill_(0.5)
    return dec


@pytest.fixture(scope="module")
def long_case(decoder: CodecDecoder) -> tuple[torch.Tensor, np.ndarray]:
    """320 frames (beyond the 72-frame window and the official 300-frame chunk) and their decode."""
    codes = _codes(320, 2)
    return codes, decoder.decode_offline(codes)


def _codes(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (n, 16), generator=g)


def _stream(
    dec: CodecDecoder, codes: torch.Tensor, sizes: list[int], prime: torch.Tensor | None = None
) -> np.ndarray:
    s = dec.new_stream(prime)
    out, i, k = [], 0, 0
    while i < codes.shape[0]:
        n = sizes[k % len(sizes)]
        out.append(s.decode(codes[i : i + n]))
        i, k = i + n, k + 1
    return np.concatenate(out)


def test_offline_shape_and_range(decoder: CodecDecoder) -> None:
    wav = decoder.decode_offline(_codes(10, 0))
    assert wav.shape == (10 * SAMPLES_PER_FRAME,) and wav.dtype == np.float32
    assert np.abs(wav).max() <= 1.0 and wav.std() > 1e-3  # not a trivial (silent) decode
    assert decoder.decode_offline(_codes(0, 0)).shape == (0,)


def test_decoder_is_causal(decoder: CodecDecoder) -> None:
    codes = _codes(40, 1)
    full = decoder.decode_offline(codes)
    assert np.abs(decoder.decode_offline(codes[:17]) - full[: 17 * SAMPLES_PER_FRAME]).max() <= TOL


@pytest.mark.parametrize(
    "sizes",
    [[1], [2], [3], [7], [72], [73], [5, 1, 11, 2, 40], "random"],
    ids=lambda s: str(s),
)
def test_stream_equals_offline_beyond_window_and_300(
    decoder: CodecDecoder, long_case: tuple[torch.Tensor, np.ndarray], sizes: list[int] | str
) -> None:
    codes, ref = long_case
    if sizes == "random":
        rng = random.Random(3)
        sizes = [rng.randint(1, 25) for _ in range(200)]
    assert isinstance(sizes, list)
    got = _stream(decoder, codes, sizes)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= TOL


def test_state_is_needed(decoder: CodecDecoder) -> None:
    """Sanity: decoding the tail without state differs clearly, so the equality tests mean something."""
    codes = _codes(120, 4)
    ref = decoder.decode_offline(codes)[100 * SAMPLES_PER_FRAME :]
    assert np.abs(decoder.decode_offline(codes[100:]) - ref).max() > 1e-3
    # only the attention cache missing (convs given 25 frames of context): still wrong
    naive = decoder.decode_offline(codes[25:])[75 * SAMPLES_PER_FRAME :]
    assert np.abs(naive - ref).max() > 1e-4


@pytest.mark.parametrize("n_ref", [1, 5, 11, 12, 13, 90])
def test_primed_stream_equals_offline_minus_reference(decoder: CodecDecoder, n_ref: int) -> None:
    """Priming runs the conv stack over the last frames only; the state must still be exact."""
    ref_codes, gen = _codes(n_ref, 5), _codes(40, 6)
    full = decoder.decode_offline(torch.cat([ref_codes, gen]))
    got = _stream(decoder, gen, [4, 1, 9], prime=ref_codes)
    assert np.abs(got - full[n_ref * SAMPLES_PER_FRAME :]).max() <= TOL


def test_priming_window_is_needed(decoder: CodecDecoder) -> None:
    """Sanity: a conv stack primed over too few frames gives a wrong state (so the window matters)."""
    ref_codes, gen = _codes(40, 11), _codes(5, 12)
    full = decoder.decode_offline(torch.cat([ref_codes, gen]))[40 * SAMPLES_PER_FRAME :]
    n = decoder._back_context_frames()
    assert 8 <= n <= 16
    st = decoder._fresh_state()
    with torch.inference_mode():
        decoder._back(decoder._front(ref_codes[None], st)[:, :, -2:], st)
        wrong = decoder._run(gen[None], st)[0].numpy()
    assert np.abs(wrong - full).max() > 1e-4


def test_clones_are_independent(decoder: CodecDecoder) -> None:
    ref_codes, gen_a, gen_b = _codes(30, 7), _codes(20, 8), _codes(25, 9)
    base = decoder.new_stream(ref_codes)
    assert base.primed_frames == 30 and base.frames_decoded == 30
    a, b = base.clone(), base.clone()
    out_a = np.concatenate([a.decode(gen_a[:5]), a.decode(gen_a[5:])])
    out_b = b.decode(gen_b)
    out_base = base.decode(gen_a)  # the primed original still decodes from the primed state
    full_a = decoder.decode_offline(torch.cat([ref_codes, gen_a]))[30 * SAMPLES_PER_FRAME :]
    full_b = decoder.decode_offline(torch.cat([ref_codes, gen_b]))[30 * SAMPLES_PER_FRAME :]
    assert np.abs(out_a - full_a).max() <= TOL
    assert np.abs(out_b - full_b).max() <= TOL
    assert np.abs(out_base - full_a).max() <= TOL
    assert a.frames_decoded == 50 and b.frames_decoded == 55


def test_rejects_bad_codes(decoder: CodecDecoder) -> None:
    with pytest.raises(ValueError):
        decoder.new_stream().decode(torch.zeros(3, 15, dtype=torch.long))


def test_random_tokenizer_is_deterministic_and_loads_strictly(tmp_path: Path, tokenizer_dir: Path) -> None:
    again = write_random_speech_tokenizer(tmp_path / "a", "tiny", 0)
    other = write_random_speech_tokenizer(tmp_path / "b", "tiny", 1)
    w0, w1, w2 = (load_file(str(d / "model.safetensors")) for d in (tokenizer_dir, again, other))
    assert w0.keys() == w1.keys() == w2.keys()
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    assert not torch.equal(w0["decoder.pre_conv.conv.weight"], w2["decoder.pre_conv.conv.weight"])
    assert any(k.startswith("encoder.") for k in w0) and any(k.startswith("decoder.") for k in w0)
    for d in (tokenizer_dir, again):
        assert {p.name for p in d.iterdir()} == {
            "config.json",
            "model.safetensors",
            "preprocessor_config.json",
        }
    load_codec_decoder(again)  # strict load


@pytest.mark.parametrize(
    "param",
    [
        "quantizer.rvq_first.vq.layers.0._codebook.embedding_sum",
        "quantizer.rvq_rest.output_proj.weight",
        "pre_transformer.layers.0.self_attn.k_proj.weight",
        "pre_transformer.layers.1.mlp_layer_scale.scale",
        "upsample.0.1.gamma",
        "decoder.1.block.2.act1.alpha",
    ],
)
def test_folded_weights_follow_weight_changes(tokenizer_dir: Path, param: str) -> None:
    """Tables and fused weights computed once from the parameters are rebuilt when one changes."""
    dec = load_codec_decoder(tokenizer_dir)  # folds at load
    codes = _codes(6, 10)
    with torch.no_grad():  # make every part matter (a change of these is followed too)
        for name, p in dec.named_parameters():
            if name.endswith((".scale", ".gamma")):
                p.fill_(0.5)
    before = dec.decode_offline(codes)
    fresh = CodecDecoder(dec.config)
    with torch.no_grad():
        dec.get_parameter(param).add_(0.3)
        fresh.load_state_dict(dec.state_dict())
    fresh.prepare()  # the same kernel rule as ``dec``, so the same bits
    assert (fresh.small_gemm or {}).get("onednn") == (dec.small_gemm or {}).get("onednn")
    after = dec.decode_offline(codes)
    assert np.abs(after - before).max() > 1e-4
    assert np.array_equal(after, fresh.decode_offline(codes))


def _same_audio_both_ways(decoder: CodecDecoder, codes: torch.Tensor, switch: Callable[[bool], None]) -> None:
    """Offline and streamed decodes with ``switch(False)`` and ``switch(True)`` agree to TOL."""
    outs = []
    for on in (False, True):
        switch(on)
        outs.append((decoder.decode_offline(codes), _stream(decoder, codes, [1, 2, 1, 4])))
    assert np.abs(outs[0][0] - outs[1][0]).max() <= TOL
    assert np.abs(outs[0][1] - outs[1][1]).max() <= TOL
    assert np.abs(outs[1][1] - outs[1][0]).max() <= TOL


def test_gemm_and_direct_conv_paths_agree(
    decoder: CodecDecoder, long_case: tuple[torch.Tensor, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Convolutions run as im2col GEMMs or as ``F.conv1d`` depending on shape: both give the same audio."""

    def every_conv_a_gemm(on: bool) -> None:  # off: every conv direct
        monkeypatch.setattr(CausalConv, "gemm_max_ratio", 1e9 if on else 0.0)

    _same_audio_both_ways(decoder, long_case[0][:30], every_conv_a_gemm)


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")
def test_the_kernel_is_a_rule_not_a_timing(tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two kernels round differently, so no load-time timing picks one (a loaded host would time
    them otherwise): every float32 CPU decoder runs its short GEMMs on oneDNN and computes the same
    bits, however the kernels would have timed."""
    from voxcast.kernels import rows_linear

    def no_timing(*a: object, **k: object) -> tuple[float, float]:
        raise AssertionError("a kernel that changes bits was timed")

    monkeypatch.setattr(rows_linear, "time_both", no_timing)
    first, second = load_codec_decoder(tokenizer_dir), load_codec_decoder(tokenizer_dir)
    assert first.small_gemm == second.small_gemm == {"onednn": True}
    codes = _codes(6, 11)
    assert np.array_equal(first.decode_offline(codes), second.decode_offline(codes))


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")
def test_short_gemms_on_onednn_give_the_same_audio(
    decoder: CodecDecoder, long_case: tuple[torch.Tensor, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``onednn_small`` (set by ``prepare``) moves short GEMMs to oneDNN: the same audio to TOL."""

    def short_gemms_on_onednn(on: bool) -> None:
        for m in decoder.modules():
            if hasattr(m, "onednn_small"):
                monkeypatch.setattr(m, "onednn_small", on)

    _same_audio_both_ways(decoder, long_case[0][:30], short_gemms_on_onednn)
    assert decoder.small_gemm == {"onednn": True}


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN")
def test_onednn_small_covers_the_transformer_projections_of_short_chunks(
    decoder: CodecDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``onednn_small`` the transformer's q/k/v, output and MLP projections of a few-frame chunk
    go to oneDNN (MKL runs so few rows on one thread); a long chunk and the flag off keep F.linear."""
    from voxcast.models.qwen3_tts import codec_layers
    from voxcast.models.qwen3_tts.codec_layers import Attention, Mlp

    calls: list[tuple[int, ...]] = []
    real = codec_layers.onednn_linear

    def counting(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return real(x, w, b)

    monkeypatch.setattr(codec_layers, "onednn_linear", counting)
    layers = decoder.config.num_hidden_layers

    def transformer_calls(on: bool, frames: int) -> int:
        for m in decoder.modules():  # the convolutions' short GEMMs stay off oneDNN here
            if hasattr(m, "onednn_small"):
                monkeypatch.setattr(m, "onednn_small", on and isinstance(m, (Attention, Mlp)))
        calls.clear()
        decoder.new_stream().decode(_codes(frames, 21))
        assert all(shape[:2] == (1, frames) for shape in calls)
        return len(calls)

    assert transformer_calls(True, 3) == 4 * layers  # qkv, o, gate/up, down per layer
    assert transformer_calls(False, 3) == 0
    assert transformer_calls(True, codec_layers.SMALL_DIM + 1) == 0


def test_bfloat16_streams_exactly_and_stays_close(tokenizer_dir: Path) -> None:
    """bf16 (an option for AMX CPUs): streamed == its own one-pass; near the float32 decode."""
    codes = _codes(24, 13)
    ref = load_codec_decoder(tokenizer_dir).decode_offline(codes)
    dec = load_codec_decoder(tokenizer_dir, dtype=torch.bfloat16)
    one_pass = dec.decode_offline(codes)
    assert one_pass.dtype == np.float32
    assert np.abs(_stream(dec, codes, [1, 3, 8]) - one_pass).max() <= 1e-2
    assert np.sqrt(np.mean((one_pass - ref) ** 2)) <= 0.05 * np.sqrt(np.mean(ref**2))


def test_pruned_priming_state_equals_a_full_conv_pass(decoder: CodecDecoder) -> None:
    """Priming computes only the samples the conv states depend on, narrowing toward the output."""
    ref_codes = _codes(30, 13)
    needs = decoder._back_needs()
    assert needs[-1] == decoder.decoder[-1].context  # the last conv: its tail only, no output
    assert needs[0] == decoder._back_context_frames() < 30
    full, pruned = decoder._fresh_state(), decoder._fresh_state()
    with torch.inference_mode():
        decoder._back(decoder._front(ref_codes[None], full), full)
        decoder._prime_back(decoder._front(ref_codes[None], pruned), pruned)
    assert full.position == pruned.position == 30
    tails = 0
    for a, b in zip(full.convs, pruned.convs, strict=True):
        assert (a is None) == (b is None)  # kernel-1 convs keep no state
        if a is not None and b is not None:
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=0)
            tails += 1
    assert tails > 10
