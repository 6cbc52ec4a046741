"""HiFT, S3Gen's vocoder: an 80-bin mel at 50 frames a second -> 24 kHz audio (480 samples a frame).

HiFTNet (neural source filter + iSTFTNet): an F0 predictor (five k=3 convolutions) gives a pitch per
mel frame; a sine source (F0 and 8 harmonics, random harmonic phases, noise) is built at the output
rate; the filter upsamples the mel (x8, x5, x3 transposed convolutions with Snake residual blocks, the
source's STFT mixed in at each scale) to an n_fft 16 / hop 4 spectrum that an inverse STFT turns into
audio. Module names follow the official ``mel2wav`` of ``s3gen_meanflow.safetensors``; the checkpoint's
weight-normalised weights are folded once at load (``torch._weight_norm``, what the official
parametrisation computes at every call). :meth:`HiFT.inference` equals the official
``HiFTGenerator.inference`` for the same mel and seed (tests/parity).

The random parts (harmonic phases, noise) come from a generator passed in, drawn in the official order,
or from a :class:`SourceNoise` a stream pins once (:mod:`.hift_stream`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.signal import get_window
from torch import Tensor, nn

from voxcast.errors import CheckpointError
from voxcast.models.chatterbox_turbo.state import check_state

__all__ = ["HiFT", "HiFTConfig", "SourceNoise", "fold_weight_norm", "istft"]

SAMPLE_RATE = 24000
UPSAMPLE_RATES = (8, 5, 3)
UPSAMPLE_KERNELS = (16, 11, 7)
RESBLOCK_KERNELS = (3, 7, 11)
SOURCE_KERNELS = (7, 7, 11)
DILATIONS = (1, 3, 5)
N_FFT, HOP = 16, 4
HARMONICS = 8
SINE_AMP, NOISE_STD, VOICED_THRESHOLD = 0.1, 0.003, 10.0
AUDIO_LIMIT = 0.99
#: Output samples per mel frame: 8 * 5 * 3 * hop 4.
SAMPLES_PER_FRAME = int(np.prod(UPSAMPLE_RATES)) * HOP


@dataclass(frozen=True)
class HiFTConfig:
    """The widths a checkpoint fixes (the rest is the same for every published HiFT of S3Gen)."""

    mels: int = 80
    channels: int = 512
    f0_channels: int = 512

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor]) -> HiFTConfig:
        try:
            pre = tensors["conv_pre.weight"]
            f0 = tensors["f0_predictor.condnet.0.weight"]
        except KeyError as e:
            raise CheckpointError(f"not a HiFT state: {e} is missing") from e
        return cls(mels=int(pre.shape[1]), channels=int(pre.shape[0]), f0_channels=int(f0.shape[0]))


def fold_weight_norm(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``<m>.parametrizations.weight.original0/1`` (g, v) -> ``<m>.weight`` = ``torch._weight_norm(v, g, 0)``."""
    out: dict[str, Tensor] = {}
    suffix = ".parametrizations.weight.original"
    for key, value in tensors.items():
        if suffix not in key:
            out[key] = value
        elif key.endswith(suffix + "1"):
            base = key[: -len(suffix + "1")]
            g = tensors[base + suffix + "0"]
            out[base + ".weight"] = torch._weight_norm(value, g, 0)
    return out


