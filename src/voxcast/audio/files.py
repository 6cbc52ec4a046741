"""One rule for every command that writes an audio file: the file's extension says what it holds.

=======================================  ==================================  ======================
extension                                file                                read by
=======================================  ==================================  ======================
``.wav``                                 WAV: 16-bit PCM, or G.711 with      players, FreeSWITCH,
                                         ``--format mulaw`` / ``alaw``       Twilio
``.mp3`` ``.flac`` ``.opus``/``.ogg``    that format                         players, Twilio (mp3)
``.aac``
``.pcm`` ``.raw``                        raw 16-bit little-endian PCM         tools (any rate)
``.ulaw`` ``.ul`` ``.mulaw``             raw G.711 mu-law, 8 kHz, no header   Asterisk, sox
``.alaw`` ``.al``                        raw G.711 A-law, 8 kHz, no header    Asterisk, sox
``.sln`` ``.sln16`` ``.sln24``           raw 16-bit little-endian PCM at      Asterisk
``.sln44`` ``.sln48``                    8 / 16 / 24 / 44.1 / 48 kHz
=======================================  ==================================  ======================

A ``--format`` that the extension contradicts (``x.mp3 --format wav``), or a ``--sample-rate`` that
a rate-bound extension contradicts (``x.sln16 --sample-rate 8000``), is refused naming the field; an
extension outside the table needs ``--format`` (and writes that format's file). The extension also
gives the rate when none is asked for (``.sln16``: 16 kHz; others: the native 24 kHz).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import PurePath

import numpy as np
import soundfile as sf

from voxcast.audio.av_stream import decode_mono
from voxcast.audio.formats import NATIVE_SAMPLE_RATE, AudioFormat
from voxcast.audio.pcm import int16_to_float
from voxcast.audio.wav import data_span
from voxcast.errors import InvalidRequest

__all__ = ["FileKind", "OutputFile", "file_kind", "file_samples", "output_file", "raw_samples"]


@dataclass(frozen=True)
class FileKind:
    """What a file extension holds: a format, headerless or not, and the rate it implies (if any)."""

    format: AudioFormat
    raw: bool = False
    sample_rate: int | None = None


_F = AudioFormat
_BY_EXTENSION: dict[str, FileKind] = {
    ".wav": FileKind(_F.WAV),
    ".flac": FileKind(_F.FLAC),
    ".mp3": FileKind(_F.MP3),
    ".opus": FileKind(_F.OPUS),
    ".ogg": FileKind(_F.OPUS),
    ".aac": FileKind(_F.AAC),
    ".pcm": FileKind(_F.PCM, raw=True),
    ".raw": FileKind(_F.PCM, raw=True),
    ".ulaw": FileKind(_F.MULAW, raw=True, sample_rate=8000),
    ".ul": FileKind(_F.MULAW, raw=True, sample_rate=8000),
    ".mulaw": FileKind(_F.MULAW, raw=True, sample_rate=8000),
    ".alaw": FileKind(_F.ALAW, raw=True, sample_rate=8000),
    ".al": FileKind(_F.ALAW, raw=True, sample_rate=8000),
    ".sln": FileKind(_F.PCM, raw=True, sample_rate=8000),
    ".sln16": FileKind(_F.PCM, raw=True, sample_rate=16000),
    ".sln24": FileKind(_F.PCM, raw=True, sample_rate=24000),
    ".sln44": FileKind(_F.PCM, raw=True, sample_rate=44100),
    ".sln48": FileKind(_F.PCM, raw=True, sample_rate=48000),
}

#: Formats a ``.wav`` file may hold (the WAV format tag says which).
_WAV_HOLDS = (AudioFormat.WAV, AudioFormat.MULAW, AudioFormat.ALAW)


def file_kind(path: str | PurePath) -> FileKind | None:
    """What ``path``'s extension holds (case-insensitive), or None for an extension outside the table."""
    return _BY_EXTENSION.get(PurePath(path).suffix.lower())


