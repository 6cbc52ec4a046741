"""Parity of the codec side (decode, encode, x-vector, ICL cut) with the official qwen-tts 0.1.1.

- Decode: our one-pass and streamed decodes equal the official ``Qwen3TTSTokenizer.decode`` up to
  300 frames (the official decode is exact only there: beyond it re-decodes 300-frame chunks with
  25 frames of left context, an approximation; ours stays exact).
- Encode: reference codes equal the official ``encode`` (24 kHz input, and other rates through our
  soxr-HQ resampler, which is what ``librosa.resample`` runs by default).
- x-vector: equal to ``extract_speaker_embedding`` / ``create_voice_clone_prompt``.
- ICL cut: the official wrapper decodes ``ref ++ gen`` and drops
  ``cut = int(ref_len / total_len * total_len * 1920)`` samples. In exact arithmetic that is
  ``ref_len * 1920``; in floating point the quotient is sometimes rounded down, so ``cut`` is one
  sample short and the official clip starts with the reference's last sample. A decoder primed
  with the reference codes returns exactly the generated frames' samples: the official clip equals
  ours, preceded by that one extra sample when ``cut == ref_len * 1920 - 1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.parity._official import import_qwen_tts, load_official, official_voice_items, run_official
from voxcast.audio.reference import prepare_reference_audio
from voxcast.models.qwen3_tts.codec_decoder import SAMPLES_PER_FRAME, CodecDecoder, CodecDecoderConfig
from voxcast.models.qwen3_tts.codec_encoder import load_codec_encoder
from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig, extract_xvector
from voxcast.models.qwen3_tts.voice_prompt import build_voice_prompt

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(import_qwen_tts() is None, reason="qwen_tts (official package) not importable"),
]

TOL = 1e-4
REF_TEXT = "This is what the reference clip says."


@pytest.fixture(scope="module")
def base_dir(tiny_model_dir: Any) -> Path:
    return Path(tiny_model_dir("base"))


@pytest.fixture(scope="module")
def official_tokenizer(base_dir: Path) -> Any:
    return load_official(base_dir).model.speech_tokenizer


def _ours_from(official_decoder: Any) -> CodecDecoder:
    """Our decoder holding the official module's current weights (strict: names must match)."""
    ours = CodecDecoder(CodecDecoderConfig.from_dict(official_decoder.config.to_dict()))
    ours.load_state_dict(official_decoder.state_dict(), strict=True)
    return ours.eval()


def _codes(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (n, 16), generator=torch.Generator().manual_seed(seed))


