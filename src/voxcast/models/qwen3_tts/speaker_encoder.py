"""The ECAPA-TDNN speaker encoder of Qwen3-TTS Base models (reference audio -> x-vector).

The x-vector goes unprojected into the talker's speaker slot, so its size (``enc_dim``) equals the
talker width (1024 for 0.6B, 2048 for 1.7B). Parameter names equal the ``speaker_encoder.*`` keys
of the main ``model.safetensors`` (minus that prefix). Every convolution pads "same" with reflection,
like the official model. Architecture: TDNN -> 3 SE-Res2Net blocks -> multi-layer feature
aggregation -> attentive statistics pooling -> 1x1 conv (https://arxiv.org/abs/2005.07143).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from voxcast.kernels.rows_linear import set_flags

from .config import SpeakerEncoderConfig
from .mel import MelConfig, log_mel_spectrogram

__all__ = [
    "SpeakerEncoder",
    "SpeakerEncoderConfig",
    "extract_xvector",
]


def _conv(cin: int, cout: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


def _apply_conv(conv: nn.Conv1d, x: Tensor, gemm: bool) -> Tensor:
    """``conv(x)``; with ``gemm``, for one clip, as one matrix product (on an im2col copy for kernel
    > 1): not bitwise ``conv(x)``, so only where the model is not bit-exact anyway (int8 weights).

    PyTorch sends a convolution this small (64 channels x ~300 frames) to its reference kernel, and
    a dilated one (the Res2Net blocks') to ``slow_conv_dilated2d``, which loops over channels; and it
    copies the input to "pad" a kernel-1 convolution by nothing. Same padding as ``conv`` ("same",
    reflect); sums in another order (within 1e-6 of ``conv``).
    """
    if not gemm or x.shape[0] != 1 or conv.groups != 1 or conv.bias is None:
        return conv(x)
    k, d = conv.kernel_size[0], conv.dilation[0]
    weight = conv.weight.reshape(conv.out_channels, -1)  # [C_out, C_in * k]
    if k == 1:
        return torch.addmm(conv.bias[:, None], weight, x[0])[None]
    total = d * (k - 1)
    padded = nn.functional.pad(x, (total // 2, total - total // 2), mode="reflect")  # [1, C, T + total]
    cols = padded[0].unfold(1, total + 1, 1)[..., ::d]  # [C, T, k]
    cols = cols.permute(0, 2, 1).reshape(-1, x.shape[2])  # [C * k, T], row c * k + j
    return torch.addmm(conv.bias[:, None], weight, cols)[None]


class TDNNBlock(nn.Module):
    """Conv1d ("same", reflect) + ReLU."""

    gemm: bool = False  # convolutions as matrix products (SpeakerEncoder.use_gemm_convs)

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)
        self.activation = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(_apply_conv(self.conv, x, self.gemm))


class Res2NetBlock(nn.Module):
    """Split channels into ``scale`` parts; part i>0 goes through a TDNN after adding part i-1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        width = channels // scale
        self.blocks = nn.ModuleList([TDNNBlock(width, width, kernel, dilation) for _ in range(scale - 1)])
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        for i in range(1, self.scale):
            inp = parts[i] if i == 1 else parts[i] + outs[-1]
            outs.append(self.blocks[i - 1](inp))
        return torch.cat(outs, dim=1)


class SEBlock(nn.Module):
    """Squeeze-excitation: channel gates from the time-mean."""

    gemm: bool = False  # convolutions as matrix products (SpeakerEncoder.use_gemm_convs)

    def __init__(self, channels: int, se_channels: int):
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.relu = nn.ReLU()
        self.conv2 = _conv(se_channels, channels)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        s = self.relu(_apply_conv(self.conv1, x.mean(dim=2, keepdim=True), self.gemm))
        return x * self.sigmoid(_apply_conv(self.conv2, s, self.gemm))


class SERes2NetBlock(nn.Module):
    """TDNN k1 -> Res2Net -> TDNN k1 -> SE, residual."""

    def __init__(self, cin: int, cout: int, scale: int, se: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNNBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(cout, cout, 1, 1)
        self.se_block = SEBlock(cout, se)

    def forward(self, x: Tensor) -> Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _mean_std(x: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """Weighted mean and std over time; w sums to 1 over dim 2."""
    mean = (w * x).sum(2)
    std = torch.sqrt((w * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))
    return mean, std


class AttentiveStatsPool(nn.Module):
    """Attention over time using global context (mean, std); returns [mean; std] of shape [B, 2C, 1]."""

    gemm: bool = False  # convolutions as matrix products (SpeakerEncoder.use_gemm_convs)

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.tanh = nn.Tanh()
        self.conv = _conv(attention_channels, channels)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T]
        t = x.shape[-1]
        uniform = torch.ones(x.shape[0], 1, t, dtype=x.dtype, device=x.device) / t
        mean, std = _mean_std(x, uniform)
        ctx = torch.cat([x, mean.unsqueeze(2).expand(-1, -1, t), std.unsqueeze(2).expand(-1, -1, t)], 1)
        attn = torch.softmax(_apply_conv(self.conv, self.tanh(self.tdnn(ctx)), self.gemm), dim=2)
        mean, std = _mean_std(x, attn)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: log-mel frames [B, T, mel_dim] -> x-vectors [B, enc_dim]."""

    gemm: bool = False  # see use_gemm_convs

    def __init__(self, cfg: SpeakerEncoderConfig):
        super().__init__()
        self.config = cfg
        ch, ks, dil = cfg.enc_channels, cfg.enc_kernel_sizes, cfg.enc_dilations
        blocks: list[nn.Module] = [TDNNBlock(cfg.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(
                SERes2NetBlock(ch[i - 1], ch[i], cfg.enc_res2net_scale, cfg.enc_se_channels, ks[i], dil[i])
            )
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, cfg.enc_dim)

    def use_gemm_convs(self, on: bool) -> None:
        """Run one clip's convolutions as matrix products (0.79-0.85x the x-vector's time on an AMD
        Zen 3; within ~1e-6, not bitwise the official model's x-vector)."""
        set_flags(self, "gemm", on)

    def forward(self, mels: Tensor) -> Tensor:  # mels: [B, T, mel_dim]
        h = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            h = block(h)
            outs.append(h)
        h = self.mfa(torch.cat(outs[1:], dim=1))
        return _apply_conv(self.fc, self.asp(h), self.gemm).squeeze(-1)


@torch.inference_mode()
def extract_xvector(encoder: SpeakerEncoder, audio: np.ndarray) -> Tensor:
    """The speaker embedding of one clip, as the official ``extract_speaker_embedding``.

    Args:
        encoder: a loaded :class:`SpeakerEncoder`.
        audio: float32 mono waveform at 24 kHz, at least ~0.02 s long.

    Returns:
        float32 tensor [enc_dim] on the CPU.
    """
    p = next(encoder.parameters())
    wav = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))[None]  # [1, L]
    mels = log_mel_spectrogram(wav, MelConfig).transpose(1, 2)  # [1, frames, 128]
    xvec = encoder(mels.to(device=p.device, dtype=p.dtype))[0]
    return xvec.to(device="cpu", dtype=torch.float32)
