"""S3Gen's audio front end for a voice's prompt: the 80-bin log mel of 24 kHz audio (Matcha-TTS's
``mel_spectrogram`` with CosyVoice's settings) and the 24 -> 16 kHz resampling S3Gen applies before its
speaker encoder and tokenizer (``torchaudio.transforms.Resample``: a windowed-sinc polyphase filter).

Both are computed as the official code computes them (the same operations and dtypes; librosa's mel
filters from :mod:`voxcast.audio.mel_filters`), without librosa or torchaudio at run time.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from voxcast.audio.mel_filters import mel_filterbank

__all__ = ["MEL_HOP", "S3GEN_RATE", "mel_24k", "resample_sinc"]

S3GEN_RATE = 24000
N_FFT, N_MELS, MEL_HOP, WIN, FMIN, FMAX = 1920, 80, 480, 1920, 0.0, 8000.0


@lru_cache(maxsize=4)
def _mel_basis(device: str) -> tuple[Tensor, Tensor]:
    basis = torch.from_numpy(mel_filterbank(S3GEN_RATE, N_FFT, N_MELS, FMIN, FMAX)).float().to(device)
    return basis, torch.hann_window(WIN).to(device)


def mel_24k(wav: Tensor) -> Tensor:
    """``[B, 80, frames]`` log mel of 24 kHz float audio ``wav [B, L]`` or ``[L]``: one frame per 480
    samples (reflect padding of 720 each side, no centring), magnitude with 1e-9 under the root,
    ``log(clamp(mel, 1e-5))``."""
    if wav.dim() == 1:
        wav = wav[None]
    basis, window = _mel_basis(str(wav.device))
    pad = (N_FFT - MEL_HOP) // 2
    y = F.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.view_as_real(
        torch.stft(
            y, N_FFT, hop_length=MEL_HOP, win_length=WIN, window=window, center=False,
            pad_mode="reflect", normalized=False, onesided=True, return_complex=True,
        )
    )  # fmt: skip
    spec = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(basis, spec), min=1e-5))


@lru_cache(maxsize=8)
def _sinc_kernel(orig: int, new: int, device: str) -> tuple[Tensor, int]:
    """torchaudio's ``sinc_interp_hann`` kernel (lowpass width 6, rolloff 0.99), in float64 then
    rounded to float32 as ``transforms.Resample`` stores it; rates already divided by their gcd."""
    width_zeros, rolloff = 6, 0.99
    base = min(orig, new) * rolloff
    width = math.ceil(width_zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64, device=device)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=torch.float64, device=device)[:, None, None] / new + idx
    t *= base
    t = t.clamp_(-width_zeros, width_zeros)
    window = torch.cos(t * math.pi / width_zeros / 2) ** 2
    t *= math.pi
    kernel = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernel *= window * (base / orig)
    return kernel.to(torch.float32), width


def resample_sinc(wav: Tensor, sr_in: int, sr_out: int) -> Tensor:
    """``torchaudio.transforms.Resample(sr_in, sr_out)(wav)`` for float ``wav [..., L]``."""
    if sr_in == sr_out:
        return wav
    gcd = math.gcd(sr_in, sr_out)
    orig, new = sr_in // gcd, sr_out // gcd
    kernel, width = _sinc_kernel(orig, new, str(wav.device))
    shape = wav.shape
    x = wav.reshape(-1, shape[-1])
    n, length = x.shape
    x = F.pad(x, (width, width + orig))
    out = F.conv1d(x[:, None], kernel.to(x.dtype), stride=orig).transpose(1, 2).reshape(n, -1)
    out = out[..., : math.ceil(new * length / orig)]
    return out.reshape(*shape[:-1], out.shape[-1])
