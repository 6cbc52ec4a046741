"""Chatterbox Turbo's VoiceEncoder on random weights: a unit embedding, partials as the official
counts them, clear errors for a bad state or a silent reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxcast.errors import CheckpointError, InvalidRequest
from voxcast.models.chatterbox_turbo.voice_encoder import VoiceEncoder, partial_count
from voxcast.testing.chatterbox_turbo import ve_state
from voxcast.testing.signals import speech_like


@pytest.fixture(scope="module")
def encoder() -> VoiceEncoder:
    return VoiceEncoder.from_tensors(ve_state(seed=1))


def test_the_embedding_is_a_unit_vector_and_depends_on_the_voice(encoder: VoiceEncoder) -> None:
    a = encoder.embed(speech_like(6.0, 16000, seed=1))
    b = encoder.embed(speech_like(6.0, 16000, seed=2))
    assert a.shape == (1, 256) and abs(float(torch.linalg.norm(a)) - 1.0) < 1e-5
    assert not torch.equal(a, b) and torch.equal(a, encoder.embed(speech_like(6.0, 16000, seed=1)))


def test_partials_cover_the_mel_as_upstream_counts_them() -> None:
    # step 77 (rate 1.3): a partial is 160 frames; the last one is kept when it covers 80 %
    assert partial_count(100, 77) == (1, 160)
    assert partial_count(160, 77) == (1, 160)
    assert partial_count(237, 77) == (2, 237)
    assert partial_count(250, 77) == (2, 237)  # a third would cover 13 of 160 frames: dropped


def test_a_silent_reference_is_refused(encoder: VoiceEncoder) -> None:
    with pytest.raises(InvalidRequest) as err:
        encoder.embed(np.zeros(16000 * 6, dtype=np.float32))
    assert err.value.field == "ref_audio"


def test_a_bad_state_is_a_clear_error() -> None:
    state = ve_state()
    del state["lstm.weight_hh_l2"]
    with pytest.raises(CheckpointError, match=r"lstm\.weight_hh_l2"):
        VoiceEncoder.from_tensors(state)
    with pytest.raises(CheckpointError, match=r"proj\.weight"):
        VoiceEncoder.from_tensors({})
