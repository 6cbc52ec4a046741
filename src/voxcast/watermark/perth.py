"""Resemble AI's Perth watermark (PerthNet "implicit", resemble-perth 1.0.1): an inaudible mark in the
magnitude spectrogram under 2 kHz, the one Chatterbox puts on every ``generate()`` output.

The mark is applied to a whole utterance (the encoder's mask and the detector's means span the whole
signal), so voxcast puts it on stored renders only, never on a live stream. Our own code; the
weights are the official ones, read from the installed ``resemble-perth`` package (its data folder
``perth/perth_net/pretrained/implicit``, found without importing the package, which needs
``pkg_resources``, librosa and torchaudio's binary) or from a folder given explicitly. Each step is
computed as the official ``PerthImplicitWatermarker`` computes it (librosa's soxr resampling to
32 kHz and back, torchaudio's STFT and inverse, the same normalisation), so the marked audio and the
detector's score are the official ones (tests/parity).

Pipeline (32 kHz, n_fft 2048, hop 320, Hann): STFT -> 20 log10 |X| normalised to [0, ~1] -> the
encoder adds a residual to the 128 bins under 2 kHz, on the frames louder than 5 % of the loudest ->
back to linear magnitude with the original phase -> inverse STFT. The detector runs three copies of
a conv stack at 1.25x, 1x and 0.75x the frame rate and mixes their masked means by attention.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from scipy.signal import resample_poly
from torch import Tensor, nn

from voxcast.audio.resample import resample_fixed
from voxcast.errors import CheckpointError

__all__ = ["PerthConfig", "PerthWatermarker", "find_perth_weights"]

M = TypeVar("M", bound=nn.Module)

#: The folder of the official weights inside the installed ``perth`` package.
PACKAGE_FOLDER = ("perth_net", "pretrained", "implicit")
_CHECKPOINT = re.compile(r"_(\d+)\.pth\.tar$")
_HEADROOM_DB = 15.0
_MASK_SHARE = 0.05
#: How errors about the weights name them (the setting that points at them).
_WEIGHTS = "Perth weights (VOXCAST_WATERMARK_MODEL)"


@dataclass(frozen=True)
class PerthConfig:
    """The hyperparameters inference reads (``hparams.yaml``)."""

    sample_rate: int = 32000
    n_fft: int = 2048
    hop_size: int = 320
    window_size: int = 2048
    hidden_size: int = 256
    max_wmark_freq: float = 2000.0
    stft_magnitude_min: float = 1e-9
    window_fn: str = "hann"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, object]) -> PerthConfig:
        names = cls.__dataclass_fields__
        cfg = cls(**{k: v for k, v in raw.items() if k in names})  # type: ignore[arg-type]
        if cfg.window_fn != "hann":
            raise CheckpointError(f"Perth window_fn={cfg.window_fn!r}: only 'hann' is supported")
        return cfg

    @property
    def subband(self) -> int:
        """Bins under ``max_wmark_freq`` (128 at 32 kHz, n_fft 2048, 2 kHz)."""
        nfreq = self.n_fft // 2 + 1
        return round(nfreq * self.max_wmark_freq / (self.sample_rate / 2))

    @property
    def min_level_db(self) -> float:
        return float(20 * np.log10(self.stft_magnitude_min))  # -180.0, as numpy computes it upstream


class _Conv(nn.Module):
    """Conv1d ('same' padding) then LeakyReLU unless ``act`` is off."""

    def __init__(self, i: int, o: int, k: int, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv1d(i, o, k, padding=(k - 1) // 2)
        self.act = nn.LeakyReLU() if act else None

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x)
        return self.act(x) if self.act is not None else x


def _stack(i: int, hidden: int, o: int) -> nn.Sequential:
    return nn.Sequential(
        _Conv(i, hidden, 1),
        *[_Conv(hidden, hidden, 7) for _ in range(5)],
        _Conv(hidden, o, 1, act=False),
    )


def _loud_frames(magspec: Tensor) -> Tensor:
    """(B, F, T) -> (B, T): 1.0 where the frame's summed magnitude exceeds 5 % of the loudest."""
    s = magspec.sum(dim=1)
    thresh = s.max(dim=1).values * _MASK_SHARE
    return (s > thresh[:, None]).float()


class _Encoder(nn.Module):
    def __init__(self, hidden: int, subband: int) -> None:
        super().__init__()
        self.subband = subband
        self.layers = _stack(subband, hidden, subband)

    def forward(self, magspec: Tensor) -> Tensor:  # magspec: [B, F, T], normalised
        magspec = magspec.clone()
        mask = _loud_frames(magspec)[:, None]  # [B, 1, T]
        res = self.layers(magspec[:, : self.subband]) * mask
        magspec[:, : self.subband] += res
        return magspec


