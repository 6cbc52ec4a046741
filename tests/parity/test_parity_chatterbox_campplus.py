"""Chatterbox Turbo's CAMPPlus against the official chatterbox-tts 0.1.7 ``CAMPPlus.inference`` (as
S3Gen's ``embed_ref`` calls it on its 16 kHz reference) on the same random weights and audio: the
same x-vector; and our Kaldi fbank against ``torchaudio.compliance.kaldi.fbank``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parity._official_chatterbox_campplus import (
    import_official_xvector,
    official_campplus,
    official_kaldi,
)
from voxcast.models.chatterbox_turbo.campplus import MIN_SAMPLES, CAMPPlus, kaldi_fbank
from voxcast.testing.chatterbox_turbo import campplus_state

kaldi = official_kaldi()
xvector = import_official_xvector()

pytestmark = pytest.mark.parity


def _audio(samples: int, seed: int) -> np.ndarray:
    """Noise under two tones whose loudness swells (float32, 16 kHz)."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / 16000
    swell = 0.5 + 0.5 * np.sin(2 * np.pi * 0.7 * t)
    tones = 0.2 * np.sin(2 * np.pi * 180 * t) + 0.1 * swell * np.sin(2 * np.pi * 1375 * t + 0.3)
    return (tones + 0.03 * rng.standard_normal(samples)).astype(np.float32)


@pytest.mark.skipif(kaldi is None, reason="torchaudio not installed")
@pytest.mark.parametrize("samples", [400, 559, 560, 16000, 84800, 160000])
def test_the_fbank_equals_torchaudios_kaldi_fbank(samples: int) -> None:
    assert kaldi is not None
    wav = torch.from_numpy(_audio(samples, seed=samples))
    want = kaldi.fbank(wav[None], num_mel_bins=80)
    assert torch.equal(kaldi_fbank(wav), want)


@pytest.fixture(scope="module")
def models() -> tuple[CAMPPlus, torch.nn.Module]:
    if xvector is None:
        pytest.skip("chatterbox-tts or torchaudio not installed")
    state = campplus_state(seed=5)
    return CAMPPlus.from_tensors(state), official_campplus(state)


@pytest.mark.parametrize(("seconds", "seed"), [(1.0, 1), (5.3, 2), (10.0, 3)])
def test_the_xvector_equals_the_official(
    models: tuple[CAMPPlus, torch.nn.Module], seconds: float, seed: int
) -> None:
    ours, official = models
    wav = _audio(int(seconds * 16000), seed)
    with torch.inference_mode():
        want = official.inference(torch.from_numpy(wav)[None])  # embed_ref's [1, L] float32
    got = ours.embed(wav)
    assert got.shape == want.shape == (1, 192)
    assert torch.equal(got, want)


def test_a_silent_reference_gives_the_officials_xvector(models: tuple[CAMPPlus, torch.nn.Module]) -> None:
    ours, official = models
    silence = torch.zeros(16000 * 6)
    with torch.inference_mode():
        want = official.inference(silence[None])
    assert torch.equal(ours.embed(silence), want)


def test_upstream_has_no_xvector_below_our_minimum(models: tuple[CAMPPlus, torch.nn.Module]) -> None:
    _, official = models
    wav = torch.from_numpy(_audio(MIN_SAMPLES, seed=7))
    with torch.inference_mode(), pytest.warns(UserWarning):  # std over a single step
        assert torch.isnan(official.inference(wav[None, : MIN_SAMPLES - 1])).all()
    with torch.inference_mode():
        assert torch.isfinite(official.inference(wav[None])).all()
