"""Streaming FLAC, Ogg Opus and AAC (ADTS) through FFmpeg's encoders and muxers (PyAV).

libsndfile writes FLAC and Ogg Opus only whole (it patches the FLAC header on close and writes no Ogg
page before it), so those formats could not stream; AAC it does not write at all. :class:`AvEncoder`
feeds each chunk to FFmpeg's encoder and muxes the packets into an append-only sink, so bytes go out as
the encoder completes them:

* ``opus``: Ogg Opus (libopus, 64 kbit/s VBR, 20 ms frames), one Ogg page per packet
  (``page_duration`` 20 ms) so a page leaves with every frame; the headers come with the first chunk.
* ``flac``: 16-bit FLAC. The STREAMINFO block cannot be patched on a stream, so the streamed bytes say
  "length unknown" (valid FLAC; every decoder plays it); :func:`finalize_flac` writes the true
  sample count into the stored file, which libsndfile needs.
* ``aac``: AAC-LC in ADTS frames (``audio/aac``, what OpenAI's API returns), 64 kbit/s; the encoder
  holds its first 1024 samples (its priming), so the first bytes come with the second chunk.

Every encoding is bit-exact (FFmpeg's ``bitexact`` flags: no random Ogg serial, no encoder version
string), so the same audio gives the same bytes, streamed or whole.

PyAV is imported on first use (about 90 ms with FFmpeg's libraries), not when the service starts: a
process that never sends these formats never loads it.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np

from voxcast.audio.formats import AudioFormat
from voxcast.audio.pcm import float_to_int16

__all__ = ["AV_FORMATS", "AvEncoder", "decode_mono", "finalize_flac", "flac_samples"]

#: format -> (container, codec, sample format the codec takes, container options, codec options)
_SPECS: dict[AudioFormat, tuple[str, str, str, dict[str, str], dict[str, str]]] = {
    AudioFormat.OPUS: ("ogg", "libopus", "s16", {"page_duration": "20000"}, {"b": "64000"}),
    AudioFormat.FLAC: ("flac", "flac", "s16", {}, {}),
    AudioFormat.AAC: ("adts", "aac", "fltp", {}, {"b": "64000"}),
}
AV_FORMATS = frozenset(_SPECS)
"""The formats :class:`AvEncoder` writes."""


class _Sink(io.RawIOBase):
    """Collects what the muxer writes; :meth:`take` hands it over. Append-only (not seekable)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, b: Any) -> int:
        data = bytes(b)
        self._parts.append(data)
        self._pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self._pos

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class AvEncoder:
    """Encodes mono float32 audio at ``sample_rate`` chunk by chunk into ``fmt`` (see the module
    docstring); the outputs of :meth:`encode` and :meth:`finish` concatenate to the file."""

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        container, codec, sample_fmt, muxer_options, codec_options = _SPECS[AudioFormat(fmt)]
        self._sample_fmt = sample_fmt
        self._rate = sample_rate
        self._sink = _Sink()
        import av

        self._out = av.open(
            self._sink, "w", format=container, options={**muxer_options, "fflags": "+bitexact"}
        )
        self._stream: Any = self._out.add_stream(codec, rate=sample_rate, layout="mono")
        self._stream.options = {**codec_options, "flags": "+bitexact"}
        self._pts = 0
        self._done = False

    def encode(self, x: np.ndarray) -> bytes:
        """Encode ``x`` (float32 in [-1, 1]); the bytes the muxer completed (possibly none)."""
        if x.size:
            self._mux(self._stream.encode(self._frame(np.asarray(x, dtype=np.float32))))
        return self._sink.take()

    def finish(self) -> bytes:
        """Flush the encoder and close the container: the last bytes."""
        if not self._done:
            self._done = True
            self._mux(self._stream.encode(None))
            self._out.close()
        return self._sink.take()

    def _frame(self, x: np.ndarray) -> Any:
        import av

        data = float_to_int16(x)[None, :] if self._sample_fmt == "s16" else np.clip(x, -1.0, 1.0)[None, :]
        frame = av.AudioFrame.from_ndarray(data, format=self._sample_fmt, layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += x.size
        return frame

    def _mux(self, packets: Any) -> None:
        for packet in packets:
            self._out.mux(packet)


def flac_samples(data: bytes) -> int:
    """The samples a FLAC file holds, counted by decoding it (its header may say "unknown")."""
    import av

    with av.open(io.BytesIO(data), "r", format="flac") as f:
        return sum(frame.samples for frame in f.decode(audio=0))


def finalize_flac(data: bytes, samples: int | None = None) -> bytes:
    """A streamed FLAC file with its STREAMINFO's total sample count filled in (0 = unknown on the
    stream; counted by decoding when ``samples`` is None). ``data`` unchanged where it is not a FLAC
    file starting with STREAMINFO."""
    # "fLaC", then a metadata block header (1 byte type, 3 bytes length); STREAMINFO's 36-bit total
    # sample count is the low 4 bits of byte 21 of the file and bytes 22-25 (after the sample rate,
    # channels and bits per sample fields).
    if len(data) < 42 or data[:4] != b"fLaC" or data[4] & 0x7F != 0:
        return data
    if samples is None:
        samples = flac_samples(data)
    head = bytearray(data[:42])
    head[21] = (head[21] & 0xF0) | ((samples >> 32) & 0x0F)
    head[22:26] = struct.pack(">I", samples & 0xFFFFFFFF)
    return bytes(head) + data[42:]


def unfinalize_flac(data: bytes) -> bytes:
    """The inverse of :func:`finalize_flac`: the total sample count set back to 0 ("unknown"), as a
    live stream says it, so a stored file streamed again gives the live stream's bytes. ``data`` may be
    only the start of the file (at least 26 bytes); unchanged where it is not a FLAC file starting
    with STREAMINFO."""
    if len(data) < 26 or data[:4] != b"fLaC" or data[4] & 0x7F != 0:
        return data
    head = bytearray(data[:26])
    head[21] &= 0xF0
    head[22:26] = bytes(4)
    return bytes(head) + data[26:]


def _mono(frame: Any) -> np.ndarray:
    """One decoded frame as mono float32 (planar ``[channels, n]`` or packed ``[1, n * channels]``)."""
    x = frame.to_ndarray()
    scale = 1.0 / 32768.0 if x.dtype == np.int16 else 1.0 / 2147483648.0 if x.dtype == np.int32 else 1.0
    channels = len(frame.layout.channels)
    if not frame.format.is_planar:
        x = x.reshape(-1, channels).T
    return (x.astype(np.float32).mean(axis=0) * scale).astype(np.float32)


def decode_mono(data: bytes) -> tuple[np.ndarray, int]:
    """The samples of a complete file in any format FFmpeg reads: mono float32, and their rate.

    Raises:
        ValueError: FFmpeg cannot decode it.
    """
    import av

    try:
        with av.open(io.BytesIO(data), "r") as container:
            rate = int(container.streams.audio[0].rate)
            parts = [_mono(f) for f in container.decode(audio=0)]
    except (av.FFmpegError, IndexError) as e:
        raise ValueError(f"undecodable audio: {e}") from e
    return (np.concatenate(parts) if parts else np.zeros(0, np.float32)), rate