def _masked_mean(x: Tensor, m: Tensor) -> Tensor:
    return (x * m).sum(dim=2) / m.sum(dim=2)  # [B, C]


class _Decoder(nn.Module):
    _SCALES = (("slow_layers", 1.25), ("normal_layers", 1.0), ("fast_layers", 0.75))

    def __init__(self, hidden: int, subband: int) -> None:
        super().__init__()
        self.subband = subband
        self.slow_layers = _stack(subband, hidden, 2)
        self.normal_layers = _stack(subband, hidden, 2)
        self.fast_layers = _stack(subband, hidden, 2)

    def forward(self, magspec: Tensor) -> Tensor:  # magspec: [B, F, T] -> [B]
        mask = _loud_frames(magspec.detach())[:, None]  # [B, 1, T]
        subband = magspec[:, : self.subband]
        t = subband.shape[2]
        attn, marks = [], []
        for name, scale in self._SCALES:
            x = (
                subband
                if scale == 1.0
                else F.interpolate(subband, size=int(t * scale), mode="linear", align_corners=True)
            )
            out = getattr(self, name)(x)  # [B, 2, T']
            m = F.interpolate(mask, size=out.size(2), mode="nearest")
            attn.append(_masked_mean(out[:, :1], m))
            marks.append(_masked_mean(out[:, 1:], m))
        weights = F.softmax(torch.cat(attn, dim=1), dim=1)  # [B, 3]
        return (torch.cat(marks, dim=1) * weights).sum(dim=1)


class PerthWatermarker:
    """The Perth watermark: :meth:`apply` marks a whole utterance, :meth:`detect` scores one.

    Build with :meth:`load`. Stateless between calls and safe to share between threads.
    """

    #: The watermark's name (``VOXCAST_WATERMARK``; ``timing.extra.watermark``, stored metadata).
    name = "perth"

    def __init__(
        self, cfg: PerthConfig, state: Mapping[str, Tensor], source: str = "", identity: str = "perth"
    ) -> None:
        self.cfg = cfg
        self.source = source
        #: The watermark and its weights (cache keys, prerender hashes: other weights, other files).
        self.identity = identity
        self._encoder = _load_part(state, "encoder", _Encoder(cfg.hidden_size, cfg.subband))
        # the detector only serves detect(): built on its first call
        self._decoder_state = {k: v for k, v in state.items() if k.startswith("decoder.")}
        self._decoder: _Decoder | None = None
        self._decoder_lock = threading.Lock()
        # what upstream's Spectrogram and InverseSpectrogram both pass
        self._stft: dict[str, Any] = {
            "n_fft": cfg.n_fft,
            "hop_length": cfg.hop_size,
            "win_length": cfg.window_size,
            "window": torch.hann_window(cfg.window_size),
            "center": True,
            "normalized": False,
            "onesided": True,
        }

    @classmethod
    def load(cls, path: str | Path | None = None) -> PerthWatermarker:
        """The official weights from ``path`` (a ``*.pth.tar`` or the folder holding it and
        ``hparams.yaml``), or from the installed ``resemble-perth`` package when ``path`` is None.

        Raises:
            CheckpointError: no weights there, or a file that is not Perth's.
        """
        folder, file = _resolve(path)
        hp = folder / "hparams.yaml"
        try:
            raw = yaml.safe_load(hp.read_text()) if hp.is_file() else {}
            if not isinstance(raw, dict):
                raise TypeError("not a mapping")
            cfg = PerthConfig.from_mapping(raw)
        except CheckpointError:
            raise
        except Exception as e:  # YAML syntax, a mapping of the wrong kind, unknown values
            raise CheckpointError(f"{_WEIGHTS}: {hp}: {e}") from e
        data = file.read_bytes()
        try:
            ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # a pickle beyond tensors, a truncated file
            raise CheckpointError(f"{_WEIGHTS}: {file}: not a checkpoint of tensors: {e}") from e
        state = ckpt.get("model") if isinstance(ckpt, dict) else None
        if not isinstance(state, dict):
            raise CheckpointError(f"{_WEIGHTS}: {file}: no 'model' state dict")
        identity = f"perth-{hashlib.sha256(data).hexdigest()[:16]}"
        return cls(cfg, state, source=str(file), identity=identity)

    # -- the official steps ----------------------------------------------------------------
    def _magphase(self, signal: np.ndarray) -> tuple[Tensor, Tensor]:
        cfg = self.cfg
        x = torch.from_numpy(np.ascontiguousarray(signal)).float()
        spec = torch.stft(x[None], pad_mode="reflect", return_complex=True, **self._stft)[0]  # [F, T]
        phase = torch.angle(spec)
        mag = 20 * torch.log10(spec.abs().clip(cfg.stft_magnitude_min))
        mag = (mag - cfg.min_level_db) / (-cfg.min_level_db + _HEADROOM_DB)
        return mag, phase

    def _signal(self, mag: Tensor, phase: Tensor) -> np.ndarray:
        cfg = self.cfg
        db = mag * (-cfg.min_level_db + _HEADROOM_DB) + cfg.min_level_db
        spec = (10.0 ** ((db / 20).clip(max=10))) * torch.exp(1.0j * phase)
        return torch.istft(spec[None], return_complex=False, **self._stft)[0].numpy()

    @torch.inference_mode()
    def apply(self, signal: np.ndarray, sample_rate: int) -> np.ndarray:
        """Mark ``signal`` (float, mono, at ``sample_rate``); float32 at the same rate.

        As upstream, the result can be up to one 10 ms hop shorter than the input (the inverse STFT
        ends at the last whole hop). Audio shorter than one STFT window is returned unchanged.
        """
        sr = self.cfg.sample_rate
        x = resample_fixed(signal, sample_rate, sr) if sample_rate != sr else signal.astype(np.float32)
        if x.shape[0] <= self.cfg.n_fft // 2:  # reflect padding needs more than half a window
            return np.asarray(signal, dtype=np.float32)
        mag, phase = self._magphase(x)
        marked = self._encoder(mag[None])[0]
        out = self._signal(marked, phase)
        return resample_fixed(out, sr, sample_rate) if sample_rate != sr else out

    @torch.inference_mode()
    def detect(self, signal: np.ndarray, sample_rate: int) -> float:
        """The detector's confidence in [0, 1] that ``signal`` carries the mark (upstream rounds it)."""
        sr = self.cfg.sample_rate
        x = np.asarray(signal, dtype=np.float32)
        if sample_rate != sr:
            x = _resample_polyphase(x, sample_rate, sr)
        if x.shape[0] <= self.cfg.n_fft // 2:
            return 0.0
        mag, _ = self._magphase(x)
        if not _loud_frames(mag[None]).any():  # silence: no frame to read a mark from
            return 0.0
        return float(self._detector()(mag[None])[0].clip(0.0, 1.0))

    def _detector(self) -> _Decoder:
        with self._decoder_lock:
            if self._decoder is None:
                decoder = _Decoder(self.cfg.hidden_size, self.cfg.subband)
                self._decoder = _load_part(self._decoder_state, "decoder", decoder)
            return self._decoder


