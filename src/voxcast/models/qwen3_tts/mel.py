"""The log-mel front end of the Qwen3-TTS speaker encoder (no librosa needed).

Values follow the official ``mel_spectrogram`` as called by ``extract_speaker_embedding``: 24 kHz,
n_fft 1024, hop 256, Hann window 1024, reflect padding of (n_fft - hop) / 2 on both sides, no
centring, magnitude ``sqrt(re^2 + im^2 + 1e-9)``, a Slaney-style mel filterbank (128 bands,
0-12000 Hz, Slaney area normalisation, as ``librosa.filters.mel`` defaults) and ``log(max(x, 1e-5))``.
The filterbank is computed here in float64 and rounded to float32 the way librosa does, so the
matrix equals librosa's bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from voxcast.audio.mel_filters import mel_filterbank

__all__ = ["MelConfig", "log_mel_spectrogram", "mel_filterbank"]


class MelConfig:
    """The front end's fixed parameters (documented constants of the official code)."""

    sample_rate = 24000
    n_fft = 1024
    hop = 256
    win = 1024
    n_mels = 128
    fmin = 0.0
    fmax = 12000.0


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
