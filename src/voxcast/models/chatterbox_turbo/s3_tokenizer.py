"""The S3 speech tokenizer (CosyVoice 2's ``speech_tokenizer_v2_25hz``): 16 kHz audio -> 25 speech tokens
a second from a vocabulary of 6561 (FSQ, 8 digits of base 3). Chatterbox Turbo uses it for the voice
prompt: T3's prompt tokens (the reference's first 15 s, at most 375 tokens) and S3Gen's (the first 10 s).

A 128-bin log-mel (n_fft 400, hop 160: 100 frames a second; Whisper's log scaling, clamped 8 decades
under the loudest bin), two stride-2 convolutions (25 frames a second), 6 blocks of attention with
rotary positions (heads of 64) and an FSMN memory (a depthwise convolution of 31 over the values), then
the FSQ code: ``round(0.999 * tanh(W x + b)) + 1`` read as 8 base-3 digits. Every step is computed as the
official chatterbox-tts 0.1.7 ``S3Tokenizer.forward`` (``s3tokenizer.model_v2.S3TokenizerV2``) computes
it for one reference, so the tokens are the official ones (tests/parity). Module names follow the
``tokenizer.`` tensors of ``s3gen_meanflow.safetensors``; the mel filters are librosa's Slaney filters
(:mod:`voxcast.audio.mel_filters`), and the checkpoint's own ``_mel_filters`` and ``window`` are used
where it carries them, as upstream does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.audio.mel_filters import mel_filterbank
from voxcast.errors import CheckpointError, InvalidRequest
from voxcast.models.chatterbox_turbo.state import check_state, read_state

__all__ = ["S3GEN_FILE", "S3Tokenizer", "S3TokenizerConfig", "load_s3_tokenizer"]

log = logging.getLogger(__name__)

S3GEN_FILE = "s3gen_meanflow.safetensors"
SAMPLE_RATE = 16000
N_FFT, HOP = 400, 160
#: Mel frames (100 a second) per token (25 a second): two stride-2 convolutions.
MELS_PER_TOKEN = 4
VOCAB = 3**8
#: Upstream's rotary table is built for heads of 64 and 2048 positions (82 s of tokens).
HEAD_DIM, ROTARY_POSITIONS = 64, 2048
FSMN_KERNEL = 31
#: Beyond 30 s of mel frames upstream tokenizes overlapping 30 s windows and merges them; voxcast
#: refuses such a reference instead (chatterbox never gives it more than 15 s).
MAX_FRAMES = 3000


@dataclass(frozen=True)
class S3TokenizerConfig:
    """The sizes a checkpoint fixes (upstream builds 128 mels, width 1280, 6 layers whatever it is given)."""

    mels: int = 128
    width: int = 1280
    layers: int = 6

    @property
    def heads(self) -> int:
        return self.width // HEAD_DIM

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor]) -> S3TokenizerConfig:
        """Sizes read from a ``tokenizer.``-less state.

        Raises:
            CheckpointError: ``encoder.conv1.weight`` missing, or a width that is not heads of 64.
        """
        try:
            width, mels, _ = tensors["encoder.conv1.weight"].shape
        except KeyError as e:
            raise CheckpointError(f"not an S3 tokenizer state: {e} is missing") from e
        if width % HEAD_DIM:
            raise CheckpointError(f"S3 tokenizer width {width} is not a multiple of {HEAD_DIM}")
        layers = len({k.split(".")[2] for k in tensors if k.startswith("encoder.blocks.")})
        return cls(mels=int(mels), width=int(width), layers=layers)


def default_buffers(mels: int) -> dict[str, Tensor]:
    """The ``_mel_filters`` and ``window`` upstream computes at init (librosa's filters, a Hann window)."""
    return {
        "_mel_filters": torch.from_numpy(mel_filterbank(SAMPLE_RATE, N_FFT, mels, 0.0, SAMPLE_RATE / 2)),
        "window": torch.hann_window(N_FFT, device="cpu"),
    }


def rotary_table(positions: int) -> tuple[Tensor, Tensor]:
    """Upstream's ``precompute_freqs_cis(64, positions)`` as cos and sin ``[positions, 64]``."""
    freqs = 1.0 / (
        10000.0 ** (torch.arange(0, HEAD_DIM, 2, device="cpu")[: HEAD_DIM // 2].float() / HEAD_DIM)
    )
    t = torch.arange(positions, device="cpu")
    freqs = torch.outer(t, freqs).float()
    table = torch.view_as_real(torch.polar(torch.ones_like(freqs), freqs))  # [P, 32, 2]
    cos, sin = table[..., 0], table[..., 1]
    return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of ``x [B, T, H, 64]`` (halves rotated, upstream's ``apply_rotary_emb``)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FSMNAttention(nn.Module):
    """Self-attention (q and k each scaled by ``d ** -0.25``) plus the FSMN memory of the values."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)
        self.key = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.fsmn_block = nn.Conv1d(width, width, FSMN_KERNEL, groups=width, bias=False)

    def memory(self, v: Tensor) -> Tensor:
        """``v [B, T, D]`` plus its depthwise convolution (zero-padded 15 each side)."""
        x = F.pad(v.transpose(1, 2), ((FSMN_KERNEL - 1) // 2, FSMN_KERNEL // 2))
        x = self.fsmn_block(x).transpose(1, 2)
        x += v
        return x

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, t, d = x.shape
        scale = (d // self.heads) ** -0.25
        q = self.query(x).view(b, t, self.heads, -1)  # [B, T, H, 64]
        k = self.key(x).view(b, t, self.heads, -1)
        v = self.value(x).view(b, t, self.heads, -1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        memory = self.memory(v.view(b, t, -1))
        q = q.permute(0, 2, 1, 3) * scale  # [B, H, T, 64]
        k = k.permute(0, 2, 3, 1) * scale  # [B, H, 64, T]
        w = torch.softmax(q @ k, dim=-1)
        out = (w @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3).flatten(start_dim=2)
        return self.out(out) + memory


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = FSMNAttention(width, heads)
        self.attn_ln = nn.LayerNorm(width, eps=1e-5)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.mlp_ln = nn.LayerNorm(width)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attn(self.attn_ln(x), cos, sin)
        return x + self.mlp(self.mlp_ln(x))


class Encoder(nn.Module):
    def __init__(self, cfg: S3TokenizerConfig) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(cfg.mels, cfg.width, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(cfg.width, cfg.width, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList(Block(cfg.width, cfg.heads) for _ in range(cfg.layers))

    def forward(self, mel: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Hidden states ``[B, ceil(T / 4), width]`` of a log-mel ``[B, mels, T]``."""
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1)
        t = x.shape[1]
        cos, sin = cos[None, :t, None], sin[None, :t, None]  # [1, T, 1, 64]
        for block in self.blocks:
            x = block(x, cos, sin)
        return x


class Codebook(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.project_down = nn.Linear(width, 8)

    def forward(self, x: Tensor) -> Tensor:
        """Token ids ``[B, T]`` (int64) of hidden states ``[B, T, width]``."""
        h = self.project_down(x).float().tanh()
        h = (h * 0.9990000128746033).round() + 1  # digits 0, 1, 2
        powers = torch.pow(3, torch.arange(8, device=x.device, dtype=h.dtype))
        return torch.sum(h * powers, dim=-1).int().long()


class Quantizer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self._codebook = Codebook(width)


class S3Tokenizer(nn.Module):
    """16 kHz audio -> speech tokens; ``tokenizer.`` of ``s3gen_meanflow.safetensors`` loads strictly."""

    _mel_filters: Tensor  # [mels, 201]
    window: Tensor  # [400]
    rotary_cos: Tensor  # [2048, 64]
    rotary_sin: Tensor

    def __init__(self, cfg: S3TokenizerConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or S3TokenizerConfig()
        for name, value in default_buffers(cfg.mels).items():
            self.register_buffer(name, value)
        self.encoder = Encoder(cfg)
        self.quantizer = Quantizer(cfg.width)
        cos, sin = rotary_table(ROTARY_POSITIONS)
        self.register_buffer("rotary_cos", cos, persistent=False)
        self.register_buffer("rotary_sin", sin, persistent=False)

    def log_mel(self, wav: Tensor) -> Tensor:
        """Log-mel ``[1, mels, len // 160]`` of float32 audio ``[1, len]`` (centred STFT with reflect
        padding, its last frame dropped; log10 clamped 8 under the maximum, then ``(x + 4) / 4``)."""
        stft = torch.stft(wav, N_FFT, HOP, window=self.window, return_complex=True)
        power = stft[..., :-1].abs() ** 2
        log_spec = torch.clamp(self._mel_filters @ power, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0

    @torch.inference_mode()
    def tokens(self, wav_16k: np.ndarray | Tensor, max_len: int | None = None) -> Tensor:
        """Speech tokens ``[1, T]`` (int64, 25 a second: ``ceil((len // 160) / 4)``) of mono 16 kHz
        audio, as the official ``S3Tokenizer.forward([wav], max_len=max_len)`` gives them. ``max_len``:
        at most this many tokens (the log-mel is computed over the whole audio, then cut).

        Raises:
            InvalidRequest: not mono, under 201 samples (one STFT frame), not finite, or over 30 s
                once cut to ``max_len`` (field ``ref_audio``).
        """
        wav = _check_audio(wav_16k).to(self.window.device)
        mel = self.log_mel(wav[None])
        if max_len is not None:
            if max_len < 1:
                raise ValueError(f"max_len must be positive, not {max_len}")
            mel = mel[..., : max_len * MELS_PER_TOKEN]
        if mel.shape[-1] > MAX_FRAMES:
            raise InvalidRequest(
                f"the reference audio is longer than {MAX_FRAMES // 100} s: cut it first", field="ref_audio"
            )
        hidden = self.encoder(mel, self.rotary_cos, self.rotary_sin)
        return self.quantizer._codebook(hidden)

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor], *, prefix: str = "tokenizer.") -> S3Tokenizer:
        """The tokenizer from a state (``s3gen_meanflow.safetensors``' tensors; keys under ``prefix``).
        ``_mel_filters`` and ``window`` are taken from the state when it has them, else computed.

        Raises:
            CheckpointError: tensors missing, unexpected or of the wrong shape.
        """
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        cfg = S3TokenizerConfig.from_tensors(state)
        state = {**default_buffers(cfg.mels), **state}
        with torch.device("meta"):
            model = cls(cfg)
        check_state(model, state, "not an S3 tokenizer state")
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True, assign=True)
        return model.eval().requires_grad_(False)


def _check_audio(wav: np.ndarray | Tensor) -> Tensor:
    """Float32 audio ``[len]`` (``[1, len]`` is squeezed); :class:`InvalidRequest` (``ref_audio``) if bad."""
    x = torch.as_tensor(np.asarray(wav) if not isinstance(wav, Tensor) else wav)
    if x.dim() == 2 and x.shape[0] == 1:
        x = x[0]
    if x.dim() != 1:
        raise InvalidRequest(
            f"the reference audio must be mono, not of shape {tuple(x.shape)}", field="ref_audio"
        )
    if not x.is_floating_point():
        raise InvalidRequest(f"the reference audio must be float samples, not {x.dtype}", field="ref_audio")
    if x.shape[0] <= N_FFT // 2:
        raise InvalidRequest(f"the reference audio is too short ({x.shape[0]} samples)", field="ref_audio")
    x = x.float()
    if not bool(torch.isfinite(x).all()):
        raise InvalidRequest("the reference audio has non-finite samples", field="ref_audio")
    return x


def load_s3_tokenizer(directory: str | Path, *, device: str | torch.device = "cpu") -> S3Tokenizer:
    """The S3 tokenizer from a Chatterbox Turbo checkpoint folder (the ``tokenizer.`` tensors of
    ``s3gen_meanflow.safetensors``; only those are read).

    Raises:
        CheckpointError: the file is missing or unreadable, or its tensors do not make a tokenizer.
    """
    path = Path(directory) / S3GEN_FILE
    state = read_state(path, "tokenizer.")
    model = S3Tokenizer.from_tensors(state).to(device)
    log.info("loaded the S3 tokenizer from %s (%d layers, width %d)", path, model.cfg.layers, model.cfg.width)
    return model
