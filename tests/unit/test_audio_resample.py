"""Streaming resampling equals the one-shot resample, bit for bit, for any chunking."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from voxcast.audio.formats import NATIVE_SAMPLE_RATE, SUPPORTED_SAMPLE_RATES
from voxcast.audio.resample import RESAMPLE_QUALITY, StreamResampler, resample


def _sweep(seconds: float, sr: int = NATIVE_SAMPLE_RATE) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    f0, f1 = 50.0, 11000.0
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t**2 / (2 * seconds))
    return (0.5 * np.sin(phase)).astype(np.float32)


def _chunk_schedule(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(int(rng.choice([0, 1, 7, 480, 1920, 3840, int(rng.integers(1, 6000))])))
    return sizes


@pytest.mark.parametrize("sr_out", SUPPORTED_SAMPLE_RATES)
def test_one_shot_equals_soxr_itself(sr_out: int) -> None:
    """The reference the streaming test compares with is soxr's own one-shot resampler (the same
    quality), bit for bit: not only independent of chunking, but right."""
    x = _sweep(1.37)
    want = soxr.resample(x, NATIVE_SAMPLE_RATE, sr_out, quality=RESAMPLE_QUALITY)
    np.testing.assert_array_equal(resample(x, NATIVE_SAMPLE_RATE, sr_out), want)


@pytest.mark.parametrize("sr_out", SUPPORTED_SAMPLE_RATES)
@pytest.mark.parametrize("seed", [0, 1])
def test_streamed_equals_one_shot(sr_out: int, seed: int) -> None:
    x = _sweep(1.37)
    stream = StreamResampler(NATIVE_SAMPLE_RATE, sr_out)
    out, pos = [], 0
    for size in _chunk_schedule(len(x), seed):
        out.append(stream.process(x[pos : pos + size]))
        pos += size
    out.append(stream.flush())
    np.testing.assert_array_equal(np.concatenate(out), resample(x, NATIVE_SAMPLE_RATE, sr_out))


@pytest.mark.parametrize("sr_out", SUPPORTED_SAMPLE_RATES)
def test_length_and_content(sr_out: int) -> None:
    n = 24001
    t = np.arange(n) / NATIVE_SAMPLE_RATE
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    y = resample(x, NATIVE_SAMPLE_RATE, sr_out)
    assert y.dtype == np.float32
    assert abs(len(y) - n * sr_out / NATIVE_SAMPLE_RATE) <= 1
    ty = np.arange(len(y)) / sr_out
    ref = 0.5 * np.sin(2 * np.pi * 440 * ty)
    mid = slice(len(y) // 10, -len(y) // 10)  # edges carry the filter's ramp
    assert np.max(np.abs(y[mid] - ref[mid])) < 1e-3


def test_equal_rates_pass_through_and_misuse_raises() -> None:
    x = _sweep(0.1)
    stream = StreamResampler(24000, 24000)
    np.testing.assert_array_equal(stream.process(x), x)
    assert len(stream.flush()) == 0
    with pytest.raises(RuntimeError):
        stream.process(x)
    with pytest.raises(RuntimeError):
        stream.flush()
    with pytest.raises(ValueError):
        StreamResampler(0, 8000)
