"""CAMPPlus: the 192-d x-vector S3Gen's flow is conditioned on, from 16 kHz reference audio.

Kaldi's 80-bin log mel filterbank (25 ms povey windows every 10 ms, edges snipped, DC offset removed,
pre-emphasis 0.97, a 512-point FFT, Kaldi's mel scale from 20 Hz to 8 kHz, no dither), its mean over
time subtracted, then 3D-Speaker's CAM++: a 2-D ResNet front end over frequency (``head``), a densely
connected TDNN with context-aware masking, statistics pooling (mean and std over time) and a dense
layer (``xvector``). Every step is computed as the official ``CAMPPlus.inference`` computes it
(``torchaudio.compliance.kaldi.fbank`` redone with the same torch operations and dtypes, without
torchaudio), so the x-vector is the official one (tests/parity). Module names follow the
``speaker_encoder.`` tensors of ``s3gen_meanflow.safetensors``; upstream builds CAMPPlus with its
defaults, so there is one size.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.errors import InvalidRequest
from voxcast.models.chatterbox_turbo.state import check_state

__all__ = ["EMBED_DIM", "MIN_SAMPLES", "CAMPPlus", "kaldi_fbank"]

SAMPLE_RATE = 16000
N_MELS = 80
FRAME, SHIFT, N_FFT = 400, 160, 512  # 25 ms, 10 ms, rounded up to a power of two
PREEMPHASIS = 0.97
LOW_FREQ = 20.0
EMBED_DIM = 192
#: Kaldi's floor under each mel energy (``numeric_limits<float>::epsilon()``).
EPSILON = torch.finfo(torch.float32).eps
#: The shortest audio with a finite x-vector: 3 frames. Upstream asserts under 400 samples (one
#: frame) and returns NaN under 720 (the strided TDNN leaves one step, whose std is undefined).
MIN_SAMPLES = FRAME + 2 * SHIFT
#: (layers, kernel, dilation) of the three dense TDNN blocks.
BLOCKS = ((12, 3, 1), (24, 3, 2), (16, 3, 2))
GROWTH, BN_SIZE, INIT_CHANNELS = 32, 4, 128
SEG_LEN = 100  # CAM's segment pooling, in steps


@lru_cache(maxsize=1)
def _mel_banks() -> Tensor:
    """Kaldi's triangular mel filters ``[80, 257]`` (``torchaudio.compliance.kaldi.get_mel_banks``
    with the same float32 operations, the Nyquist column padded with zero)."""

    def mel_scale(hz: float) -> float:
        return 1127.0 * math.log(1.0 + hz / 700.0)

    mel_low, mel_high = mel_scale(LOW_FREQ), mel_scale(0.5 * SAMPLE_RATE)
    delta = (mel_high - mel_low) / (N_MELS + 1)
    bins = torch.arange(N_MELS).unsqueeze(1)
    left = mel_low + bins * delta  # [80, 1] float32
    center = mel_low + (bins + 1.0) * delta
    right = mel_low + (bins + 2.0) * delta
    freq = SAMPLE_RATE / N_FFT * torch.arange(N_FFT / 2)
    mel = (1127.0 * (1.0 + freq / 700.0).log()).unsqueeze(0)  # [1, 256]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    return F.pad(torch.max(torch.zeros(1), torch.min(up, down)), (0, 1), mode="constant", value=0)


@lru_cache(maxsize=4)
def _povey_window(device: torch.device) -> Tensor:
    return torch.hann_window(FRAME, periodic=False, device=device, dtype=torch.float32).pow(0.85)


def kaldi_fbank(wav: Tensor) -> Tensor:
    """``torchaudio.compliance.kaldi.fbank(wav[None], num_mel_bins=80)`` ``[T, 80]`` of float32 16 kHz
    audio ``[L]`` (L >= 400; T = 1 + (L - 400) // 160)."""
    wav = wav.contiguous()
    count = 1 + (wav.shape[0] - FRAME) // SHIFT
    frames = wav.as_strided((count, FRAME), (SHIFT, 1))  # [T, 400]
    frames = frames - torch.mean(frames, dim=1).unsqueeze(1)
    previous = F.pad(frames.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)
    frames = frames - PREEMPHASIS * previous[:, :-1]
    frames = frames * _povey_window(wav.device).unsqueeze(0)
    frames = F.pad(frames.unsqueeze(0), (0, N_FFT - FRAME), mode="constant", value=0).squeeze(0)
    power = torch.fft.rfft(frames).abs().pow(2.0)  # [T, 257]
    mel = torch.mm(power, _mel_banks().to(device=wav.device).T)
    return torch.clamp_min(mel, EPSILON).log()


def _bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(channels), relu=nn.ReLU()))


class BasicResBlock(nn.Module):
    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels_in != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels, 1, stride=(stride, 1), bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out)


