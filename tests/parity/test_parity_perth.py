"""Our Perth watermark against the official ``PerthImplicitWatermarker`` (resemble-perth 1.0.1, its
packaged weights): the marked audio bitwise, the detector's score to float rounding, at the rates
voxcast renders (Chatterbox's and Qwen's 24 kHz, Perth's own 32 kHz, and 16 kHz)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.parity._official_perth import official_watermarker
from voxcast.testing.signals import speech_like
from voxcast.watermark.perth import PerthWatermarker, find_perth_weights

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(find_perth_weights() is None, reason="resemble-perth is not installed"),
]


@pytest.fixture(scope="module")
def official() -> object:
    wm = official_watermarker()
    if wm is None:
        pytest.skip("the official watermarker cannot load (librosa or torchaudio's sources missing)")
    return wm


@pytest.fixture(scope="module")
def ours() -> PerthWatermarker:
    return PerthWatermarker.load()


@pytest.mark.parametrize(
    ("sample_rate", "seconds", "seed"), [(24000, 3.0, 1), (24000, 0.7, 2), (32000, 2.0, 3), (16000, 2.5, 4)]
)
def test_marked_audio_is_the_officials(
    official: object, ours: PerthWatermarker, sample_rate: int, seconds: float, seed: int
) -> None:
    x = speech_like(seconds, sample_rate, seed=seed, pause_s=0.2)
    want = official.apply_watermark(x, sample_rate=sample_rate)  # type: ignore[attr-defined]
    got = ours.apply(x, sample_rate)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want), float(np.abs(got - want).max())
    if seconds >= 2:  # a mark was put on: the official detector finds it (and not on the input)
        assert official.get_watermark(got, sample_rate) == 1.0  # type: ignore[attr-defined]
        assert official.get_watermark(x, sample_rate) == 0.0  # type: ignore[attr-defined]


@pytest.mark.parametrize("sample_rate", [24000, 32000])
def test_detector_scores_are_the_officials(
    official: object, ours: PerthWatermarker, sample_rate: int
) -> None:
    x = speech_like(2.0, sample_rate, seed=7)
    marked = ours.apply(x, sample_rate)
    for signal in (x, marked):
        want = float(official.get_watermark(signal, sample_rate, round=False))  # type: ignore[attr-defined]
        assert ours.detect(signal, sample_rate) == pytest.approx(want, abs=1e-5)
