"""Loudness measurement and normalisation with pyloudnorm (BS.1770)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from voxcast.audio.loudness import integrated_loudness, normalize_loudness, peak_dbfs

SR = 24000


def _tone(seconds: float, amp: float, freq: float = 1000.0, sr: int = SR) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * freq * np.arange(int(seconds * sr)) / sr)).astype(np.float32)


def _speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """Seeded 'syllables': harmonic vowels (random pitch) under a Hann envelope, with gaps."""
    rng = np.random.default_rng(seed)
    n, syl = int(seconds * SR), int(0.2 * SR)
    t = np.arange(syl) / SR
    x = np.zeros(n)
    for start in np.arange(0.05, seconds - 0.2, 0.25):
        f0 = rng.uniform(100, 220)
        vowel = sum(np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 6.28)) / k for k in range(1, 8))
        i = int(start * SR)
        x[i : i + syl] = 0.15 * rng.uniform(0.5, 1.0) * np.hanning(syl) ** 0.25 * vowel
    return x.astype(np.float32)


def test_reference_tone_loudness() -> None:
    # BS.1770: a 0 dBFS-peak 997 Hz sine in one channel reads -3.01 LUFS (K-weighting ~0 dB near 1 kHz)
    assert integrated_loudness(_tone(3.0, 1.0, 997.0), SR) == pytest.approx(-3.01, abs=0.1)
    assert integrated_loudness(_tone(3.0, 0.1, 997.0), SR) == pytest.approx(-23.01, abs=0.1)


@pytest.mark.parametrize("target", [-16.0, -20.0, -26.0])
@pytest.mark.parametrize("sr", [8000, 24000, 48000])
def test_normalize_lands_within_half_an_lu(target: float, sr: int) -> None:
    x = _speechlike(3.0, seed=int(-target))
    if sr != SR:
        from voxcast.audio.resample import resample

        x = resample(x, SR, sr)
    res = normalize_loudness(x, sr, target_lufs=target, peak_limit_dbfs=0.0)
    assert not res.limited
    assert abs(integrated_loudness(res.pcm, sr) - target) < 0.5
    assert res.output_lufs == pytest.approx(target, abs=0.5)
    assert res.gain_db == pytest.approx(target - res.input_lufs)


def test_peak_ceiling_wins_over_target() -> None:
    x = np.zeros(SR * 2, np.float32)
    x[SR] = 0.5  # one click: very quiet integrated, high peak
    x += _tone(2.0, 0.001)
    res = normalize_loudness(x, SR, target_lufs=-16.0, peak_limit_dbfs=-1.0)
    assert res.limited
    assert res.peak_dbfs == pytest.approx(-1.0, abs=1e-3)
    assert res.output_lufs < -16.0


def test_short_clip_is_measured_as_a_loop() -> None:
    short = _tone(0.25, 0.1, 997.0)  # shorter than one 400 ms block
    assert integrated_loudness(short, SR) == pytest.approx(-23.01, abs=0.3)
    res = normalize_loudness(short, SR, target_lufs=-18.0)
    assert len(res.pcm) == len(short)
    assert res.output_lufs == pytest.approx(-18.0, abs=0.5)


def test_silence_and_empty_are_left_alone() -> None:
    for x in (np.zeros(SR, np.float32), np.zeros(0, np.float32)):
        res = normalize_loudness(x, SR)
        assert res.gain_db == 0.0 and math.isinf(res.input_lufs)
        np.testing.assert_array_equal(res.pcm, x)
    assert peak_dbfs(np.zeros(3, np.float32)) == -math.inf
