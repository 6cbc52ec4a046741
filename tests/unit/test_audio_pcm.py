"""G.711 and int16 conversions, checked against libsndfile over every int16 input."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.pcm import (
    alaw_decode,
    alaw_encode,
    float_to_int16,
    int16_to_float,
    mulaw_decode,
    mulaw_encode,
    to_float32,
)

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)
ALL_CODES = np.arange(256, dtype=np.uint8)


def _sf_encode(x: np.ndarray, subtype: str) -> np.ndarray:
    buf = io.BytesIO()
    sf.write(buf, x, 8000, format="RAW", subtype=subtype)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def _sf_decode(codes: np.ndarray, subtype: str) -> np.ndarray:
    raw = io.BytesIO(codes.tobytes())
    data, _ = sf.read(raw, dtype="int16", samplerate=8000, channels=1, format="RAW", subtype=subtype)
    return data


@pytest.mark.parametrize(("encode", "subtype"), [(mulaw_encode, "ULAW"), (alaw_encode, "ALAW")])
def test_encode_matches_libsndfile_for_every_int16(encode, subtype) -> None:
    np.testing.assert_array_equal(encode(ALL_INT16), _sf_encode(ALL_INT16, subtype))


@pytest.mark.parametrize(("decode", "subtype"), [(mulaw_decode, "ULAW"), (alaw_decode, "ALAW")])
def test_decode_matches_libsndfile_for_every_code(decode, subtype) -> None:
    np.testing.assert_array_equal(decode(ALL_CODES), _sf_decode(ALL_CODES, subtype))


def test_g711_reconstruction_values_from_the_itu_tables() -> None:
    """Decoder outputs equal G.711 Tables 1a/2a: segment s, step m, scaled to int16."""
    mu, a = mulaw_decode(ALL_CODES), alaw_decode(ALL_CODES)
    for s in range(8):
        for m in range(16):
            # mu-law (14-bit units x 4): y = ((2m + 33) << s) - 33; code bits are inverted
            mu_code = 0x80 | (~((s << 4) | m) & 0x7F)
            y_mu = 4 * (((2 * m + 33) << s) - 33)
            assert (mu[mu_code], mu[mu_code & 0x7F]) == (y_mu, -y_mu)
            # A-law (12-bit units x 8... i.e. x16 with the half step): even bits inverted (^ 0x55)
            y_a = 8 * (2 * m + 1) if s == 0 else 8 * ((2 * m + 33) << (s - 1))
            a_code = (0x80 | (s << 4) | m) ^ 0x55
            assert (a[a_code], a[a_code ^ 0x80]) == (y_a, -y_a)
    assert (mu[0xFF], mu[0x80], a[0xD5], a[0xAA]) == (0, 32124, 8, 32256)


@pytest.mark.parametrize(("encode", "decode"), [(mulaw_encode, mulaw_decode), (alaw_encode, alaw_decode)])
def test_codes_round_trip_and_sign_symmetry(encode, decode) -> None:
    np.testing.assert_array_equal(encode(decode(ALL_CODES))[ALL_CODES != 0x7F], ALL_CODES[ALL_CODES != 0x7F])
    pos = np.arange(1, 32768, dtype=np.int16)
    np.testing.assert_array_equal(encode(-pos), encode(pos) ^ 0x80)


@pytest.mark.parametrize(("encode", "decode"), [(mulaw_encode, mulaw_decode), (alaw_encode, alaw_decode)])
def test_quantisation_error_is_bounded_by_half_a_step(encode, decode) -> None:
    x = ALL_INT16[(ALL_INT16 > -32000) & (ALL_INT16 < 32000)].astype(np.int32)
    err = np.abs(decode(encode(x.astype(np.int16))).astype(np.int32) - x)
    # top segment step is 1024 int16 units: half a step plus the 14/13-bit truncation
    assert err.max() <= 512 + 16
    big = np.abs(x) > 1024
    assert (err[big] / np.abs(x[big])).max() < 0.035  # ~1/32 relative: 4 mantissa bits + sign


def test_float_int16_conversion() -> None:
    np.testing.assert_array_equal(float_to_int16(int16_to_float(ALL_INT16)), ALL_INT16)
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, np.nan, 1.5 / 32768, 2.5 / 32768], dtype=np.float32)
    np.testing.assert_array_equal(
        float_to_int16(x), np.array([0, 16384, -16384, 32767, -32768, 32767, -32768, 0, 2, 2], np.int16)
    )
    assert int16_to_float(np.array([-32768], np.int16))[0] == -1.0


def test_to_float32_accepts_int16_and_floats_only() -> None:
    assert to_float32(np.array([16384], np.int16))[0] == 0.5
    assert to_float32(np.array([0.25], np.float64)).dtype == np.float32
    with pytest.raises(ValueError):
        to_float32(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError):
        to_float32(np.zeros(4, np.int32))
