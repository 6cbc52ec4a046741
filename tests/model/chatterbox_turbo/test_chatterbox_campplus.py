"""Chatterbox Turbo's CAMPPlus on random weights: a 192-d x-vector that depends on the voice, Kaldi's
frame count, clear errors for a bad state or an unusable reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxcast.errors import CheckpointError, InvalidRequest
from voxcast.models.chatterbox_turbo.campplus import MIN_SAMPLES, CAMPPlus, kaldi_fbank
from voxcast.testing.chatterbox_turbo import campplus_state
from voxcast.testing.signals import speech_like


@pytest.fixture(scope="module")
def encoder() -> CAMPPlus:
    return CAMPPlus.from_tensors(campplus_state(seed=1))


def test_the_xvector_depends_on_the_voice(encoder: CAMPPlus) -> None:
    a = encoder.embed(speech_like(6.0, 16000, seed=1))
    b = encoder.embed(torch.from_numpy(speech_like(6.0, 16000, seed=2))[None])
    assert a.shape == b.shape == (1, 192) and a.dtype == torch.float32
    assert torch.isfinite(a).all() and not torch.equal(a, b)
    assert torch.equal(a, encoder.embed(speech_like(6.0, 16000, seed=1)))


def test_the_fbank_has_kaldis_frames() -> None:
    # 25 ms windows every 10 ms, only whole windows (snip edges)
    assert kaldi_fbank(torch.zeros(400)).shape == (1, 80)
    assert kaldi_fbank(torch.zeros(16000)).shape == (98, 80)
    silent = kaldi_fbank(torch.zeros(1000))
    assert torch.equal(silent, torch.full_like(silent, float(np.log(np.finfo(np.float32).eps))))


def test_a_silent_reference_gives_a_finite_xvector_as_upstream(encoder: CAMPPlus) -> None:
    assert torch.isfinite(encoder.embed(np.zeros(16000 * 6, dtype=np.float32))).all()


@pytest.mark.parametrize("audio", [np.zeros(MIN_SAMPLES - 1, np.float32), np.zeros((2, 16000), np.float32)])
def test_an_unusable_reference_is_refused(encoder: CAMPPlus, audio: np.ndarray) -> None:
    # upstream asserts under 400 samples and returns NaN under 720; stereo would be a batch of two
    with pytest.raises(InvalidRequest) as err:
        encoder.embed(audio)
    assert err.value.field == "ref_audio"
    assert torch.isfinite(encoder.embed(np.zeros(MIN_SAMPLES, np.float32))).all()


def test_only_the_speaker_encoders_tensors_are_read() -> None:
    state = campplus_state(seed=2)
    state["flow.encoder.embed.out.0.weight"] = torch.zeros(1)
    assert CAMPPlus.from_tensors(state).head.conv1.weight.device.type == "cpu"
    bare = {
        k.removeprefix("speaker_encoder."): v for k, v in state.items() if k.startswith("speaker_encoder.")
    }
    assert CAMPPlus.from_tensors(bare, prefix="").xvector.dense.linear.weight.shape == (192, 1024, 1)


def test_a_bad_state_is_a_clear_error() -> None:
    state = campplus_state()
    del state["speaker_encoder.xvector.block2.tdnnd7.cam_layer.linear2.bias"]
    with pytest.raises(CheckpointError, match=r"xvector\.block2\.tdnnd7\.cam_layer\.linear2\.bias"):
        CAMPPlus.from_tensors(state)
    state = campplus_state()
    state["speaker_encoder.head.conv1.weight"] = torch.zeros(32, 1, 5, 5)
    with pytest.raises(CheckpointError, match=r"head\.conv1\.weight"):
        CAMPPlus.from_tensors(state)
    with pytest.raises(CheckpointError, match=r"speaker_encoder"):
        CAMPPlus.from_tensors({})
