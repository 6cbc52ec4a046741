"""Integrated loudness (ITU-R BS.1770-4, via pyloudnorm) and loudness normalisation with a peak ceiling.

Default target: **-16 LUFS**, the common level for spoken word on phones and streaming services
(AES TD1008 recommends -16 LUFS for mobile speech playback; EBU R128 broadcast is -23). For telephony
prompt libraries a quieter -18..-20 LUFS leaves more headroom for G.711 and the network's AGC; the
prerender job passes its own target. The peak ceiling (-1 dBFS sample peak) wins over the target:
when the gain needed for the target would push a sample above it, the gain is lowered instead (no
limiter or compressor alters the waveform) and the result says so.

BS.1770 gating works on 400 ms blocks, so pyloudnorm cannot measure anything shorter. A clip shorter
than that is measured as a loop (tiled until it is 400 ms long), which keeps its mean K-weighted power,
rather than padded with silence, which would read quieter than it sounds.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import pyloudnorm
import soxr

from voxcast.audio.pcm import to_float32

__all__ = [
    "DEFAULT_PEAK_LIMIT_DBFS",
    "DEFAULT_TARGET_LUFS",
    "LoudnessResult",
    "integrated_loudness",
    "normalize_loudness",
    "peak_dbfs",
    "rounded_db",
    "true_peak_dbfs",
]

logger = logging.getLogger(__name__)

DEFAULT_TARGET_LUFS = -16.0
"""Spoken-word target for phones and streaming (see the module docstring)."""

DEFAULT_PEAK_LIMIT_DBFS = -1.0
"""Sample-peak ceiling; leaves room for resampling overshoot and lossy encoders."""

_BLOCK_S = 0.4
"""BS.1770 gating block length; the shortest measurable signal."""


@dataclass(frozen=True, slots=True)
class LoudnessResult:
    """The outcome of :func:`normalize_loudness`.

    Attributes:
        pcm: normalised mono float32 samples.
        input_lufs: integrated loudness before (``-inf`` for silence).
        output_lufs: integrated loudness after.
        gain_db: gain applied (0 for silence).
        peak_dbfs: sample peak after.
        limited: the peak ceiling lowered the gain below what the target needed.
    """

    pcm: np.ndarray
    input_lufs: float
    output_lufs: float
    gain_db: float
    peak_dbfs: float
    limited: bool


def peak_dbfs(pcm: np.ndarray) -> float:
    """Sample peak in dBFS (``-inf`` for silence or no samples)."""
    peak = float(np.max(np.abs(pcm))) if len(pcm) else 0.0
    return 20.0 * math.log10(peak) if peak > 0 else -math.inf


def rounded_db(x: float) -> float | None:
    """A level for a report: rounded to 0.01 dB, None for ``-inf`` (silence)."""
    return round(x, 2) if math.isfinite(x) else None


def true_peak_dbfs(pcm: np.ndarray, sample_rate: int) -> float:
    """True peak in dBTP (ITU-R BS.1770-4 annex 2: the peak of the signal oversampled 4x).

    Inter-sample peaks are what a DAC or a resampler (a PBX transcoding G.711) turns into clipping
    although no sample reaches full scale. ``-inf`` for silence or no samples.
    """
    x = to_float32(pcm)
    if len(x) == 0:
        return -math.inf
    up = soxr.resample(x.astype(np.float64), sample_rate, 4 * sample_rate, quality="HQ")
    return max(peak_dbfs(x), peak_dbfs(up))


def integrated_loudness(pcm: np.ndarray, sample_rate: int) -> float:
    """Integrated loudness of a mono clip.

    Args:
        pcm: 1-D float32 (or int16) samples.
        sample_rate: samples per second.

    Returns:
        Loudness in LUFS; ``-inf`` for empty or silent audio (everything below the -70 LUFS gate).
        Clips shorter than 400 ms are measured as a loop (see the module docstring).
    """
    x = to_float32(pcm).astype(np.float64)
    if len(x) == 0 or not np.any(x):
        return -math.inf
    need = math.ceil(_BLOCK_S * sample_rate)
    if len(x) < need:
        x = np.tile(x, math.ceil(need / len(x)))
    return float(pyloudnorm.Meter(sample_rate).integrated_loudness(x))


def normalize_loudness(
    pcm: np.ndarray,
    sample_rate: int,
    target_lufs: float = DEFAULT_TARGET_LUFS,
    peak_limit_dbfs: float = DEFAULT_PEAK_LIMIT_DBFS,
) -> LoudnessResult:
    """Scale a clip to ``target_lufs`` without letting its sample peak exceed ``peak_limit_dbfs``.

    Args:
        pcm: 1-D float32 (or int16) samples.
        sample_rate: samples per second.
        target_lufs: integrated loudness to reach.
        peak_limit_dbfs: sample-peak ceiling; takes precedence over the target.

    Returns:
        A :class:`LoudnessResult`; silent input comes back unchanged with ``gain_db == 0``.
    """
    x = to_float32(pcm)
    before = integrated_loudness(x, sample_rate)
    if not math.isfinite(before):
        return LoudnessResult(x.copy(), before, before, 0.0, peak_dbfs(x), False)
    gain_db = target_lufs - before
    headroom_db = peak_limit_dbfs - peak_dbfs(x)
    limited = gain_db > headroom_db
    if limited:
        logger.debug(
            "peak ceiling %.1f dBFS limits gain %.2f dB to %.2f dB", peak_limit_dbfs, gain_db, headroom_db
        )
        gain_db = headroom_db
    y = (x * np.float32(10.0 ** (gain_db / 20.0))).astype(np.float32)
    return LoudnessResult(y, before, integrated_loudness(y, sample_rate), gain_db, peak_dbfs(y), limited)
