"""Output formats and sample rates that voxcast can produce, and how each is labelled.

Two views of one format exist: the *streamed* bytes (what chunk messages carry) and the *file* (the
complete object that is stored or returned at the end). They differ only for ``mulaw`` and ``alaw``:
streamed chunks are raw G.711 bytes, the file is a WAV (format tag 7 / 6) because that is what phone
systems and players open. See :mod:`voxcast.audio.encode` for the full protocol.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "NATIVE_SAMPLE_RATE",
    "OPUS_SAMPLE_RATES",
    "STREAMABLE_FORMATS",
    "SUPPORTED_SAMPLE_RATES",
    "AudioFormat",
    "check_format_rate",
    "file_content_type",
    "file_extension",
    "stream_content_type",
]

NATIVE_SAMPLE_RATE = 24000
"""The models' native rate; every other rate is produced by resampling."""

SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)

OPUS_SAMPLE_RATES = (8000, 16000, 24000, 48000)
"""Supported rates that Opus can carry (Opus knows 8/12/16/24/48 kHz only; libopus refuses others)."""


class AudioFormat(StrEnum):
    """Response formats. ``pcm`` is raw little-endian int16, ``mulaw``/``alaw`` are raw G.711 bytes
    when streamed and WAV-wrapped when written as a file."""

    PCM = "pcm"
    WAV = "wav"
    MULAW = "mulaw"
    ALAW = "alaw"
    FLAC = "flac"
    MP3 = "mp3"
    OPUS = "opus"
    AAC = "aac"


STREAMABLE_FORMATS = frozenset(AudioFormat)
"""Formats whose bytes are sent as they are produced: all of them (flac, opus and aac through FFmpeg's
encoders and muxers, :mod:`voxcast.audio.av_stream`)."""

_EXTENSIONS = {
    AudioFormat.PCM: "pcm",
    AudioFormat.WAV: "wav",
    AudioFormat.MULAW: "wav",
    AudioFormat.ALAW: "wav",
    AudioFormat.FLAC: "flac",
    AudioFormat.MP3: "mp3",
    AudioFormat.OPUS: "opus",
    AudioFormat.AAC: "aac",
}

_FILE_TYPES = {
    AudioFormat.PCM: "audio/pcm",
    AudioFormat.WAV: "audio/wav",
    AudioFormat.MULAW: "audio/wav",
    AudioFormat.ALAW: "audio/wav",
    AudioFormat.FLAC: "audio/flac",
    AudioFormat.MP3: "audio/mpeg",
    AudioFormat.OPUS: "audio/ogg; codecs=opus",
    AudioFormat.AAC: "audio/aac",
}


def check_format_rate(fmt: AudioFormat, sample_rate: int) -> None:
    """Check that ``fmt`` can be produced at ``sample_rate``.

    Args:
        fmt: the output format.
        sample_rate: the requested output rate.

    Raises:
        ValueError: the rate is not supported at all, or not by this format (Opus at 22050/44100).
    """
    if sample_rate not in SUPPORTED_SAMPLE_RATES:
        raise ValueError(f"sample_rate {sample_rate} is not one of {list(SUPPORTED_SAMPLE_RATES)}")
    if fmt == AudioFormat.OPUS and sample_rate not in OPUS_SAMPLE_RATES:
        raise ValueError(f"opus supports sample rates {list(OPUS_SAMPLE_RATES)}, not {sample_rate}")


def file_extension(fmt: AudioFormat) -> str:
    """File name extension (no dot) of the complete object: ``mulaw``/``alaw`` files are ``wav``."""
    return _EXTENSIONS[AudioFormat(fmt)]


def file_content_type(fmt: AudioFormat) -> str:
    """MIME type of the complete object (``audio/wav`` for ``wav``, ``mulaw`` and ``alaw``)."""
    return _FILE_TYPES[AudioFormat(fmt)]


def stream_content_type(fmt: AudioFormat, sample_rate: int) -> str:
    """MIME type of the streamed bytes.

    Args:
        fmt: the output format.
        sample_rate: the output rate (carried as a parameter for the raw formats).

    Returns:
        ``audio/pcm;rate=R`` (s16le mono), ``audio/PCMU;rate=R`` / ``audio/PCMA;rate=R`` (raw G.711,
        RFC 3551 names), otherwise the file type.
    """
    fmt = AudioFormat(fmt)
    raw = {AudioFormat.PCM: "audio/pcm", AudioFormat.MULAW: "audio/PCMU", AudioFormat.ALAW: "audio/PCMA"}
    if fmt in raw:
        return f"{raw[fmt]};rate={sample_rate}"
    return _FILE_TYPES[fmt]
