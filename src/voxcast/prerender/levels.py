"""Encode a prompt per preset at a measured loudness under a true-peak ceiling.

The level a listener hears is the level of the file a phone system plays, so it is set and measured
there: the 24 kHz prompt is resampled to the preset's rate, scaled by the gain that brings it to the
target, encoded, decoded again and measured (integrated loudness, ITU-R BS.1770, and true peak, 4x
oversampled). Where the encoded file misses the target by more than :data:`TOLERANCE_LU` (band
limiting at 8 kHz, G.711 quantisation, MP3/Opus), the gain is corrected by the miss and the file is
encoded again; where the true peak would pass the ceiling, the gain is lowered instead (no limiter
touches the waveform) and the result says ``peak_limited``. What is recorded is what was measured
on the file that was stored.

Normalising once at 24 kHz and resampling afterwards does not work: the speech energy above 4 kHz
that an 8 kHz file cannot carry was counted at 24 kHz (measured on the random demo model, whose
output is broadband: -38 to -40 LUFS in the 8 kHz files for a -19 target; 2.4 dB low at 16 kHz).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import soundfile as sf

from voxcast.audio.encode import encode_file
from voxcast.audio.formats import NATIVE_SAMPLE_RATE
from voxcast.audio.loudness import integrated_loudness, rounded_db, true_peak_dbfs
from voxcast.audio.resample import resample
from voxcast.prerender.presets import Preset

__all__ = ["TOLERANCE_LU", "Leveled", "decode_file", "encode_leveled"]

TOLERANCE_LU = 0.3
"""A file within this of the target is kept; otherwise its gain is corrected (up to :data:`_PASSES`)."""

_PASSES = 3
"""Encodings tried per preset: the first, then corrections for a codec's level change or overshoot."""

_MARGIN_DB = 0.05
"""Extra headroom taken when a codec pushed the true peak past the ceiling."""


@dataclass(frozen=True)
class Leveled:
    """One preset's file and what was measured on it (decoded again).

    Attributes:
        data: the file.
        loudness_lufs: integrated loudness of the file (None: silent).
        true_peak_dbtp: true peak of the file (None: silent).
        gain_db: gain applied to the resampled prompt.
        peak_limited: the ceiling kept the gain below what the target needed.
        passes: encodings it took.
    """

    data: bytes
    loudness_lufs: float | None
    true_peak_dbtp: float | None
    gain_db: float
    peak_limited: bool
    passes: int

    def facts(self) -> dict[str, Any]:
        return {
            "loudness_lufs": self.loudness_lufs,
            "true_peak_dbtp": self.true_peak_dbtp,
            "gain_db": round(self.gain_db, 2),
            "peak_limited": self.peak_limited,
        }


def decode_file(data: bytes) -> tuple[np.ndarray, int]:
    """Decode a stored file (any preset) to mono float32 and its rate."""
    x, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return x.mean(axis=1, dtype=np.float32), int(sr)


def encode_leveled(
    pcm: np.ndarray,
    preset: Preset,
    target_lufs: float | None,
    ceiling_dbtp: float,
    sample_rate: int = NATIVE_SAMPLE_RATE,
) -> Leveled:
    """Encode ``pcm`` in ``preset`` at ``target_lufs`` (None: level unchanged) with its true peak
    at most ``ceiling_dbtp``; see the module docstring."""
    x = resample(pcm, sample_rate, preset.sample_rate) if sample_rate != preset.sample_rate else pcm
    x = np.asarray(x, dtype=np.float32)
    want = 0.0
    headroom = math.inf
    if target_lufs is not None:
        level = integrated_loudness(x, preset.sample_rate)
        if math.isfinite(level):
            want = target_lufs - level
            headroom = ceiling_dbtp - true_peak_dbfs(x, preset.sample_rate)
    gain = min(want, headroom)
    for passes in range(1, _PASSES + 1):
        data = encode_file(
            x * np.float32(10.0 ** (gain / 20.0)), preset.format, preset.sample_rate, preset.sample_rate
        )
        y, sr = decode_file(data)
        lufs, peak = integrated_loudness(y, sr), true_peak_dbfs(y, sr)
        if target_lufs is None or not math.isfinite(lufs) or passes == _PASSES:
            break
        if peak > ceiling_dbtp:  # the codec overshot: take the excess off the ceiling's allowance
            headroom = gain - (peak - ceiling_dbtp) - _MARGIN_DB
        elif abs(lufs - target_lufs) <= TOLERANCE_LU or (gain >= headroom and lufs < target_lufs):
            break
        else:  # the codec or the band limit moved the level: correct by the miss
            want = gain + (target_lufs - lufs)
        gain = min(want, headroom)
    return Leveled(
        preset.file(data),
        rounded_db(lufs),
        rounded_db(peak),
        gain,
        target_lufs is not None and want > headroom,
        passes,
    )