def window_envelope(window: Tensor, frames: int) -> Tensor:
    """``[1, (frames - 1) * HOP]``: the overlap-added squared window an inverse STFT of ``frames`` frames
    divides by (``torch.istft``'s, centred), computed by the same operations."""
    n = N_FFT + HOP * (frames - 1)
    squared = window.pow(2).expand(1, frames, N_FFT)
    envelope = torch.ops.aten.unfold_backward(squared, [1, n], 1, N_FFT, HOP)
    return envelope[:, N_FFT // 2 : n - N_FFT // 2]


def istft(spectrum: Tensor, window: Tensor, envelope: Tensor | None = None) -> Tensor:
    """``torch.istft(spectrum, N_FFT, HOP, N_FFT, window=window)`` (centred, one-sided) by the same
    operations, bitwise, without its check that the window envelope is nowhere zero: that check reads
    a device value on the host (a sync per call on a GPU). A Hann window of N_FFT with hop N_FFT / 4
    never vanishes inside the centred span, so the check cannot fail here.

    Args:
        spectrum: ``[B, N_FFT // 2 + 1, frames]`` complex.
        window: ``[N_FFT]``.
        envelope: :func:`window_envelope` of ``window`` for ``frames`` (computed when None).

    Returns:
        ``[B, (frames - 1) * HOP]``.
    """
    frames = spectrum.shape[-1]
    n = N_FFT + HOP * (frames - 1)
    frames_t = torch.fft.irfft(spectrum.transpose(1, 2), N_FFT, dim=-1)  # [B, frames, N_FFT]
    y = torch.ops.aten.unfold_backward(
        frames_t * window.view(1, 1, N_FFT), [spectrum.shape[0], n], 1, N_FFT, HOP
    )
    env = window_envelope(window, frames) if envelope is None else envelope
    return y[:, N_FFT // 2 : n - N_FFT // 2] / env


class Snake(nn.Module):
    """``x + 1/a * sin(a x)^2`` per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        return x + (1.0 / (alpha + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


def _padding(kernel: int, dilation: int = 1) -> int:
    return (kernel * dilation - dilation) // 2


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=_padding(kernel, d)) for d in DILATIONS
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, padding=_padding(kernel)) for _ in DILATIONS
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in DILATIONS)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in DILATIONS)

    def forward(self, x: Tensor) -> Tensor:
        for c1, c2, a1, a2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = c2(a2(c1(a1(x)))) + x
        return x


class F0Predictor(nn.Module):
    """Pitch (Hz, >= 0) per mel frame: five k=3 convolutions with ELUs, then a linear layer."""

    def __init__(self, mels: int, channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            layers += [nn.Conv1d(mels if i == 0 else channels, channels, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, 1)

    def forward(self, mel: Tensor) -> Tensor:
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


@dataclass
class SourceNoise:
    """The source's random parts: harmonic phases ``[B, 9, 1]`` (the fundamental's 0) and unit noise
    ``[B, 9, samples]``."""

    phases: Tensor
    noise: Tensor

    @classmethod
    def draw(
        cls, batch: int, samples: int, generator: torch.Generator | None, device: torch.device
    ) -> SourceNoise:
        """Drawn as the official ``SineGen`` draws them (uniform phases, then normal noise)."""
        low, high = torch.tensor(-math.pi), torch.tensor(math.pi)
        rand = torch.rand((batch, HARMONICS + 1, 1), generator=generator, device=device)
        phases = low.to(device) + rand * (high - low).to(device)
        phases[:, 0, :] = 0
        noise = torch.randn((batch, HARMONICS + 1, samples), generator=generator, device=device)
        return cls(phases, noise)


class SourceModule(nn.Module):
    """The harmonic-plus-noise source (``m_source``): sines of F0 and its harmonics merged by a linear
    layer and tanh."""

    def __init__(self) -> None:
        super().__init__()
        self.l_linear = nn.Linear(HARMONICS + 1, 1)

    @staticmethod
    def harmonics(f0: Tensor) -> Tensor:
        """``[B, 9, samples]``: each harmonic's frequency in cycles per sample."""
        return torch.cat([f0 * (i + 1) / SAMPLE_RATE for i in range(HARMONICS + 1)], dim=1)

    def merge(self, f0: Tensor, cycles: Tensor, noise: SourceNoise) -> Tensor:
        """The source ``[B, 1, samples]`` from ``f0 [B, 1, samples]``, each harmonic's phase in cycles
        ``cycles [B, 9, samples]`` (the running sum of :meth:`harmonics`, mod 1) and the noise."""
        theta = 2 * np.pi * cycles
        sines = SINE_AMP * torch.sin(theta + noise.phases)
        uv = (f0 > VOICED_THRESHOLD).type(torch.float32)
        amp = uv * NOISE_STD + (1 - uv) * SINE_AMP / 3
        sines = sines * uv + amp * noise.noise
        return torch.tanh(self.l_linear(sines.transpose(1, 2))).transpose(1, 2)


class HiFT(nn.Module):
    window: Tensor

    def __init__(self, cfg: HiFTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c = cfg.channels
        self.m_source = SourceModule()
        self.f0_predictor = F0Predictor(cfg.mels, cfg.f0_channels)
        self.conv_pre = nn.Conv1d(cfg.mels, c, 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(c // 2**i, c // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(UPSAMPLE_RATES, UPSAMPLE_KERNELS, strict=True))
        )
        down = np.cumprod([1, *UPSAMPLE_RATES[::-1][:-1]])[::-1]
        self.source_downs = nn.ModuleList(
            nn.Conv1d(N_FFT + 2, c // 2 ** (i + 1), 1) if u == 1
            else nn.Conv1d(N_FFT + 2, c // 2 ** (i + 1), int(u) * 2, int(u), padding=int(u) // 2)
            for i, u in enumerate(down)
        )  # fmt: skip
        self.source_resblocks = nn.ModuleList(
            ResBlock(c // 2 ** (i + 1), k) for i, k in enumerate(SOURCE_KERNELS)
        )
        self.resblocks = nn.ModuleList(
            ResBlock(c // 2 ** (i + 1), k) for i in range(len(UPSAMPLE_RATES)) for k in RESBLOCK_KERNELS
        )
        self.conv_post = nn.Conv1d(c // 2 ** len(UPSAMPLE_RATES), N_FFT + 2, 7, padding=3)
        window = get_window("hann", N_FFT, fftbins=True).astype(np.float32)
        self.register_buffer("window", torch.from_numpy(window), persistent=False)
        self._envelopes: dict[tuple[int, torch.device, torch.dtype], Tensor] = {}

    def _envelope(self, frames: int) -> Tensor:
        """The inverse STFT's window envelope for ``frames`` STFT frames, computed once per length (a
        stream's windows repeat a few lengths)."""
        key = (frames, self.window.device, self.window.dtype)
        env = self._envelopes.get(key)
        if env is None:
            if len(self._envelopes) >= 64:
                self._envelopes.clear()
            with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
                env = self._envelopes[key] = window_envelope(self.window, frames)
        return env

    # ------------------------------------------------------------------ source

    def f0(self, mel: Tensor) -> Tensor:
        """Pitch per mel frame ``[B, T]`` of ``mel [B, 80, T]``."""
        return self.f0_predictor(mel)

    @staticmethod
    def upsample(f0: Tensor) -> Tensor:
        """``[B, 1, T * 480]``: each frame's pitch held for its samples (nearest)."""
        return F.interpolate(f0[:, None], scale_factor=float(SAMPLES_PER_FRAME), mode="nearest")

    def source(self, f0: Tensor, noise: SourceNoise) -> Tensor:
        """The whole utterance's source ``[B, 1, samples]`` from its pitch per frame ``f0 [B, T]``."""
        f0s = self.upsample(f0)
        cycles = torch.cumsum(SourceModule.harmonics(f0s), dim=-1) % 1
        return self.m_source.merge(f0s, cycles, noise)

    # ------------------------------------------------------------------ filter

    def decode(self, mel: Tensor, source: Tensor) -> Tensor:
        """Audio ``[B, samples]`` of ``mel [B, 80, T]`` and its source ``[B, 1, T * 480]``."""
        spec = torch.view_as_real(
            torch.stft(source.squeeze(1), N_FFT, HOP, N_FFT, window=self.window, return_complex=True)
        )
        s_stft = torch.cat([spec[..., 0], spec[..., 1]], dim=1)
        x = self.conv_pre(mel)
        n = len(RESBLOCK_KERNELS)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, 0.1))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * n](x)
            for j in range(1, n):
                xs += self.resblocks[i * n + j](x)
            x = xs / n
        x = self.conv_post(F.leaky_relu(x))
        magnitude = torch.clip(torch.exp(x[:, : N_FFT // 2 + 1, :]), max=1e2)
        phase = torch.sin(x[:, N_FFT // 2 + 1 :, :])
        spectrum = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        audio = istft(spectrum, self.window, self._envelope(spectrum.shape[-1]))
        return torch.clamp(audio, -AUDIO_LIMIT, AUDIO_LIMIT)

    @torch.inference_mode()
    def inference(self, mel: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One-pass audio ``[B, T * 480]`` of ``mel [B, 80, T]``, the source's noise drawn from
        ``generator`` (None: PyTorch's global generator) in the official order."""
        f0 = self.f0(mel)
        noise = SourceNoise.draw(mel.shape[0], f0.shape[1] * SAMPLES_PER_FRAME, generator, mel.device)
        return self.decode(mel, self.source(f0, noise))

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor], *, prefix: str = "mel2wav.") -> HiFT:
        """HiFT from a state (``s3gen_meanflow.safetensors``' tensors; keys under ``prefix``).

        Raises:
            CheckpointError: tensors missing, unexpected or of the wrong shape.
        """
        state = fold_weight_norm({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
        cfg = HiFTConfig.from_tensors(state)
        with torch.device("meta"):
            model = cls(cfg)
        check_state(model, state, "not a HiFT state")
        model.load_state_dict(state, strict=True, assign=True)
        model.window = torch.from_numpy(get_window("hann", N_FFT, fftbins=True).astype(np.float32))
        return model.eval().requires_grad_(False)
