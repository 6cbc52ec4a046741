"""Reference audio: containers, rates and channels are normalised; bad clips are refused clearly."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.reference import (
    MAX_DURATION_S,
    MIN_DURATION_S,
    SAMPLE_RATE,
    load_reference_audio,
    prepare_reference_audio,
)
from voxcast.errors import InvalidRequest


def _tone(seconds: float, sr: int, channels: int = 1, amp: float = 0.3) -> np.ndarray:
    t = np.arange(round(seconds * sr)) / sr
    mono = amp * np.sin(2 * np.pi * 220 * t)
    if channels == 1:
        return mono.astype(np.float32)
    return np.stack([mono * (1 + 0.1 * c) for c in range(channels)], axis=1).astype(np.float32)


def _encode(wav: np.ndarray, sr: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, wav, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fmt", "subtype", "sr", "channels"),
    [
        ("WAV", "PCM_16", 24000, 1),
        ("WAV", "FLOAT", 48000, 2),
        ("WAV", "PCM_24", 16000, 1),
        ("FLAC", None, 44100, 2),
        ("FLAC", None, 22050, 1),
        ("OGG", "VORBIS", 48000, 2),
        ("OGG", "OPUS", 48000, 1),
        ("MP3", None, 44100, 2),
        ("AIFF", None, 8000, 1),
    ],
)
def test_containers_rates_channels(fmt: str, subtype: str | None, sr: int, channels: int) -> None:
    data = _encode(_tone(2.0, sr, channels), sr, fmt, subtype)
    wav = load_reference_audio(data)
    assert wav.dtype == np.float32 and wav.ndim == 1
    assert abs(wav.shape[0] / SAMPLE_RATE - 2.0) < 0.1  # lossy codecs may pad a little
    # the 220 Hz tone survives decode + resample
    spec = np.abs(np.fft.rfft(wav[:SAMPLE_RATE]))
    assert abs(np.argmax(spec) - 220) <= 2


def test_path_and_bytes_agree(tmp_path: Path) -> None:
    data = _encode(_tone(1.5, 44100, 2), 44100, "FLAC")
    p = tmp_path / "ref.flac"
    p.write_bytes(data)
    assert np.array_equal(load_reference_audio(p), load_reference_audio(data))
    assert np.array_equal(load_reference_audio(str(p)), load_reference_audio(data))


def test_24k_mono_is_passed_through_exactly() -> None:
    wav = _tone(2.0, SAMPLE_RATE)
    assert np.array_equal(load_reference_audio(_encode(wav, SAMPLE_RATE, "WAV", "FLOAT")), wav)


def test_downmix_is_channel_mean() -> None:
    st = _tone(2.0, SAMPLE_RATE, 2)
    assert np.allclose(prepare_reference_audio(st, SAMPLE_RATE), st.mean(axis=1), atol=1e-7)


def test_resampled_length_is_ceil() -> None:
    for sr, n in ((44100, 44100 * 2 + 7), (16000, 16000 * 2 + 1), (48000, 48000 * 2 + 1)):
        out = prepare_reference_audio(np.full(n, 0.1, dtype=np.float32), sr)
        assert out.shape[0] == -(-n * SAMPLE_RATE // sr)
    # as librosa: the float quotient's ceil, one more than the exact 40800 here
    assert prepare_reference_audio(np.full(74970, 0.1, dtype=np.float32), 44100).shape[0] == 40801


def _err(data: object) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        load_reference_audio(data)  # type: ignore[arg-type]
    assert e.value.field == "ref_audio"
    return e.value


def test_empty_and_undecodable(tmp_path: Path) -> None:
    assert "empty" in _err(b"").message
    assert "decoded" in _err(b"RIFF\x00\x00garbage" * 10).message
    assert "decoded" in _err(np.random.default_rng(0).bytes(5000)).message
    assert "not found" in _err(tmp_path / "missing.wav").message
    (tmp_path / "empty.wav").write_bytes(b"")
    assert "empty" in _err(tmp_path / "empty.wav").message


def test_too_short_too_long_silent() -> None:
    assert "too short" in _err(_encode(_tone(MIN_DURATION_S * 0.5, 24000), 24000, "WAV")).message
    assert "too long" in _err(_encode(_tone(MAX_DURATION_S + 2, 16000), 16000, "FLAC")).message
    assert "too long" in _err(_encode(_tone(MAX_DURATION_S * 3, 8000), 8000, "WAV")).message
    assert "silent" in _err(_encode(np.zeros(48000, dtype=np.float32), 24000, "WAV")).message
    header_only = _encode(np.zeros(0, dtype=np.float32), 24000, "WAV")
    assert "no samples" in _err(header_only).message


def test_non_finite_and_bad_rate() -> None:
    wav = _tone(2.0, SAMPLE_RATE)
    wav[100] = np.nan
    with pytest.raises(InvalidRequest, match="NaN"):
        prepare_reference_audio(wav, SAMPLE_RATE)
    with pytest.raises(InvalidRequest, match="sample rate"):
        prepare_reference_audio(_tone(2.0, SAMPLE_RATE), 0)
