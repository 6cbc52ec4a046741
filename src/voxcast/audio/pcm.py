"""Sample conversions: float32 <-> int16 and G.711 mu-law / A-law.

float -> int16 multiplies by 32768, rounds half to even (``np.rint``) and clips to [-32768, 32767]:
int16 -> float -> int16 is lossless, and +1.0 becomes 32767 (one LSB of clipping at full scale).

G.711 encoders are vectorised lookups in 65536-entry tables built once from the G.711 segment rule;
the decoders are the exact 256-entry G.711 reconstruction tables (mu-law peaks at +-32124, A-law at
+-32256). A negative int16 sample is quantised by its magnitude (sign-magnitude), so
``encode(-x) == encode(x) ^ 0x80`` for every ``x`` in 1..32767; this matches libsndfile byte for byte
(the tests check all 65536 inputs). ITU-T G.191's reference code instead takes the one's complement of
negative samples, which puts 127 negative inputs per law, exactly at a step boundary, one step lower.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "alaw_decode",
    "alaw_encode",
    "float_to_int16",
    "int16_to_float",
    "mulaw_decode",
    "mulaw_encode",
    "to_float32",
]

_INT16_SCALE = 32768.0


def float_to_int16(x: np.ndarray) -> np.ndarray:
    """Convert float samples in [-1, 1] to int16.

    Args:
        x: float array (any shape).

    Returns:
        int16 array: ``clip(rint(x * 32768), -32768, 32767)``; NaN becomes 0.
    """
    y = np.rint(np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0) * _INT16_SCALE)
    return np.clip(y, -32768, 32767).astype(np.int16)


def int16_to_float(x: np.ndarray) -> np.ndarray:
    """Convert int16 samples to float32 in [-1, 1) (divides by 32768, exact).

    Args:
        x: int16 array.

    Returns:
        float32 array of the same shape.
    """
    return np.asarray(x, dtype=np.int16).astype(np.float32) / np.float32(_INT16_SCALE)


def to_float32(x: np.ndarray) -> np.ndarray:
    """Mono float32 view of engine audio: int16 is scaled, floats are cast, other dtypes rejected.

    Args:
        x: 1-D float or int16 samples.

    Returns:
        1-D float32 array.

    Raises:
        ValueError: not 1-D, or an unsupported dtype.
    """
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"expected mono 1-D audio, got shape {x.shape}")
    if x.dtype == np.int16:
        return int16_to_float(x)
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32, copy=False)
    raise ValueError(f"expected float or int16 audio, got {x.dtype}")


def _segment(magnitude: np.ndarray, first_top: int) -> np.ndarray:
    """Segment number 0..7 of a magnitude, with segment 0 ending below ``first_top``."""
    tops = first_top << np.arange(8)
    return np.minimum(np.searchsorted(tops, magnitude, side="right"), 7)


def _build_mulaw_table() -> np.ndarray:
    x = np.arange(-32768, 32768, dtype=np.int32)
    biased = np.minimum(np.abs(x) >> 2, 8158) + 33  # 14-bit magnitude + bias, at most 0x1FFF
    seg = _segment(biased, 0x40)
    code = (seg << 4) | ((biased >> (seg + 1)) & 0x0F)
    sign = np.where(x < 0, 0x00, 0x80)
    return ((code ^ 0x7F) | sign).astype(np.uint8)


def _build_alaw_table() -> np.ndarray:
    x = np.arange(-32768, 32768, dtype=np.int32)
    mag = np.minimum(np.abs(x) >> 4, 2047)  # 12-bit magnitude (13-bit A-law input without sign)
    seg = np.where(mag < 16, 0, _segment(mag, 32) + 1)
    seg = np.minimum(seg, 7)
    mant = np.where(seg == 0, mag, (mag >> np.maximum(seg - 1, 0)) & 0x0F)
    sign = np.where(x < 0, 0x00, 0x80)
    return (((seg << 4) | mant | sign) ^ 0x55).astype(np.uint8)


def _build_mulaw_decode() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exp = (u >> 4) & 0x07
    mag = ((((u & 0x0F) << 3) + 0x84) << exp) - 0x84
    return np.where(u & 0x80, -mag, mag).astype(np.int16)


def _build_alaw_decode() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a >> 4) & 0x07
    base = ((a & 0x0F) << 4) + np.where(seg == 0, 8, 0x108)
    mag = base << np.maximum(seg - 1, 0)
    return np.where(a & 0x80, mag, -mag).astype(np.int16)


_MULAW_ENC = _build_mulaw_table()
_ALAW_ENC = _build_alaw_table()
_MULAW_DEC = _build_mulaw_decode()
_ALAW_DEC = _build_alaw_decode()


def mulaw_encode(x: np.ndarray) -> np.ndarray:
    """G.711 mu-law encode.

    Args:
        x: int16 samples.

    Returns:
        uint8 codes, same shape.
    """
    return _MULAW_ENC[np.asarray(x, dtype=np.int16).view(np.uint16) ^ 0x8000]


def mulaw_decode(codes: np.ndarray) -> np.ndarray:
    """G.711 mu-law decode.

    Args:
        codes: uint8 codes (or ``bytes`` via ``np.frombuffer``).

    Returns:
        int16 samples, same shape.
    """
    return _MULAW_DEC[np.asarray(codes, dtype=np.uint8)]


def alaw_encode(x: np.ndarray) -> np.ndarray:
    """G.711 A-law encode (even bits inverted, as transmitted).

    Args:
        x: int16 samples.

    Returns:
        uint8 codes, same shape.
    """
    return _ALAW_ENC[np.asarray(x, dtype=np.int16).view(np.uint16) ^ 0x8000]


def alaw_decode(codes: np.ndarray) -> np.ndarray:
    """G.711 A-law decode.

    Args:
        codes: uint8 codes.

    Returns:
        int16 samples, same shape.
    """
    return _ALAW_DEC[np.asarray(codes, dtype=np.uint8)]
