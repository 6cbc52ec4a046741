"""Output presets of a prerendered prompt library and the post-processing applied before encoding.

Every prompt is synthesized once (24 kHz PCM), high-passed (DC and rumble off), silence-trimmed to a
pad, and then encoded once per preset at its own measured loudness (:mod:`voxcast.prerender.levels`):

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

Presets named for the system that plays the files (docs/telephony.md), each written as that system
reads it:

====================  ==============================================  ===============================
preset                file                                            played by
====================  ==============================================  ===============================
``asterisk-ulaw``     ``.ulaw``: raw G.711 mu-law, 8 kHz, no header   Asterisk ``Playback(name)``
``asterisk-alaw``     ``.alaw``: raw G.711 A-law, 8 kHz, no header    Asterisk (A-law trunks)
``asterisk-sln``      ``.sln``: raw 16-bit LE PCM, 8 kHz              Asterisk (transcodes to any codec)
``asterisk-sln16``    ``.sln16``: raw 16-bit LE PCM, 16 kHz           Asterisk wideband (G.722, Opus)
``freeswitch-8k``     8 kHz 16-bit PCM WAV                            FreeSWITCH ``playback``
``freeswitch-16k``    16 kHz 16-bit PCM WAV                           FreeSWITCH wideband
``twilio-wav``        8 kHz G.711 mu-law WAV (format tag 7)           Twilio ``<Play>`` (no transcode)
``twilio-mp3``        24 kHz MP3                                      Twilio ``<Play>``
====================  ==============================================  ===============================

A raw preset is encoded and measured as a WAV of the same samples, then stored without the header.

Loudness: default target **-19 LUFS** integrated (ITU-R BS.1770), set and measured on each preset's
encoded file, with a **-1 dBTP true-peak** ceiling (4x oversampled: G.711 has no headroom above full
scale, and a PBX that resamples turns inter-sample peaks into clipping). Telephony prompt libraries
sit a few dB under the -16 LUFS used for streaming speech so that G.711 and the network's AGC are not
pushed; the ceiling wins over the target. Both are configurable per job (``loudness_lufs``,
``peak_dbfs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.signal import butter, sosfiltfilt

from voxcast.audio.encode import encode_file
from voxcast.audio.files import raw_samples
from voxcast.audio.formats import NATIVE_SAMPLE_RATE, AudioFormat, file_content_type, file_extension
from voxcast.audio.loudness import DEFAULT_PEAK_LIMIT_DBFS, integrated_loudness, rounded_db
from voxcast.audio.trim import DEFAULT_PAD_MS, fade, trim_silence

__all__ = [
    "DEFAULT_HIGHPASS_HZ",
    "DEFAULT_LOUDNESS_LUFS",
    "DEFAULT_PRESETS",
    "PRESETS",
    "PostProcess",
    "Preset",
    "encode_preset",
    "fade_edges",
    "highpass",
    "postprocess",
]

DEFAULT_LOUDNESS_LUFS = -19.0
"""Integrated loudness target of prompt libraries (see the module docstring)."""

DEFAULT_HIGHPASS_HZ = 60.0
"""High-pass corner applied before anything else: a DC offset or rumble is inaudible (BS.1770's
weighting ignores it too) but takes peak headroom, so the true-peak ceiling would hold the level
down (the random test model's output sits on a -16 dBFS DC offset: 13 dB short of -19 LUFS in 8 kHz
G.711 without it). Telephony passes 300-3400 Hz, wideband 50-7000 Hz."""


@dataclass(frozen=True)
class Preset:
    """One output variant of every prompt.

    Attributes:
        name: the preset's name (the library's folder for its files).
        format: the format it is encoded (and measured) in; a raw preset's is a WAV of its samples.
        sample_rate: output rate.
        raw: store the samples without the WAV header (Asterisk's ``.ulaw``, ``.sln``...).
        raw_extension: the extension of a raw preset's files.
    """

    name: str
    format: AudioFormat
    sample_rate: int
    raw: bool = False
    raw_extension: str = ""

    @property
    def extension(self) -> str:
        return self.raw_extension if self.raw else file_extension(self.format)

    @property
    def sample_format(self) -> str:
        """What the stored bytes are: the format, or for a raw preset the samples' encoding."""
        return "pcm" if self.raw and self.format == AudioFormat.WAV else self.format.value

    @property
    def content_type(self) -> str:
        if self.raw:
            return _RAW_TYPES.get(
                self.format, f"audio/L16; rate={self.sample_rate}; endianness=little-endian"
            )
        return file_content_type(self.format)

    def file(self, encoded: bytes) -> bytes:
        """The stored file from the encoded one: a raw preset's samples alone (no WAV header)."""
        return raw_samples(encoded, self.format) if self.raw else encoded

    def to_dict(self) -> dict[str, Any]:
        out = {"format": self.sample_format, "sample_rate": self.sample_rate, "extension": self.extension}
        return out | ({"raw": True} if self.raw else {})


_RAW_TYPES = {AudioFormat.MULAW: "audio/basic", AudioFormat.ALAW: "audio/x-alaw-basic"}


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
        # named for the system that plays them (see the module docstring)
        Preset("asterisk-ulaw", AudioFormat.MULAW, 8000, raw=True, raw_extension="ulaw"),
        Preset("asterisk-alaw", AudioFormat.ALAW, 8000, raw=True, raw_extension="alaw"),
        Preset("asterisk-sln", AudioFormat.WAV, 8000, raw=True, raw_extension="sln"),
        Preset("asterisk-sln16", AudioFormat.WAV, 16000, raw=True, raw_extension="sln16"),
        Preset("freeswitch-8k", AudioFormat.WAV, 8000),
        Preset("freeswitch-16k", AudioFormat.WAV, 16000),
        Preset("twilio-wav", AudioFormat.MULAW, 8000),
        Preset("twilio-mp3", AudioFormat.MP3, 24000),
    )
}

