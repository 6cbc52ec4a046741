"""Output presets of a prerendered prompt library and the post-processing applied before encoding.

Every prompt is synthesized once (24 kHz PCM), silence-trimmed to a pad, loudness-normalised, and
then encoded once per preset:

============  =======================================  ==========================
preset        file                                     typical use
============  =======================================  ==========================
``mulaw8k``   8 kHz G.711 mu-law WAV (format tag 7)    North-American/Japanese PSTN, Asterisk, Twilio
``alaw8k``    8 kHz G.711 A-law WAV (format tag 6)     European PSTN
``pcm8k``     8 kHz 16-bit PCM WAV                     IVRs that transcode themselves
``pcm16k``    16 kHz 16-bit PCM WAV                    wideband (G.722) systems, WebRTC
``wav24k``    24 kHz 16-bit PCM WAV (native rate)      archive, web players
``mp3``       24 kHz MP3                               web, previews
``flac24k``   24 kHz FLAC (optional)                   lossless archive
``opus16k``   16 kHz Ogg Opus (optional)               WebRTC / low bandwidth
============  =======================================  ==========================

Loudness: default target **-19 LUFS** integrated (ITU-R BS.1770) with a -1 dBFS sample-peak ceiling.
Telephony prompt libraries sit a few dB under the -16 LUFS used for streaming speech so that G.711
(which saturates at 0 dBFS and has no headroom) and the network's AGC are not pushed; the ceiling wins
over the target. Both are configurable per job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from voxcast.audio.encode import encode_file
from voxcast.audio.formats import NATIVE_SAMPLE_RATE, AudioFormat, file_content_type, file_extension
from voxcast.audio.loudness import DEFAULT_PEAK_LIMIT_DBFS, normalize_loudness
from voxcast.audio.trim import DEFAULT_PAD_MS, trim_silence

__all__ = [
    "DEFAULT_LOUDNESS_LUFS",
    "DEFAULT_PRESETS",
    "PRESETS",
    "PostProcess",
    "Preset",
    "encode_preset",
    "postprocess",
]

DEFAULT_LOUDNESS_LUFS = -19.0
"""Integrated loudness target of prompt libraries (see the module docstring)."""


@dataclass(frozen=True)
class Preset:
    """One output variant of every prompt."""

    name: str
    format: AudioFormat
    sample_rate: int

    @property
    def extension(self) -> str:
        return file_extension(self.format)

    @property
    def content_type(self) -> str:
        return file_content_type(self.format)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format.value, "sample_rate": self.sample_rate, "extension": self.extension}


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("mulaw8k", AudioFormat.MULAW, 8000),
        Preset("alaw8k", AudioFormat.ALAW, 8000),
        Preset("pcm8k", AudioFormat.WAV, 8000),
        Preset("pcm16k", AudioFormat.WAV, 16000),
        Preset("wav24k", AudioFormat.WAV, 24000),
        Preset("mp3", AudioFormat.MP3, 24000),
        Preset("flac24k", AudioFormat.FLAC, 24000),
        Preset("opus16k", AudioFormat.OPUS, 16000),
    )
}

DEFAULT_PRESETS = ("mulaw8k", "alaw8k", "pcm8k", "pcm16k", "wav24k", "mp3")
"""Presets rendered when a job names none."""


@dataclass(frozen=True)
class PostProcess:
    """Post-processing of every prompt before encoding.

    Attributes:
        loudness_lufs: integrated loudness target; None leaves the level alone.
        peak_dbfs: sample-peak ceiling (wins over the target).
        trim: cut leading/trailing silence.
        pad_ms: silence kept on each side when trimming.
    """

    loudness_lufs: float | None = DEFAULT_LOUDNESS_LUFS
    peak_dbfs: float = DEFAULT_PEAK_LIMIT_DBFS
    trim: bool = True
    pad_ms: float = DEFAULT_PAD_MS

    def to_dict(self) -> dict[str, Any]:
        return {
            "loudness_lufs": self.loudness_lufs,
            "peak_dbfs": self.peak_dbfs,
            "trim": self.trim,
            "pad_ms": self.pad_ms,
        }


def _finite(x: float) -> float | None:
    return round(x, 2) if math.isfinite(x) else None


def postprocess(
    pcm: np.ndarray, settings: PostProcess, sample_rate: int = NATIVE_SAMPLE_RATE
) -> tuple[np.ndarray, dict[str, Any]]:
    """Trim and normalise one prompt.

    Args:
        pcm: mono float32 samples.
        settings: what to apply.
        sample_rate: rate of ``pcm``.

    Returns:
        (processed samples, facts for the manifest: durations, trim span, loudness before/after, gain).
    """
    facts: dict[str, Any] = {"source_duration_s": round(len(pcm) / sample_rate, 3)}
    if settings.trim:
        t = trim_silence(pcm, sample_rate, pad_ms=settings.pad_ms)
        pcm = t.pcm
        facts["trim_start_s"] = round(t.start / sample_rate, 3)
        facts["trim_end_s"] = round(t.end / sample_rate, 3)
    if settings.loudness_lufs is not None:
        r = normalize_loudness(pcm, sample_rate, settings.loudness_lufs, settings.peak_dbfs)
        pcm = r.pcm
        facts.update(
            loudness_in_lufs=_finite(r.input_lufs),
            loudness_lufs=_finite(r.output_lufs),
            gain_db=round(r.gain_db, 2),
            peak_dbfs=_finite(r.peak_dbfs),
            peak_limited=r.limited,
        )
    facts["duration_s"] = round(len(pcm) / sample_rate, 3)
    return pcm, facts


def encode_preset(pcm: np.ndarray, preset: Preset, sample_rate: int = NATIVE_SAMPLE_RATE) -> bytes:
    """The complete file of ``pcm`` in ``preset``."""
    return encode_file(pcm, preset.format, preset.sample_rate, input_rate=sample_rate)
