"""Chatterbox Turbo's S3 speech tokenizer on random weights: 25 tokens a second, sizes read from the
tensors, the checkpoint's layout loaded from ``s3gen_meanflow.safetensors``, clear errors for a bad
state or bad audio."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from voxcast.errors import CheckpointError, InvalidRequest
from voxcast.models.chatterbox_turbo.s3_tokenizer import (
    S3GEN_FILE,
    S3Tokenizer,
    S3TokenizerConfig,
    load_s3_tokenizer,
)
from voxcast.testing.chatterbox_turbo import s3_tokenizer_state
from voxcast.testing.signals import speech_like


@pytest.fixture(scope="module")
def tokenizer() -> S3Tokenizer:
    return S3Tokenizer.from_tensors(s3_tokenizer_state(seed=1))


def _wav(seconds: float, seed: int = 1) -> np.ndarray:
    return speech_like(seconds, 16000, seed=seed, lead_s=0.0, tail_s=0.0)


@pytest.mark.parametrize(
    ("samples", "tokens"), [(16000, 25), (6 * 16000, 150), (15 * 16000, 375), (16159, 25), (16160, 26)]
)
def test_25_tokens_a_second(tokenizer: S3Tokenizer, samples: int, tokens: int) -> None:
    # a mel frame per 160 samples (the centred STFT's last frame dropped), a token per 4 frames
    got = tokenizer.tokens(_wav(samples / 16000)[:samples])
    assert got.shape == (1, tokens) and got.dtype == torch.long
    assert int(got.min()) >= 0 and int(got.max()) < 3**8


def test_max_len_caps_the_tokens_and_the_tokens_follow_the_audio(tokenizer: S3Tokenizer) -> None:
    wav = _wav(18.0)
    capped = tokenizer.tokens(wav, max_len=375)
    assert capped.shape == (1, 375)
    assert torch.equal(capped, tokenizer.tokens(torch.from_numpy(wav)[None], max_len=375))
    assert len(set(capped[0].tolist())) > 50  # random weights, yet frames are told apart
    assert not torch.equal(tokenizer.tokens(_wav(6.0, seed=2)), tokenizer.tokens(_wav(6.0, seed=3)))


def test_the_sizes_come_from_the_tensors() -> None:
    state = {k[len("tokenizer.") :]: v for k, v in s3_tokenizer_state("tiny").items()}
    assert S3TokenizerConfig.from_tensors(state) == S3TokenizerConfig(mels=128, width=128, layers=2)
    assert S3TokenizerConfig.from_tensors(state).heads == 2


def test_a_state_without_the_frontend_buffers_loads(tokenizer: S3Tokenizer) -> None:
    # s3gen_meanflow carries _mel_filters and window (upstream loads it strictly); other S3Gens may not
    state = s3_tokenizer_state(seed=1)
    del state["tokenizer._mel_filters"], state["tokenizer.window"]
    wav = _wav(3.0)
    assert torch.equal(S3Tokenizer.from_tensors(state).tokens(wav), tokenizer.tokens(wav))


def test_a_bad_state_is_a_clear_error() -> None:
    state = s3_tokenizer_state()
    del state["tokenizer.encoder.blocks.1.attn.fsmn_block.weight"]
    with pytest.raises(CheckpointError, match=r"encoder\.blocks\.1\.attn\.fsmn_block\.weight"):
        S3Tokenizer.from_tensors(state)
    state = s3_tokenizer_state()
    state["tokenizer.quantizer._codebook.project_down.weight"] = torch.zeros(8, 64)
    with pytest.raises(CheckpointError, match=r"project_down\.weight"):
        S3Tokenizer.from_tensors(state)
    with pytest.raises(CheckpointError, match=r"encoder\.conv1\.weight"):
        S3Tokenizer.from_tensors({})


def test_loads_from_the_s3gen_file(tmp_path: Path, tokenizer: S3Tokenizer) -> None:
    state = {**s3_tokenizer_state(seed=1), "mel2wav.conv_pre.bias": torch.zeros(4)}
    save_file(state, str(tmp_path / S3GEN_FILE))
    wav = _wav(2.0)
    assert torch.equal(load_s3_tokenizer(tmp_path).tokens(wav), tokenizer.tokens(wav))
    with pytest.raises(CheckpointError, match=S3GEN_FILE):
        load_s3_tokenizer(tmp_path / "missing")


@pytest.mark.parametrize(
    "wav",
    [
        np.zeros((2, 16000), dtype=np.float32),  # stereo
        np.zeros(200, dtype=np.float32),  # shorter than one STFT frame
        np.full(16000, np.nan, dtype=np.float32),
        np.zeros(16000, dtype=np.int16),
        np.zeros(31 * 16000, dtype=np.float32),  # over 30 s: upstream's windowed path, not served
    ],
    ids=["stereo", "short", "nan", "int16", "long"],
)
def test_bad_audio_names_ref_audio(tokenizer: S3Tokenizer, wav: np.ndarray) -> None:
    with pytest.raises(InvalidRequest) as err:
        tokenizer.tokens(wav)
    assert err.value.field == "ref_audio"


def test_long_audio_cut_by_max_len_is_served(tokenizer: S3Tokenizer) -> None:
    assert tokenizer.tokens(np.zeros(31 * 16000, dtype=np.float32), max_len=375).shape == (1, 375)