DEFAULT_PRESETS = ("mulaw8k", "alaw8k", "pcm8k", "pcm16k", "wav24k", "mp3")
"""Presets rendered when a job names none."""


@dataclass(frozen=True)
class PostProcess:
    """Post-processing of every prompt before encoding.

    Attributes:
        loudness_lufs: integrated loudness target of every preset's file; None leaves the level alone.
        peak_dbfs: true-peak ceiling in dBTP (wins over the target).
        trim: cut leading/trailing silence.
        pad_ms: silence kept on each side when trimming.
        highpass_hz: corner of the high-pass that removes DC and rumble first (None: off).
    """

    loudness_lufs: float | None = DEFAULT_LOUDNESS_LUFS
    peak_dbfs: float = DEFAULT_PEAK_LIMIT_DBFS
    trim: bool = True
    pad_ms: float = DEFAULT_PAD_MS
    highpass_hz: float | None = DEFAULT_HIGHPASS_HZ

    def to_dict(self) -> dict[str, Any]:
        return {
            "loudness_lufs": self.loudness_lufs,
            "peak_dbfs": self.peak_dbfs,
            "trim": self.trim,
            "pad_ms": self.pad_ms,
            "highpass_hz": self.highpass_hz,
        }


def postprocess(
    pcm: np.ndarray, settings: PostProcess, sample_rate: int = NATIVE_SAMPLE_RATE
) -> tuple[np.ndarray, dict[str, Any]]:
    """High-pass, trim and fade the edges of one prompt (the level is set per preset, when encoded).

    Args:
        pcm: mono float32 samples.
        settings: what to apply.
        sample_rate: rate of ``pcm``.

    Returns:
        (trimmed samples, facts for the manifest: durations, trim span, the model's loudness).
    """
    facts: dict[str, Any] = {"source_duration_s": round(len(pcm) / sample_rate, 3)}
    if settings.highpass_hz is not None:
        pcm = highpass(pcm, sample_rate, settings.highpass_hz)
    if settings.trim:
        t = trim_silence(pcm, sample_rate, pad_ms=settings.pad_ms)
        pcm = t.pcm
        facts["trim_start_s"] = round(t.start / sample_rate, 3)
        facts["trim_end_s"] = round(t.end / sample_rate, 3)
    pcm = fade_edges(pcm, sample_rate)
    facts["source_loudness_lufs"] = rounded_db(integrated_loudness(pcm, sample_rate))
    facts["duration_s"] = round(len(pcm) / sample_rate, 3)
    return pcm, facts


EDGE_FADE_MS = 5.0
"""Fade at each end of a prompt: a file that starts or stops mid-waveform clicks when played, and its
resampled versions ring there (measured on the random model's output: the 8 kHz file's true peak sat
at its last sample, 25 dB above its loudness, so the ceiling held it 24 dB under the target)."""


def fade_edges(pcm: np.ndarray, sample_rate: int, ms: float = EDGE_FADE_MS) -> np.ndarray:
    """``pcm`` with linear fades of ``ms`` in and out (a copy)."""
    y = np.array(pcm, dtype=np.float32)
    fade(y, round(sample_rate * ms / 1000.0))
    return y


def highpass(pcm: np.ndarray, sample_rate: int, corner_hz: float) -> np.ndarray:
    """Zero-phase 2nd-order Butterworth high-pass (run forwards and backwards): no phase shift of the
    speech, and an offset present from the first sample leaves no step at the edges."""
    x = np.asarray(pcm, dtype=np.float64)
    sos = butter(2, corner_hz, btype="highpass", fs=sample_rate, output="sos")
    if len(x) <= 3 * (2 * len(sos) + 1):  # too short for the edge padding: only take the offset off
        return (x - x.mean()).astype(np.float32)
    return sosfiltfilt(sos, x, padtype="odd").astype(np.float32)


def encode_preset(pcm: np.ndarray, preset: Preset, sample_rate: int = NATIVE_SAMPLE_RATE) -> bytes:
    """The complete file of ``pcm`` in ``preset`` (a raw preset's samples alone)."""
    return preset.file(encode_file(pcm, preset.format, preset.sample_rate, input_rate=sample_rate))