@dataclass(frozen=True)
class OutputFile:
    """How to write one output file: request ``format`` at ``sample_rate``; ``raw``: write the
    streamed samples without a container (G.711 / signed linear as Asterisk reads them)."""

    format: AudioFormat
    sample_rate: int
    raw: bool = False


def output_file(
    path: str | PurePath, format: str | None = None, sample_rate: int | None = None
) -> OutputFile:
    """The file that ``path`` asks for, with an explicit ``format`` / ``sample_rate`` (None: not given).

    Raises:
        InvalidRequest: a format the extension contradicts (field ``format``), a rate a rate-bound
            extension contradicts (``sample_rate``), or neither a known extension nor a format (``out``).
    """
    kind = file_kind(path)
    suffix = PurePath(path).suffix
    try:
        fmt = AudioFormat(format) if format is not None else None
    except ValueError as e:
        raise InvalidRequest(f"unknown format {format!r}", field="format") from e
    if kind is None:
        if fmt is None:
            raise InvalidRequest(
                f"cannot tell the format from {suffix or 'a name without extension'!r}; use --format",
                field="out",
            )
        return OutputFile(fmt, sample_rate or NATIVE_SAMPLE_RATE, raw=fmt == AudioFormat.PCM)
    if fmt is not None and fmt != kind.format and not (kind.format == AudioFormat.WAV and fmt in _WAV_HOLDS):
        allowed = "wav, mulaw or alaw" if kind.format == AudioFormat.WAV else kind.format.value
        raise InvalidRequest(
            f"--format {fmt.value} contradicts the file name {PurePath(path).name!r} ({suffix} holds {allowed})",
            field="format",
        )
    if kind.sample_rate is not None and sample_rate is not None and sample_rate != kind.sample_rate:
        raise InvalidRequest(
            f"{suffix} files are {kind.sample_rate} Hz; --sample-rate {sample_rate} contradicts "
            f"{PurePath(path).name!r}",
            field="sample_rate",
        )
    rate = sample_rate or kind.sample_rate or NATIVE_SAMPLE_RATE
    return OutputFile(fmt or kind.format, rate, raw=kind.raw)


def raw_samples(file: bytes, format: AudioFormat) -> bytes:
    """The samples of a complete ``pcm``, ``wav``, ``mulaw`` or ``alaw`` file without any container
    (a WAV's and a G.711 file's ``data`` chunk; a ``pcm`` file already is raw).

    Raises:
        ValueError: a format that has no headerless form, or a G.711 file that is not a WAV.
    """
    fmt = AudioFormat(format)
    if fmt == AudioFormat.PCM:
        return file
    if fmt not in _WAV_HOLDS:
        raise ValueError(f"{fmt.value} has no headerless form")
    start, size = data_span(file[:4096])
    return file[start : start + size] if size is not None else file[start:]


def file_samples(file: bytes, format: AudioFormat, sample_rate: int) -> tuple[np.ndarray, int]:
    """The mono float32 samples of a complete file in ``format`` (as :func:`encode_file
    <voxcast.audio.encode.encode_file>` writes it) and their rate: ``pcm`` is raw 16-bit at
    ``sample_rate``; the other formats say their own rate (Opus decodes at 48 kHz). MP3 and AAC
    decode with their encoder's delay in front (about 45 ms).

    Raises:
        ValueError: the bytes do not decode as that format.
    """
    fmt = AudioFormat(format)
    if fmt == AudioFormat.PCM:
        return int16_to_float(np.frombuffer(file[: len(file) // 2 * 2], dtype="<i2")), sample_rate
    if fmt not in _WAV_HOLDS and fmt != AudioFormat.FLAC:  # compressed: FFmpeg, as they were encoded
        return decode_mono(file)
    try:
        data, rate = sf.read(io.BytesIO(file), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise ValueError(f"not a readable {AudioFormat(format).value} file: {e}") from e
    return np.ascontiguousarray(data.mean(axis=1, dtype=np.float32)), int(rate)
