"""Slaney mel filterbanks equal to ``librosa.filters.mel`` (its defaults: Slaney scale, Slaney area
normalisation), bit for bit: computed in float64 and rounded to float32 the way librosa does. Used by
the models' front ends (no librosa needed at run time)."""

from __future__ import annotations

import numpy as np

__all__ = ["mel_filterbank"]

_F_SP = 200.0 / 3  # Slaney mel scale: linear below 1 kHz ...
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = np.log(6.4) / 27.0  # ... logarithmic above


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    mel = f / _F_SP
    log_part = f >= _MIN_LOG_HZ
    mel[log_part] = _MIN_LOG_MEL + np.log(f[log_part] / _MIN_LOG_HZ) / _LOG_STEP
    return mel


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    hz = _F_SP * m
    log_part = m >= _MIN_LOG_MEL
    hz[log_part] = _MIN_LOG_HZ * np.exp(_LOG_STEP * (m[log_part] - _MIN_LOG_MEL))
    return hz


def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """Slaney mel filterbank with Slaney area normalisation, float32 [n_mels, n_fft // 2 + 1]."""
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    lo, hi = _hz_to_mel(np.array([fmin, fmax], dtype=np.float64))
    edges = _mel_to_hz(np.linspace(lo, hi, n_mels + 2))
    widths = np.diff(edges)
    ramps = np.subtract.outer(edges, fft_freqs)  # [n_mels + 2, bins]
    weights = np.zeros((n_mels, fft_freqs.shape[0]), dtype=np.float32)
    for i in range(n_mels):
        rising = -ramps[i] / widths[i]
        falling = ramps[i + 2] / widths[i + 1]
        weights[i] = np.maximum(0, np.minimum(rising, falling))
    weights *= (2.0 / (edges[2 : n_mels + 2] - edges[:n_mels]))[:, None]
    return weights
