"""StreamEncoder vs encode_file: streamed chunks concatenate to exactly the one-shot encoding."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.encode import StreamEncoder, encode_file, stream_to_file
from voxcast.audio.formats import (
    NATIVE_SAMPLE_RATE,
    OPUS_SAMPLE_RATES,
    SUPPORTED_SAMPLE_RATES,
    AudioFormat,
)
from voxcast.audio.pcm import alaw_decode, alaw_encode, float_to_int16, mulaw_decode, mulaw_encode
from voxcast.audio.resample import resample

_LAWS = {AudioFormat.MULAW: (mulaw_encode, mulaw_decode), AudioFormat.ALAW: (alaw_encode, alaw_decode)}
RAW_FORMATS = [AudioFormat.PCM, AudioFormat.WAV, AudioFormat.MULAW, AudioFormat.ALAW]


def _speechlike(seconds: float, seed: int = 0) -> np.ndarray:
    """A sine sweep with seeded noise bursts: deterministic, broadband, with quiet gaps."""
    sr = NATIVE_SAMPLE_RATE
    t = np.arange(int(seconds * sr)) / sr
    sweep = 0.4 * np.sin(2 * np.pi * (100 * t + 2000 * t**2 / seconds))
    rng = np.random.default_rng(seed)
    bursts = np.zeros_like(t)
    for start in rng.uniform(0, seconds - 0.1, size=4):
        i = int(start * sr)
        bursts[i : i + 2400] = 0.3 * rng.standard_normal(2400)
    return (sweep + bursts).astype(np.float32)


def _stream(fmt: AudioFormat, sr: int, x: np.ndarray, seed: int) -> list[bytes]:
    enc = StreamEncoder(fmt, sr)
    rng = np.random.default_rng(seed)
    out, pos = [], 0
    while pos < len(x):
        size = int(rng.choice([0, 1, 960, 1920, int(rng.integers(1, 5000))]))
        out.append(enc.encode(x[pos : pos + size]))
        pos += size
    out.append(enc.finish())
    return out


@pytest.mark.parametrize("sr", SUPPORTED_SAMPLE_RATES)
@pytest.mark.parametrize("fmt", RAW_FORMATS)
def test_streamed_raw_formats_equal_one_shot(fmt: AudioFormat, sr: int) -> None:
    x = _speechlike(0.9, seed=sr)
    chunks = _stream(fmt, sr, x, seed=sr + 1)
    streamed = b"".join(chunks)
    whole = encode_file(x, fmt, sr)
    assert stream_to_file(fmt, sr, streamed) == whole
    if fmt == AudioFormat.WAV:
        assert chunks[0][:4] == b"RIFF" and b"RIFF" not in b"".join(chunks[1:])
        assert streamed[44:] == whole[44:]
    elif fmt == AudioFormat.PCM:
        assert streamed == whole
    else:
        assert streamed == whole[58 : 58 + len(streamed)]  # the G.711 WAV header is 58 bytes


@pytest.mark.parametrize("sr", SUPPORTED_SAMPLE_RATES)
@pytest.mark.parametrize("fmt", [AudioFormat.WAV, AudioFormat.MULAW, AudioFormat.ALAW])
def test_wav_files_decode_to_rate_length_and_subtype(fmt: AudioFormat, sr: int) -> None:
    x = _speechlike(0.5)
    data = encode_file(x, fmt, sr)
    info = sf.info(io.BytesIO(data))
    subtype = {AudioFormat.WAV: "PCM_16", AudioFormat.MULAW: "ULAW", AudioFormat.ALAW: "ALAW"}[fmt]
    assert (info.format, info.subtype, info.samplerate, info.channels) == ("WAV", subtype, sr, 1)
    assert abs(info.frames - len(x) * sr / NATIVE_SAMPLE_RATE) <= 1
    back, _ = sf.read(io.BytesIO(data), dtype="int16")
    expected = float_to_int16(resample(x, NATIVE_SAMPLE_RATE, sr))
    if fmt == AudioFormat.WAV:
        np.testing.assert_array_equal(back, expected)
    else:  # G.711: libsndfile decodes our codes to the G.711 reconstruction of the int16 samples
        law_encode, law_decode = _LAWS[fmt]
        np.testing.assert_array_equal(back, law_decode(law_encode(expected)))


def test_mulaw_stream_is_raw_g711() -> None:
    x = _speechlike(0.3)
    streamed = b"".join(_stream(AudioFormat.MULAW, 8000, x, seed=3))
    decoded = mulaw_decode(np.frombuffer(streamed, np.uint8))
    assert len(decoded) == round(len(x) / 3)
    assert np.corrcoef(decoded, float_to_int16(resample(x, 24000, 8000)))[0, 1] > 0.999


def test_flac_is_lossless_and_streams_as_it_goes() -> None:
    """Bytes leave before the end; the streamed file is the whole encoding once its header's sample
    count is filled in, and it decodes to our int16 rounding exactly."""
    x = _speechlike(1.0)
    for sr in SUPPORTED_SAMPLE_RATES:
        chunks = _stream(AudioFormat.FLAC, sr, x, seed=sr)
        assert b"".join(chunks[:-1])  # not all at the end
        whole = encode_file(x, AudioFormat.FLAC, sr)
        assert stream_to_file(AudioFormat.FLAC, sr, b"".join(chunks)) == whole
        back, rate = sf.read(io.BytesIO(whole), dtype="int16")
        assert rate == sr
        np.testing.assert_array_equal(back, float_to_int16(resample(x, NATIVE_SAMPLE_RATE, sr)))


@pytest.mark.parametrize("fmt", [AudioFormat.MP3, AudioFormat.OPUS, AudioFormat.AAC])
def test_lossy_files_decode_to_rate_and_length(fmt: AudioFormat) -> None:
    """Every chunking gives the bytes of the whole encoding; they decode to the rate and length."""
    x = _speechlike(1.0)
    rates = OPUS_SAMPLE_RATES if fmt == AudioFormat.OPUS else SUPPORTED_SAMPLE_RATES
    for sr in rates:
        data = b"".join(_stream(fmt, sr, x, seed=sr))
        assert data == encode_file(x, fmt, sr)
        back, rate = _decode(data, fmt)
        assert rate == (48000 if fmt == AudioFormat.OPUS else sr)  # Opus decodes at 48 kHz
        # decoders may add an encoder delay's worth of samples (AAC: its 1024-sample priming, and a
        # last frame's padding); a headerless MP3 stream keeps LAME's delay and padding (< 160 ms at
        # 8 kHz, where a frame is 72 ms)
        slack = {AudioFormat.MP3: 0.16, AudioFormat.OPUS: 0.06, AudioFormat.AAC: 2048 / sr + 0.01}[fmt]
        assert abs(len(back) / rate - len(x) / NATIVE_SAMPLE_RATE) < slack
        assert 0.05 < float(np.sqrt(np.mean(back**2))) < 0.6


def _decode(data: bytes, fmt: AudioFormat) -> tuple[np.ndarray, int]:
    """Decoded mono float32 and its rate (PyAV: libsndfile reads no AAC)."""
    import av

    with av.open(io.BytesIO(data)) as f:
        frames = [fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)]
        rate = f.streams.audio[0].sample_rate
    pcm = np.concatenate(frames)
    scale = 32768.0 if np.issubdtype(pcm.dtype, np.integer) else 1.0
    return (pcm / scale).astype(np.float32), rate


@pytest.mark.parametrize(
    ("fmt", "sr"), [(AudioFormat.OPUS, 48000), (AudioFormat.OPUS, 8000), (AudioFormat.AAC, 24000)]
)
def test_opus_and_aac_stream_within_the_first_chunks(fmt: AudioFormat, sr: int) -> None:
    """Opus: the headers and a page per 20 ms frame from the first 80 ms chunk; AAC: ADTS frames
    once its 1024-sample priming is filled (the second chunk)."""
    x = _speechlike(1.0)
    enc = StreamEncoder(fmt, sr)
    assert enc.streamable
    first = [enc.encode(x[i : i + 1920]) for i in range(0, 4 * 1920, 1920)]
    assert first[1] and sum(map(len, first)) > 200
    assert fmt != AudioFormat.OPUS or first[0].startswith(b"OggS")
    assert fmt != AudioFormat.AAC or first[1][:2] in (b"\xff\xf1", b"\xff\xf9")  # ADTS sync word


def test_an_empty_stream_has_no_file() -> None:
    for fmt in (AudioFormat.FLAC, AudioFormat.OPUS, AudioFormat.AAC):
        enc = StreamEncoder(fmt, 24000)
        with pytest.raises(ValueError, match="empty"):
            enc.finish()
        with pytest.raises(ValueError, match="empty"):
            encode_file(np.zeros(0, np.float32), fmt, 24000)


def test_mp3_streams_frames_as_it_goes_whatever_the_chunking() -> None:
    """Bytes leave within the first 150 ms of audio (plain MPEG frames, no header to wait for or
    patch) and every chunking gives the same file."""
    x = _speechlike(2.0)
    for sr in SUPPORTED_SAMPLE_RATES:
        enc = StreamEncoder(AudioFormat.MP3, sr)
        assert enc.streamable and enc.content_type == "audio/mpeg"
        first = enc.encode(x[: NATIVE_SAMPLE_RATE * 15 // 100])  # LAME's look-ahead: < 150 ms at every rate
        assert first[:2] in (b"\xff\xf3", b"\xff\xfb", b"\xff\xe3")  # an MPEG frame header
        chunkings = {b"".join(_stream(AudioFormat.MP3, sr, x, seed=s)) for s in range(3)}
        assert chunkings == {encode_file(x, AudioFormat.MP3, sr)}


def test_opus_rejects_rates_it_cannot_carry() -> None:
    for sr in (22050, 44100):
        with pytest.raises(ValueError):
            StreamEncoder(AudioFormat.OPUS, sr)
        with pytest.raises(ValueError):
            encode_file(np.zeros(100, np.float32), AudioFormat.OPUS, sr)
    with pytest.raises(ValueError):
        StreamEncoder(AudioFormat.WAV, 11025)


def test_encoder_attributes_and_lifecycle() -> None:
    enc = StreamEncoder(AudioFormat.MULAW, 8000)
    assert enc.streamable and enc.content_type == "audio/PCMU;rate=8000"
    assert (enc.file_content_type, enc.file_extension) == ("audio/wav", "wav")
    opus = StreamEncoder(AudioFormat.OPUS, 24000)
    assert opus.streamable and opus.file_extension == "opus"
    aac = StreamEncoder(AudioFormat.AAC, 44100)
    assert (aac.content_type, aac.file_extension) == ("audio/aac", "aac")
    assert StreamEncoder(AudioFormat.MP3, 8000).streamable
    enc.finish()
    with pytest.raises(RuntimeError):
        enc.encode(np.zeros(10, np.float32))
    with pytest.raises(RuntimeError):
        enc.finish()


def test_empty_streams() -> None:
    wav = StreamEncoder(AudioFormat.WAV, 16000)
    hdr = wav.finish()
    assert len(hdr) == 44
    assert sf.info(io.BytesIO(stream_to_file(AudioFormat.WAV, 16000, hdr))).frames == 0
    assert StreamEncoder(AudioFormat.PCM, 8000).finish() == b""
    assert StreamEncoder(AudioFormat.MP3, 24000).finish() == b""  # no audio, no frames
    with pytest.raises(ValueError):
        StreamEncoder(AudioFormat.FLAC, 24000).finish()


def test_int16_input_is_accepted() -> None:
    x = _speechlike(0.2)
    as_int = float_to_int16(x)
    assert encode_file(as_int, AudioFormat.PCM, 24000) == as_int.astype("<i2").tobytes()
