"""Chatterbox Turbo's HiFT vocoder against the official chatterbox-tts 0.1.7 ``HiFTGenerator.inference``
on the same random weights, mel and seed: the same pitch and audio."""

from __future__ import annotations

import pytest
import torch

from tests.parity._official_chatterbox import import_chatterbox, official_hift
from voxcast.models.chatterbox_turbo.hift import HiFT
from voxcast.testing.chatterbox_turbo import HIFT_SIZES, hift_state

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        import_chatterbox("models.s3gen.hifigan") is None, reason="chatterbox-tts not installed"
    ),
]


@pytest.mark.parametrize("frames", [1, 24, 77])
def test_audio_equals_the_official(frames: int) -> None:
    state = hift_state("tiny", seed=5)
    ours, official = HiFT.from_tensors(state), official_hift(state, *HIFT_SIZES["tiny"])
    mel = torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(frames)) - 4.0
    torch.manual_seed(11)
    want, _ = official.inference(mel)
    got = ours.inference(mel, torch.Generator().manual_seed(11))
    assert got.shape == want.shape == (1, frames * 480)
    assert torch.equal(ours.f0(mel), official.f0_predictor(mel))
    assert torch.equal(got, want), float(torch.max(torch.abs(got - want)))
