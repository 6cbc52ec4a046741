"""Turn engine audio (mono float32 at the native 24 kHz) into response bytes, streamed or whole.

Protocol (one response = one format at one sample rate):

* ``pcm``: raw signed 16-bit little-endian mono samples. Streamed chunks concatenate to the file.
* ``wav``: 16-bit PCM WAV. The first streamed chunk starts with one 44-byte header whose RIFF and data
  sizes are ``0xFFFFFFFF`` (unknown length); later chunks are raw samples. The complete file has the
  true sizes (:func:`stream_to_file` rewrites them; :func:`encode_file` writes them directly).
* ``mulaw`` / ``alaw``: streamed chunks are raw G.711 bytes (one byte per sample, no header), as a
  telephony media stream expects. The complete (stored) object is a WAV file with format tag 7
  (mu-law) or 6 (A-law), 8 bits per sample, which phone systems and players open.
* ``mp3``: MPEG audio frames as LAME completes them (:mod:`voxcast.audio.mp3`: CBR, no info frame);
  the chunks concatenate to the complete file.
* ``flac`` / ``opus`` (Ogg Opus) / ``aac`` (ADTS): packets as FFmpeg's encoder completes them
  (:mod:`voxcast.audio.av_stream`); the chunks concatenate to the file, except that a streamed
  FLAC's header says "length unknown" and :func:`stream_to_file` fills in the sample count.
  Every format's output is deterministic (the same audio gives the same bytes).

Resampling is stateful (:mod:`voxcast.audio.resample`), so for every format the concatenation of
``encode`` outputs and ``finish()`` equals the one-shot encoding byte for byte (after the header
rewrite for ``wav``, and the WAV wrapping for ``mulaw``/``alaw``); soxr's filter delay means a chunk
can carry a few ms less audio than went in, and ``finish()`` returns the rest.
"""

from __future__ import annotations

import numpy as np

from voxcast.audio.av_stream import AV_FORMATS, AvEncoder, finalize_flac
from voxcast.audio.formats import (
    NATIVE_SAMPLE_RATE,
    STREAMABLE_FORMATS,
    AudioFormat,
    check_format_rate,
    file_content_type,
    file_extension,
    stream_content_type,
)
from voxcast.audio.mp3 import Mp3Encoder
from voxcast.audio.pcm import alaw_encode, float_to_int16, mulaw_encode, to_float32
from voxcast.audio.resample import StreamResampler, resample
from voxcast.audio.wav import WavCodec, file_header, finalize_stream, stream_header

__all__ = ["StreamEncoder", "encode_file", "stream_to_file"]

_WAV_CODECS = {
    AudioFormat.WAV: WavCodec.PCM16,
    AudioFormat.MULAW: WavCodec.MULAW,
    AudioFormat.ALAW: WavCodec.ALAW,
}


def _raw_bytes(fmt: AudioFormat, x: np.ndarray) -> bytes:
    """Samples (float32 at the output rate) as the raw bytes of a streamable format."""
    pcm16 = float_to_int16(x)
    if fmt == AudioFormat.MULAW:
        return mulaw_encode(pcm16).tobytes()
    if fmt == AudioFormat.ALAW:
        return alaw_encode(pcm16).tobytes()
    return pcm16.astype("<i2", copy=False).tobytes()


def _wav_file(fmt: AudioFormat, data: bytes, sample_rate: int) -> bytes:
    pad = b"\0" * (len(data) & 1)
    return file_header(_WAV_CODECS[fmt], sample_rate, len(data)) + data + pad


