"""The VoiceEncoder: the 256-d speaker embedding T3 is conditioned on, from 16 kHz reference audio.

A 40-bin power mel (16 kHz, n_fft 400, hop 160), cut into 160-frame partials (a step of 77 frames:
Resemble's "rate" 1.3; the last partial kept when it covers 80 %), each through a 3-layer LSTM, a linear
projection, ReLU and L2 normalisation; the partials' mean, normalised again. Leading and trailing
silence (20 dB under the loudest 2048-sample frame) is trimmed first. Every step is computed as the
official ``VoiceEncoder.embeds_from_wavs`` computes it (librosa's STFT, trim and mel filters redone in
numpy with the same operations and dtypes), so the embedding is the official one (tests/parity).
Module names follow ``ve.safetensors``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from scipy.signal import get_window
from torch import Tensor, nn

from voxcast.audio.mel_filters import mel_filterbank
from voxcast.errors import CheckpointError, InvalidRequest
from voxcast.models.chatterbox_turbo.state import check_state

__all__ = ["VE_FILE", "VoiceEncoder"]

VE_FILE = "ve.safetensors"
SAMPLE_RATE = 16000
N_MELS, N_FFT, HOP = 40, 400, 160
PARTIAL_FRAMES = 160
RATE = 1.3
MIN_COVERAGE = 0.8
BATCH = 32
TRIM_DB, TRIM_FRAME, TRIM_HOP = 20.0, 2048, 512
#: Tensors of ``ve.safetensors`` inference never reads (its training loss's scale and offset).
_UNUSED = ("similarity_weight", "similarity_bias")


def trim_silence(wav: np.ndarray) -> np.ndarray:
    """``librosa.effects.trim(wav, top_db=20)``: drop leading and trailing frames more than 20 dB
    below the loudest (RMS of 2048-sample frames every 512, zero-padded at the ends)."""
    pad = TRIM_FRAME // 2
    padded = np.pad(wav, (pad, pad), mode="constant")
    frames = np.lib.stride_tricks.sliding_window_view(padded, TRIM_FRAME)[::TRIM_HOP]
    rms = np.sqrt(np.mean(np.square(frames), axis=-1))
    magnitude = np.abs(rms)
    ref = np.max(magnitude)
    amin = 1e-10
    db = 10.0 * np.log10(np.maximum(amin, np.square(magnitude)))
    db -= 10.0 * np.log10(np.maximum(amin, ref**2))
    loud = np.flatnonzero(db > -TRIM_DB)
    if loud.size == 0:
        return wav[:0]
    return wav[int(loud[0]) * TRIM_HOP : min(wav.shape[-1], (int(loud[-1]) + 1) * TRIM_HOP)]


_WINDOW = get_window("hann", N_FFT, fftbins=True)  # float64, as librosa multiplies the frames
_FILTERS = mel_filterbank(SAMPLE_RATE, N_FFT, N_MELS, 0.0, 8000.0)


def power_mel(wav: np.ndarray) -> np.ndarray:
    """The encoder's mel ``[T, 40]`` of float32 16 kHz audio: librosa's centred STFT (reflect padding),
    squared magnitudes, the Slaney mel filters."""
    pad = N_FFT // 2
    padded = np.pad(wav, (pad, pad), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP].T  # [n_fft, T]
    spec = np.fft.rfft(_WINDOW[:, None] * frames, axis=0).astype(np.complex64)
    power = np.abs(spec)
    power **= 2
    return np.dot(_FILTERS, power).T


def partial_count(frames: int, step: int) -> tuple[int, int]:
    """(partials, frames they span) for a mel of ``frames`` frames."""
    n, remainder = divmod(max(frames - PARTIAL_FRAMES + step, 0), step)
    if n == 0 or (remainder + (PARTIAL_FRAMES - step)) / PARTIAL_FRAMES >= MIN_COVERAGE:
        n += 1
    return n, PARTIAL_FRAMES + step * (n - 1)


class VoiceEncoder(nn.Module):
    def __init__(self, hidden: int = 256, embed: int = 256) -> None:
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, hidden, num_layers=3, batch_first=True)
        self.proj = nn.Linear(hidden, embed)

    def forward(self, mels: Tensor) -> Tensor:
        """L2-normalised embeddings ``[B, 256]`` of partials ``[B, 160, 40]``."""
        _, (hidden, _) = self.lstm(mels)
        raw = F.relu(self.proj(hidden[-1]))
        return raw / torch.linalg.norm(raw, dim=1, keepdim=True)

    @torch.inference_mode()
    def embed(self, wav: np.ndarray) -> Tensor:
        """The speaker embedding ``[1, 256]`` of float32 mono 16 kHz audio.

        Raises:
            InvalidRequest: nothing is left once silence is trimmed (field ``ref_audio``).
        """
        trimmed = trim_silence(np.asarray(wav, dtype=np.float32))
        if trimmed.shape[-1] <= N_FFT // 2 or not np.any(trimmed):
            raise InvalidRequest("the reference audio is silent", field="ref_audio")
        mel = torch.as_tensor(power_mel(trimmed))
        step = int(np.round((SAMPLE_RATE / RATE) / PARTIAL_FRAMES))
        n, span = partial_count(mel.shape[0], step)
        if span > mel.shape[0]:
            mel = torch.cat((mel, torch.zeros(span - mel.shape[0], N_MELS)))
        device = self.proj.weight.device
        partials = torch.stack([mel[i * step : i * step + PARTIAL_FRAMES] for i in range(n)]).to(device)
        chunks = int(np.ceil(len(partials) / BATCH))
        embeds = torch.cat([self(batch) for batch in partials.chunk(chunks)], dim=0).cpu()
        raw = torch.mean(embeds, dim=0)[None]
        return raw / torch.linalg.norm(raw, dim=1, keepdim=True)

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor]) -> VoiceEncoder:
        """The encoder from ``ve.safetensors``' tensors.

        Raises:
            CheckpointError: tensors missing or of the wrong shape.
        """
        state = {k: v for k, v in tensors.items() if k not in _UNUSED}
        try:
            hidden, embed = int(state["proj.weight"].shape[1]), int(state["proj.weight"].shape[0])
        except KeyError as e:
            raise CheckpointError(f"not a VoiceEncoder state: {e} is missing") from e
        model = cls(hidden, embed)
        check_state(model, state, "not a VoiceEncoder state")
        model.load_state_dict(state, strict=True)
        return model.eval().requires_grad_(False)
