"""The log-mel front end of the Qwen3-TTS speaker encoder (no librosa needed).

Values follow the official ``mel_spectrogram`` as called by ``extract_speaker_embedding``: 24 kHz,
n_fft 1024, hop 256, Hann window 1024, reflect padding of (n_fft - hop) / 2 on both sides, no
centring, magnitude ``sqrt(re^2 + im^2 + 1e-9)``, a Slaney-style mel filterbank (128 bands,
0-12000 Hz, Slaney area normalisation, as ``librosa.filters.mel`` defaults) and ``log(max(x, 1e-5))``.
The filterbank is computed here in float64 and rounded to float32 the way librosa does, so the
matrix equals librosa's bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["MelConfig", "log_mel_spectrogram", "mel_filterbank"]

_F_SP = 200.0 / 3  # Slaney mel scale: linear below 1 kHz ...
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOG_STEP = np.log(6.4) / 27.0  # ... logarithmic above


class MelConfig:
    """The front end's fixed parameters (documented constants of the official code)."""

    sample_rate = 24000
    n_fft = 1024
    hop = 256
    win = 1024
    n_mels = 128
    fmin = 0.0
    fmax = 12000.0


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


def log_mel_spectrogram(audio: torch.Tensor, cfg: type[MelConfig] = MelConfig) -> torch.Tensor:
    """Log-mel spectrogram of a batch of waveforms.

    Args:
        audio: float tensor [B, L] at ``cfg.sample_rate`` (L > (n_fft - hop) / 2 for the reflect pad).
        cfg: front-end parameters.

    Returns:
        float32 tensor [B, n_mels, frames] with frames = (L + 2*pad - n_fft) // hop + 1.
    """
    basis = mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels, cfg.fmin, cfg.fmax)
    basis_t = torch.from_numpy(basis).float().to(audio.device)
    window = torch.hann_window(cfg.win).to(audio.device)
    pad = (cfg.n_fft - cfg.hop) // 2
    y = F.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(
        y,
        cfg.n_fft,
        hop_length=cfg.hop,
        win_length=cfg.win,
        window=window,
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)  # [B, bins, frames]
    return torch.log(torch.clamp(torch.matmul(basis_t, mag), min=1e-5))