class StreamEncoder:
    """Encodes one response incrementally.

    Args:
        format: output format.
        sample_rate: output rate (one of ``SUPPORTED_SAMPLE_RATES``; Opus: 8/16/24/48 kHz).
        input_rate: rate of the audio passed to :meth:`encode` (the native 24 kHz by default).

    Attributes:
        streamable: whether :meth:`encode` returns audio as it comes (every format now).
        content_type: MIME type of the streamed bytes (e.g. ``audio/PCMU;rate=8000``).
        file_content_type: MIME type of the complete object (``audio/wav`` for mulaw/alaw).
        file_extension: extension of the complete object, without dot.

    Raises:
        ValueError: unsupported rate, or a rate the format cannot carry.
    """

    def __init__(self, format: AudioFormat, sample_rate: int, input_rate: int = NATIVE_SAMPLE_RATE) -> None:
        self.format = AudioFormat(format)
        check_format_rate(self.format, sample_rate)
        self.sample_rate = sample_rate
        self.streamable = self.format in STREAMABLE_FORMATS
        self.content_type = stream_content_type(self.format, sample_rate)
        self.file_content_type = file_content_type(self.format)
        self.file_extension = file_extension(self.format)
        self._resampler = StreamResampler(input_rate, sample_rate)
        self._header_sent = False
        self._finished = False
        #: Samples encoded so far (at the output rate).
        self.samples = 0
        self._mp3 = Mp3Encoder(sample_rate) if self.format == AudioFormat.MP3 else None
        self._av = AvEncoder(self.format, sample_rate) if self.format in AV_FORMATS else None

    def encode(self, pcm: np.ndarray) -> bytes:
        """Encode the next chunk of audio.

        Args:
            pcm: 1-D float32 (or int16) samples at ``input_rate``.

        Returns:
            Bytes to send now: for ``wav`` the first call's bytes start with the streaming header;
            possibly ``b""`` (samples held by the resampler or by an encoder's frame or look-ahead).

        Raises:
            RuntimeError: called after :meth:`finish`.
        """
        if self._finished:
            raise RuntimeError("StreamEncoder.encode() after finish()")
        return self._emit(self._resampler.process(to_float32(pcm)))

    def finish(self) -> bytes:
        """Flush the resampler and end the stream.

        Returns:
            The last bytes.

        Raises:
            RuntimeError: called twice.
            ValueError: a flac/opus/aac stream that received no audio (it would be a file of headers).
        """
        if self._finished:
            raise RuntimeError("StreamEncoder.finish() called twice")
        tail = self._emit(self._resampler.flush())
        self._finished = True
        if self._mp3 is not None:
            return tail + self._mp3.finish()
        if self._av is not None:
            if not self.samples:
                raise ValueError(f"cannot encode an empty {self.format} file")
            return tail + self._av.finish()
        return tail

    def _emit(self, x: np.ndarray) -> bytes:
        self.samples += x.size
        if self._mp3 is not None:
            return self._mp3.encode(x)
        if self._av is not None:
            return self._av.encode(x)
        out = _raw_bytes(self.format, x)
        if self.format == AudioFormat.WAV and not self._header_sent:
            self._header_sent = True
            out = stream_header(WavCodec.PCM16, self.sample_rate) + out
        return out


def encode_file(
    pcm_native: np.ndarray,
    format: AudioFormat,
    sample_rate: int,
    input_rate: int = NATIVE_SAMPLE_RATE,
) -> bytes:
    """Encode a whole clip as a complete file (the stored object).

    Args:
        pcm_native: 1-D float32 (or int16) samples at ``input_rate``.
        format: output format: ``pcm`` gives raw s16le; ``wav`` a PCM16 WAV; ``mulaw``/``alaw`` a
            G.711 WAV (format tag 7/6); ``mp3`` via LAME; ``flac``, ``opus`` (Ogg) and ``aac`` (ADTS)
            via FFmpeg (:mod:`voxcast.audio.av_stream`).
        sample_rate: output rate.
        input_rate: rate of ``pcm_native`` (native 24 kHz by default).

    Returns:
        The file bytes.

    Raises:
        ValueError: unsupported rate for the format, or empty audio for flac/opus/aac.
    """
    fmt = AudioFormat(format)
    check_format_rate(fmt, sample_rate)
    x = resample(to_float32(pcm_native), input_rate, sample_rate)
    if fmt == AudioFormat.MP3:
        mp3 = Mp3Encoder(sample_rate)
        return mp3.encode(x) + mp3.finish()
    if fmt in AV_FORMATS:
        if not x.size:
            raise ValueError(f"cannot encode an empty {fmt} file")
        enc = AvEncoder(fmt, sample_rate)
        data = enc.encode(x) + enc.finish()
        return finalize_flac(data, x.size) if fmt == AudioFormat.FLAC else data
    data = _raw_bytes(fmt, x)
    return data if fmt == AudioFormat.PCM else _wav_file(fmt, data, sample_rate)


def stream_to_file(
    format: AudioFormat, sample_rate: int, streamed: bytes, samples: int | None = None
) -> bytes:
    """The complete object for a finished stream, from the concatenation of all its chunks.

    Args:
        format: the stream's format.
        sample_rate: the stream's rate.
        streamed: every byte :class:`StreamEncoder` returned (``encode`` outputs + ``finish()``).
        samples: the encoder's :attr:`~StreamEncoder.samples`, where known (a FLAC stream's header
            gets it; otherwise it is counted by decoding the stream).

    Returns:
        Bytes equal to :func:`encode_file` of the same audio: ``wav`` gets true sizes, ``mulaw``/``alaw``
        are wrapped in a G.711 WAV, ``flac`` gets its sample count, the other formats are complete.
    """
    fmt = AudioFormat(format)
    if fmt == AudioFormat.FLAC:
        return finalize_flac(streamed, samples)
    if fmt == AudioFormat.WAV:
        return finalize_stream(streamed)
    if fmt in (AudioFormat.MULAW, AudioFormat.ALAW):
        return _wav_file(fmt, streamed, sample_rate)
    return streamed
