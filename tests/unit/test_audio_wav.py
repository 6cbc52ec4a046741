"""WAV headers: streaming (unknown size) and file (true sizes), read back by libsndfile."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.pcm import alaw_encode, mulaw_encode
from voxcast.audio.wav import (
    UNKNOWN_SIZE,
    WavCodec,
    data_span,
    file_header,
    finalize_stream,
    header_size,
    stream_header,
)

_SUBTYPES = {WavCodec.PCM16: "PCM_16", WavCodec.MULAW: "ULAW", WavCodec.ALAW: "ALAW"}


def _samples(n: int) -> np.ndarray:
    return (8000 * np.sin(np.arange(n) * 0.05)).astype(np.int16)


def _data(codec: WavCodec, x: np.ndarray) -> bytes:
    if codec == WavCodec.MULAW:
        return mulaw_encode(x).tobytes()
    if codec == WavCodec.ALAW:
        return alaw_encode(x).tobytes()
    return x.astype("<i2").tobytes()


@pytest.mark.parametrize("codec", list(WavCodec))
@pytest.mark.parametrize("n", [0, 1, 801])
def test_file_header_matches_libsndfile(codec: WavCodec, n: int) -> None:
    x = _samples(n)
    data = _data(codec, x)
    ours = file_header(codec, 8000, len(data)) + data + b"\0" * (len(data) & 1)
    assert len(file_header(codec, 8000, 0)) == header_size(codec)
    info = sf.info(io.BytesIO(ours))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (8000, 1, n, _SUBTYPES[codec])
    ref = io.BytesIO()
    sf.write(ref, x, 8000, format="WAV", subtype=_SUBTYPES[codec])
    assert ours == ref.getvalue()  # same layout as libsndfile (pad byte included), byte for byte
    offset, length = data_span(ours[:64])
    assert ours[offset : offset + length] == data
    back, _ = sf.read(io.BytesIO(ours), dtype="int16")
    ref_back, _ = sf.read(io.BytesIO(ref.getvalue()), dtype="int16")
    np.testing.assert_array_equal(back, ref_back)


@pytest.mark.parametrize("codec", list(WavCodec))
def test_stream_header_reads_to_the_end_and_finalizes(codec: WavCodec) -> None:
    x = _samples(1601)
    hdr = stream_header(codec, 16000)
    assert struct.unpack_from("<I", hdr, 4)[0] == UNKNOWN_SIZE
    assert struct.unpack_from("<I", hdr, len(hdr) - 4)[0] == UNKNOWN_SIZE
    streamed = hdr + _data(codec, x)
    back, sr = sf.read(io.BytesIO(streamed), dtype="int16")
    assert sr == 16000 and len(back) == len(x)
    final = finalize_stream(streamed)
    data = _data(codec, x)
    assert final == file_header(codec, 16000, len(data)) + data + b"\0" * (len(data) & 1)
    assert sf.info(io.BytesIO(final)).frames == len(x)


def test_data_span_of_a_stream_and_of_garbage() -> None:
    assert data_span(stream_header(WavCodec.MULAW, 8000)) == (58, None)
    with pytest.raises(ValueError):
        data_span(b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0")
    with pytest.raises(ValueError):
        data_span(b"ID3" + b"\0" * 40)


def test_finalize_rejects_non_wav() -> None:
    with pytest.raises(ValueError):
        finalize_stream(b"OggS" + b"\0" * 60)