def _speech(seconds: float, sr: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    wav = 0.3 * np.sin(2 * np.pi * 150 * t * (1 + 0.2 * np.sin(2 * np.pi * 2 * t))) + rng.normal(
        0, 0.02, t.shape
    )
    return wav.astype(np.float32)


def _check_decode(tok: Any, ours: CodecDecoder, codes: torch.Tensor) -> None:
    (official,), _ = tok.decode([{"audio_codes": codes}])
    assert official.shape == (codes.shape[0] * SAMPLES_PER_FRAME,)
    assert np.abs(ours.decode_offline(codes) - official).max() <= TOL
    for sizes in ([1], [3], [7, 2]):
        s, out, i, k = ours.new_stream(), [], 0, 0
        while i < codes.shape[0]:
            n = sizes[k % len(sizes)]
            out.append(s.decode(codes[i : i + n]))
            i, k = i + n, k + 1
        assert np.abs(np.concatenate(out) - official).max() <= TOL, f"stream {sizes}"


def test_decode_parity(official_tokenizer: Any) -> None:
    ours = _ours_from(official_tokenizer.model.decoder)
    _check_decode(official_tokenizer, ours, _codes(150, 0))


def test_decode_parity_with_every_part_active(official_tokenizer: Any) -> None:
    """LayerScale 1 and random SnakeBeta on both sides (random init leaves some parts near-identity)."""
    dec = official_tokenizer.model.decoder
    saved = {k: v.clone() for k, v in dec.state_dict().items()}
    try:
        gen = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in dec.named_parameters():
                if name.endswith(".scale"):
                    p.fill_(1.0)
                elif name.endswith((".alpha", ".beta")):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        _check_decode(official_tokenizer, _ours_from(dec), _codes(120, 1))
    finally:
        dec.load_state_dict(saved)


def test_beyond_300_frames_official_is_chunked(official_tokenizer: Any) -> None:
    """Up to frame 300 both agree; after it the official chunked re-decode is only approximate."""
    ours = _ours_from(official_tokenizer.model.decoder)
    codes = _codes(330, 2)
    (official,), _ = official_tokenizer.decode([{"audio_codes": codes}])
    exact = ours.decode_offline(codes)
    assert np.abs(exact[: 300 * SAMPLES_PER_FRAME] - official[: 300 * SAMPLES_PER_FRAME]).max() <= TOL
    assert official.shape == exact.shape


@pytest.mark.parametrize("seconds", [1.0, 2.345, 30 * SAMPLES_PER_FRAME / 24000])
def test_encode_parity_24k(base_dir: Path, official_tokenizer: Any, seconds: float) -> None:
    wav = _speech(seconds, 24000)
    official = official_tokenizer.encode(wav, sr=24000).audio_codes[0]
    ours = load_codec_encoder(base_dir / "speech_tokenizer").encode(wav)
    assert ours.shape == (-(-wav.shape[0] // SAMPLES_PER_FRAME), 16)
    assert torch.equal(ours, official.cpu())


@pytest.mark.parametrize("sr", [16000, 44100, 48000])
def test_encode_parity_resampled(base_dir: Path, official_tokenizer: Any, sr: int) -> None:
    wav = _speech(1.7, sr, seed=sr)
    official = official_tokenizer.encode(wav, sr=sr).audio_codes[0]
    ours = load_codec_encoder(base_dir / "speech_tokenizer").encode(prepare_reference_audio(wav, sr))
    assert torch.equal(ours, official.cpu())


def _speaker_encoder(base_dir: Path) -> SpeakerEncoder:
    import json

    cfg = json.loads((base_dir / "config.json").read_text())["speaker_encoder_config"]
    enc = SpeakerEncoder(SpeakerEncoderConfig.from_dict(cfg))
    weights = load_file(str(base_dir / "model.safetensors"))
    enc.load_state_dict(
        {k[len("speaker_encoder.") :]: v for k, v in weights.items() if k.startswith("speaker_encoder.")}
    )
    return enc.eval()


def test_xvector_parity(base_dir: Path) -> None:
    wav = _speech(2.5, 24000, seed=3)
    official = load_official(base_dir).model.extract_speaker_embedding(audio=wav, sr=24000)
    ours = extract_xvector(_speaker_encoder(base_dir), wav)
    assert ours.shape == official.shape
    assert (ours - official.float().cpu()).abs().max().item() <= 1e-5


@pytest.mark.parametrize("sr", [24000, 44100])
def test_voice_prompt_parity(base_dir: Path, sr: int) -> None:
    wav = _speech(2.2, sr, seed=7)
    (item,) = official_voice_items(load_official(base_dir), wav, sr, REF_TEXT, False)
    prompt = build_voice_prompt(
        _speaker_encoder(base_dir),
        load_codec_encoder(base_dir / "speech_tokenizer"),
        prepare_reference_audio(wav, sr),
        REF_TEXT,
        x_vector_only=False,
        model_identity="tiny",
    )
    assert prompt.ref_codes is not None and torch.equal(prompt.ref_codes, item.ref_code.cpu())
    assert (prompt.x_vector - item.ref_spk_embedding.float().cpu()).abs().max().item() <= 1e-5


def official_cut(ref_frames: int, total_frames: int) -> int:
    """The official wrapper's cut (samples dropped from the decode of ref ++ gen)."""
    return int(ref_frames / max(total_frames, 1) * (total_frames * SAMPLES_PER_FRAME))


def test_official_cut_is_exact_or_one_short() -> None:
    short = 0
    for ref in range(1, 376):
        for total in range(ref + 1, ref + 300):
            d = ref * SAMPLES_PER_FRAME - official_cut(ref, total)
            assert d in (0, 1)
            short += d
    assert short > 0  # the rounding case exists (a few percent of (ref, total) pairs)


def test_icl_clone_waveform_parity(base_dir: Path, official_tokenizer: Any) -> None:
    wrapper = load_official(base_dir)
    items = official_voice_items(wrapper, _speech(2.0, 24000, seed=9), 24000, REF_TEXT, False)
    run = run_official(
        wrapper, "Hello there, this is a short test.", seed=3, max_frames=30, voice_items=items
    )
    assert run.codes is not None and run.codes.shape[0] > 0
    ref_codes = items[0].ref_code.cpu()
    n_ref, n_gen = ref_codes.shape[0], run.codes.shape[0]
    assert n_ref + n_gen <= 300  # the official decode is one pass here
    ours = _ours_from(official_tokenizer.model.decoder)
    stream = ours.new_stream(ref_codes)
    got = np.concatenate([stream.decode(run.codes[i : i + 4]) for i in range(0, n_gen, 4)])
    official = run.wavs[0]
    extra = n_ref * SAMPLES_PER_FRAME - official_cut(n_ref, n_ref + n_gen)
    assert official.shape[0] == got.shape[0] + extra
    assert np.abs(official[extra:] - got).max() <= TOL
