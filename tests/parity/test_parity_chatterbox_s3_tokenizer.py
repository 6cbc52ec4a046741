"""Chatterbox Turbo's S3 speech tokenizer against the official chatterbox-tts 0.1.7 ``S3Tokenizer``
(``s3tokenizer.model_v2.S3TokenizerV2``) on the same random weights and 16 kHz audio, called as
chatterbox calls it: T3's prompt (the first 15 s, ``max_len=375``) and S3Gen's (10 s, no ``max_len``).
The same log-mel and the same token ids."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parity._official_chatterbox_s3tok import import_official_s3tokenizer, official_s3_tokenizer
from voxcast.models.chatterbox_turbo.s3_tokenizer import S3Tokenizer, default_buffers
from voxcast.testing.chatterbox_turbo import S3_TOKENIZER_SIZES, s3_tokenizer_state
from voxcast.testing.signals import speech_like

official_mod = import_official_s3tokenizer()

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(official_mod is None, reason="chatterbox-tts, s3tokenizer or librosa not importable"),
]

ENC_COND_LEN = 15 * 16000  # ChatterboxTurboTTS.ENC_COND_LEN: T3's prompt is the first 15 s
PROMPT_LEN = 375  # Turbo's speech_cond_prompt_len


def _pair(size: str) -> tuple[S3Tokenizer, object]:
    state = s3_tokenizer_state(size, seed=3)
    width, layers = S3_TOKENIZER_SIZES[size]
    return S3Tokenizer.from_tensors(state), official_s3_tokenizer(state, width, layers)


@pytest.fixture(scope="module")
def tiny() -> tuple[S3Tokenizer, object]:
    return _pair("tiny")


def _audio(seconds: float, seed: int) -> np.ndarray:
    return speech_like(seconds, 16000, seed=seed, lead_s=0.2, tail_s=0.2, pause_s=0.3).astype(np.float32)


def _check(ours: S3Tokenizer, official: object, wav: np.ndarray, max_len: int | None) -> torch.Tensor:
    want, want_lens = official.forward([wav], max_len=max_len)  # type: ignore[attr-defined]
    got = ours.tokens(wav, max_len=max_len)
    assert got.dtype == want.dtype == torch.long
    assert got.shape == want.shape and int(want_lens[0]) == want.shape[1]
    assert torch.equal(got, want), int((got != want).sum())
    return got


@pytest.mark.parametrize(
    ("seconds", "max_len"),
    [(0.35, PROMPT_LEN), (3.0, PROMPT_LEN), (14.0, PROMPT_LEN), (18.5, PROMPT_LEN), (10.0, 100)],
)
def test_prompt_tokens_equal_the_official(
    tiny: tuple[S3Tokenizer, object], seconds: float, max_len: int
) -> None:
    ours, official = tiny
    wav = _audio(seconds, seed=int(seconds * 10))[:ENC_COND_LEN]  # prepare_conditionals' slice
    got = _check(ours, official, wav, max_len)
    assert got.shape[1] == min(max_len, -(-(len(wav) // 160) // 4))
    assert len(set(got[0].tolist())) > got.shape[1] // 4  # random weights that still tell frames apart


@pytest.mark.parametrize("samples", [10 * 16000, 10 * 16000 - 77, 1000])
def test_s3gen_tokens_equal_the_official(tiny: tuple[S3Tokenizer, object], samples: int) -> None:
    # S3Gen.embed_ref tokenizes the (resampled) 10 s reference as a [1, len] tensor, without max_len
    ours, official = tiny
    wav = _audio(samples / 16000, seed=samples % 97)[:samples]
    want, _ = official.forward(torch.from_numpy(wav)[None])  # type: ignore[attr-defined]
    assert torch.equal(ours.tokens(torch.from_numpy(wav)[None]), want)


@pytest.mark.parametrize("seconds", [0.35, 15.0])
def test_the_log_mel_is_the_official(tiny: tuple[S3Tokenizer, object], seconds: float) -> None:
    ours, official = tiny
    wav = torch.from_numpy(_audio(seconds, seed=5))[None]
    with torch.inference_mode():
        want = official.log_mel_spectrogram(wav)  # type: ignore[attr-defined]
        got = ours.log_mel(wav)
    assert got.shape == want.shape and torch.equal(got, want), float((got - want).abs().max())


def test_the_default_filters_and_window_are_upstreams() -> None:
    import librosa

    buffers = default_buffers(128)
    assert torch.equal(
        buffers["_mel_filters"], torch.FloatTensor(librosa.filters.mel(sr=16000, n_fft=400, n_mels=128))
    )
    assert torch.equal(buffers["window"], torch.hann_window(400))


@pytest.mark.slow
def test_full_size_prompt_tokens_equal_the_official() -> None:
    ours, official = _pair("full")
    wav = _audio(16.0, seed=7)[:ENC_COND_LEN]
    assert _check(ours, official, wav, PROMPT_LEN).shape == (1, PROMPT_LEN)