class FCM(nn.Module):
    """The 2-D front end: frequency strided by 8, channels folded into features ``[B, 320, T]``."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(
            BasicResBlock(channels, channels, 2), BasicResBlock(channels, channels, 1)
        )
        self.layer2 = nn.Sequential(
            BasicResBlock(channels, channels, 2), BasicResBlock(channels, channels, 1)
        )
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))  # [B, 32, 80, T]
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)))  # [B, 32, 10, T]
        return out.reshape(out.shape[0], out.shape[1] * out.shape[2], out.shape[3])


class TDNNLayer(nn.Module):
    def __init__(self, channels_in: int, channels: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(channels_in, channels, 5, stride=2, padding=2, bias=False)
        self.nonlinear = _bn_relu(channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.nonlinear(self.linear(x))


class CAMLayer(nn.Module):
    """A dilated convolution masked by a context (the utterance's mean plus its 100-step segment's)."""

    def __init__(self, channels_in: int, channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        padding = (kernel - 1) // 2 * dilation
        self.linear_local = nn.Conv1d(
            channels_in, channels, kernel, padding=padding, dilation=dilation, bias=False
        )
        self.linear1 = nn.Conv1d(channels_in, channels_in // 2, 1)
        self.linear2 = nn.Conv1d(channels_in // 2, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = self.linear_local(x)
        seg = F.avg_pool1d(x, kernel_size=SEG_LEN, stride=SEG_LEN, ceil_mode=True)  # [B, C, S]
        seg = seg.unsqueeze(-1).expand(*seg.shape, SEG_LEN).reshape(*seg.shape[:-1], -1)[..., : x.shape[-1]]
        context = F.relu(self.linear1(x.mean(-1, keepdim=True) + seg))
        return y * torch.sigmoid(self.linear2(context))


class CAMDenseTDNNLayer(nn.Module):
    def __init__(self, channels_in: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.nonlinear1 = _bn_relu(channels_in)
        self.linear1 = nn.Conv1d(channels_in, BN_SIZE * GROWTH, 1, bias=False)
        self.nonlinear2 = _bn_relu(BN_SIZE * GROWTH)
        self.cam_layer = CAMLayer(BN_SIZE * GROWTH, GROWTH, kernel, dilation)

    def forward(self, x: Tensor) -> Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class CAMDenseTDNNBlock(nn.ModuleList):
    """Dense connections: each layer's 32 channels are appended to its input."""

    def __init__(self, layers: int, channels_in: int, kernel: int, dilation: int) -> None:
        super().__init__()
        for i in range(layers):
            self.add_module(f"tdnnd{i + 1}", CAMDenseTDNNLayer(channels_in + i * GROWTH, kernel, dilation))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class TransitLayer(nn.Module):
    def __init__(self, channels_in: int, channels: int) -> None:
        super().__init__()
        self.nonlinear = _bn_relu(channels_in)
        self.linear = nn.Conv1d(channels_in, channels, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.nonlinear(x))


class StatsPool(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        """``[B, 2C]``: the mean and the (unbiased) std over time of ``[B, C, T]``."""
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)


class DenseLayer(nn.Module):
    def __init__(self, channels_in: int, channels: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(channels_in, channels, 1, bias=False)
        self.nonlinear = nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(channels, affine=False)))

    def forward(self, x: Tensor) -> Tensor:
        return self.nonlinear(self.linear(x.unsqueeze(dim=-1)).squeeze(dim=-1))


class CAMPPlus(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = FCM()
        channels = INIT_CHANNELS
        layers: OrderedDict[str, nn.Module] = OrderedDict(tdnn=TDNNLayer(32 * (N_MELS // 8), channels))
        for i, (n, kernel, dilation) in enumerate(BLOCKS, start=1):
            layers[f"block{i}"] = CAMDenseTDNNBlock(n, channels, kernel, dilation)
            channels += n * GROWTH
            layers[f"transit{i}"] = TransitLayer(channels, channels // 2)
            channels //= 2
        layers["out_nonlinear"] = _bn_relu(channels)
        layers["stats"] = StatsPool()
        layers["dense"] = DenseLayer(2 * channels, EMBED_DIM)
        self.xvector = nn.Sequential(layers)

    def forward(self, feats: Tensor) -> Tensor:
        """x-vectors ``[B, 192]`` of mean-normalised fbank features ``[B, T, 80]``."""
        return self.xvector(self.head(feats.permute(0, 2, 1)))

    @torch.inference_mode()
    def embed(self, wav: np.ndarray | Tensor) -> Tensor:
        """The x-vector ``[1, 192]`` (on the model's device) of float32 mono 16 kHz audio ``[L]`` or
        ``[1, L]``: what S3Gen's ``embed_ref`` computes from its 16 kHz reference.

        Raises:
            InvalidRequest: not one channel, or shorter than :data:`MIN_SAMPLES` (field ``ref_audio``).
        """
        param = self.head.conv1.weight
        audio = torch.as_tensor(wav, dtype=torch.float32).to(param.device)
        if audio.dim() == 2 and audio.shape[0] == 1:
            audio = audio[0]
        if audio.dim() != 1:
            raise InvalidRequest(
                f"the reference audio must be mono, got shape {tuple(audio.shape)}", field="ref_audio"
            )
        if audio.shape[0] < MIN_SAMPLES:
            raise InvalidRequest(
                f"the reference audio is too short: {audio.shape[0]} samples, at least {MIN_SAMPLES}",
                field="ref_audio",
            )
        feats = kaldi_fbank(audio)
        feats = feats - feats.mean(dim=0, keepdim=True)
        return self(feats.unsqueeze(0).to(param.dtype))

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor], *, prefix: str = "speaker_encoder.") -> CAMPPlus:
        """CAMPPlus from a state (``s3gen_meanflow.safetensors``' tensors; keys under ``prefix``).

        Raises:
            CheckpointError: tensors missing, unexpected or of the wrong shape.
        """
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        with torch.device("meta"):
            model = cls()
        check_state(model, state, f"not a CAMPPlus state (tensors under {prefix!r})")
        model.load_state_dict(state, strict=True, assign=True)
        return model.eval().requires_grad_(False)
