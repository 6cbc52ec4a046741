"""WAV (RIFF) headers for 16-bit PCM, mu-law (format tag 7) and A-law (format tag 6), mono.

Two kinds of header:

* a **streaming** header (:func:`stream_header`), written once at the start of a live stream whose
  length is unknown: the RIFF and data sizes are ``0xFFFFFFFF`` (libsndfile, ffmpeg and browsers then
  read to the end of the data);
* a **file** header (:func:`file_header`) with the true sizes, for complete objects.

G.711 headers follow libsndfile's layout: an 18-byte ``fmt`` chunk (``cbSize`` = 0) and a ``fact``
chunk with the sample count (``0xFFFFFFFF`` when streaming). :func:`finalize_stream` turns a complete
streamed WAV (streaming header + all data) into the file form by rewriting the sizes.

A file whose data length is odd (G.711 with an odd sample count) ends with one RIFF pad byte that is
not audio. To turn a stored G.711 WAV back into a raw stream, send exactly the :func:`data_span` bytes
(skipping the header alone would stream the pad byte: a full-scale click in mu-law).
"""

from __future__ import annotations

import struct
from enum import IntEnum

__all__ = [
    "UNKNOWN_SIZE",
    "WavCodec",
    "data_span",
    "file_header",
    "finalize_stream",
    "header_size",
    "stream_header",
]

UNKNOWN_SIZE = 0xFFFFFFFF
"""Size field value meaning "unknown / to the end of the stream"."""


class WavCodec(IntEnum):
    """WAVE format tags."""

    PCM16 = 1
    ALAW = 6
    MULAW = 7


def _bytes_per_sample(codec: WavCodec) -> int:
    return 2 if codec == WavCodec.PCM16 else 1


def header_size(codec: WavCodec) -> int:
    """Length in bytes of the header for ``codec`` (44 for PCM16, 58 for G.711)."""
    return 44 if codec == WavCodec.PCM16 else 58


def _header(codec: WavCodec, sample_rate: int, data_bytes: int | None) -> bytes:
    width = _bytes_per_sample(codec)
    unknown = data_bytes is None
    data_size = UNKNOWN_SIZE if data_bytes is None else data_bytes
    if not unknown and data_size > UNKNOWN_SIZE - header_size(codec):
        raise ValueError(f"{data_size} bytes of audio do not fit in a WAV file")
    fmt = struct.pack("<HHIIHH", int(codec), 1, sample_rate, sample_rate * width, width, 8 * width)
    chunks = []
    if codec == WavCodec.PCM16:
        chunks.append(b"fmt " + struct.pack("<I", 16) + fmt)
    else:
        samples = UNKNOWN_SIZE if unknown else data_size // width
        chunks.append(b"fmt " + struct.pack("<I", 18) + fmt + struct.pack("<H", 0))
        chunks.append(b"fact" + struct.pack("<II", 4, samples))
    body = b"WAVE" + b"".join(chunks) + b"data" + struct.pack("<I", data_size)
    pad = data_size & 1  # RIFF chunks are word-aligned; an odd data chunk is followed by a pad byte
    riff_size = UNKNOWN_SIZE if unknown else len(body) + data_size + pad
    return b"RIFF" + struct.pack("<I", riff_size) + body


def stream_header(codec: WavCodec, sample_rate: int) -> bytes:
    """Header for a live stream of unknown length.

    Args:
        codec: sample encoding.
        sample_rate: samples per second.

    Returns:
        The header bytes; raw sample data follows.
    """
    return _header(codec, sample_rate, None)


def file_header(codec: WavCodec, sample_rate: int, data_bytes: int) -> bytes:
    """Header for a complete file with ``data_bytes`` of sample data.

    Args:
        codec: sample encoding.
        sample_rate: samples per second.
        data_bytes: length of the data that follows. If odd, the caller appends one zero pad byte
            after the data (:func:`voxcast.audio.encode.encode_file` does).

    Returns:
        The header bytes.
    """
    return _header(codec, sample_rate, data_bytes)


def finalize_stream(streamed: bytes) -> bytes:
    """Rewrite a complete streamed WAV (from :func:`stream_header` + data) as a file with true sizes.

    Args:
        streamed: the streaming header followed by all sample data.

    Returns:
        The same audio with a :func:`file_header` (and a pad byte if the data length is odd).

    Raises:
        ValueError: ``streamed`` does not start with a header made by :func:`stream_header`.
    """
    if len(streamed) < 44 or streamed[:4] != b"RIFF" or streamed[8:16] != b"WAVEfmt ":
        raise ValueError("not a WAV stream")
    codec = WavCodec(struct.unpack_from("<H", streamed, 20)[0])
    sample_rate = struct.unpack_from("<I", streamed, 24)[0]
    size = header_size(codec)
    if streamed[size - 8 : size - 4] != b"data":
        raise ValueError("not a WAV stream made by stream_header()")
    data = streamed[size:]
    return file_header(codec, sample_rate, len(data)) + data + b"\0" * (len(data) & 1)


def data_span(head: bytes) -> tuple[int, int | None]:
    """Where the samples of a WAV file are, from the first bytes of the file.

    Args:
        head: the start of the file (at least up to the ``data`` chunk header; 64 bytes suffice for
            files written by this module or libsndfile).

    Returns:
        (offset of the first sample byte, number of sample bytes or ``None`` if the size is unknown
        because the file is a live stream). The RIFF pad byte after odd-length data is excluded.

    Raises:
        ValueError: not a RIFF/WAVE header, or the ``data`` chunk header is not within ``head``.
    """
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise ValueError("not a WAV file")
    pos = 12
    while pos + 8 <= len(head):
        chunk_id, size = head[pos : pos + 4], struct.unpack_from("<I", head, pos + 4)[0]
        if chunk_id == b"data":
            return pos + 8, None if size == UNKNOWN_SIZE else size
        pos += 8 + size + (size & 1)
    raise ValueError(f"no data chunk in the first {len(head)} bytes")