def _resample_polyphase(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """``librosa.resample(x, res_type="polyphase")``: scipy's polyphase filter, the length fixed to
    ``ceil(n * sr_out / sr_in)``."""
    gcd = int(np.gcd(sr_in, sr_out))
    n_out = int(np.ceil(x.shape[-1] * (float(sr_out) / sr_in)))
    y = resample_poly(x, sr_out // gcd, sr_in // gcd, axis=-1)
    y = y[:n_out] if y.shape[0] >= n_out else np.pad(y, (0, n_out - y.shape[0]))
    return np.ascontiguousarray(y, dtype=x.dtype)


def _load_part(state: Mapping[str, Tensor], name: str, module: M) -> M:
    """``module`` strictly loaded from the ``<name>.`` tensors, for inference (the audio processor's
    buffers, Hann windows and a phase-advance table, are rebuilt rather than read)."""
    prefix = f"{name}."
    sub = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    try:
        module.load_state_dict(sub, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{_WEIGHTS}: {name}: {e}") from e
    return module.eval().requires_grad_(False)


def find_perth_weights() -> Path | None:
    """The installed ``resemble-perth`` package's weights folder, or None (the package is located,
    not imported)."""
    spec = importlib.util.find_spec("perth")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))).joinpath(*PACKAGE_FOLDER)
    return folder if folder.is_dir() else None


def _resolve(path: str | Path | None) -> tuple[Path, Path]:
    """(folder, checkpoint file): the newest ``*_<step>.pth.tar`` of a folder, as upstream picks it."""
    if path is None:
        found = find_perth_weights()
        if found is None:
            raise CheckpointError(
                "the Perth watermark needs its weights: pip install 'voxcast[watermark]' "
                "(resemble-perth) or set VOXCAST_WATERMARK_MODEL to their folder"
            )
        path = found
    p = Path(path)
    if p.is_file():
        return p.parent, p
    if not p.is_dir():
        raise CheckpointError(f"{_WEIGHTS}: {p} does not exist")
    ckpts = [(int(m.group(1)), f) for f in p.iterdir() if (m := _CHECKPOINT.search(f.name))]
    if not ckpts:
        raise CheckpointError(f"{_WEIGHTS}: no *_<step>.pth.tar in {p}")
    return p, max(ckpts)[1]
