"""Output formats and sample rates that voxcast can produce."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["NATIVE_SAMPLE_RATE", "SUPPORTED_SAMPLE_RATES", "AudioFormat"]

NATIVE_SAMPLE_RATE = 24000
"""The models' native rate; every other rate is produced by resampling."""

SUPPORTED_SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)


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
