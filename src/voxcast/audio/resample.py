"""Sample-rate conversion from the native 24 kHz (or any rate) with libsoxr.

:class:`StreamResampler` converts a stream chunk by chunk. The one-shot :func:`resample` runs the very
same soxr stream over the whole signal, so the concatenation of everything a ``StreamResampler``
returns (including :meth:`StreamResampler.flush`) is bit-identical to ``resample`` of the
concatenated input, whatever the chunk sizes (soxr buffers its input internally; the tests check
random chunk schedules at every supported rate). The price is latency: soxr holds back a few
milliseconds of output (its filter delay) until more input or the flush arrives.
"""

from __future__ import annotations

import math

import numpy as np
import soxr

__all__ = ["RESAMPLE_QUALITY", "StreamResampler", "resample", "resample_fixed"]

RESAMPLE_QUALITY = "HQ"
"""soxr quality preset: 'HQ' is 20-bit precision, ample for 16-bit output and cheap enough for 2 cores."""


class StreamResampler:
    """Stateful mono resampler; equal rates pass through unchanged.

    Args:
        sr_in: input rate (Hz).
        sr_out: output rate (Hz).
        quality: soxr quality preset.
    """

    def __init__(self, sr_in: int, sr_out: int, quality: str = RESAMPLE_QUALITY) -> None:
        if sr_in <= 0 or sr_out <= 0:
            raise ValueError(f"sample rates must be positive, got {sr_in} -> {sr_out}")
        self.sr_in = sr_in
        self.sr_out = sr_out
        self._soxr = None if sr_in == sr_out else soxr.ResampleStream(sr_in, sr_out, 1, "float32", quality)
        self._flushed = False

    def process(self, x: np.ndarray) -> np.ndarray:
        """Resample the next chunk.

        Args:
            x: 1-D float32 samples at ``sr_in`` (may be empty).

        Returns:
            1-D float32 samples at ``sr_out`` (possibly fewer than the ratio suggests: soxr's delay).

        Raises:
            RuntimeError: called after :meth:`flush`.
        """
        if self._flushed:
            raise RuntimeError("StreamResampler used after flush()")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self._soxr is None:
            return x
        return self._soxr.resample_chunk(x, last=False)

    def flush(self) -> np.ndarray:
        """Return the samples soxr still holds and end the stream.

        Returns:
            1-D float32 tail (empty when rates are equal).
        """
        if self._flushed:
            raise RuntimeError("StreamResampler.flush() called twice")
        self._flushed = True
        if self._soxr is None:
            return np.zeros(0, dtype=np.float32)
        return self._soxr.resample_chunk(np.zeros(0, dtype=np.float32), last=True)


def resample(x: np.ndarray, sr_in: int, sr_out: int, quality: str = RESAMPLE_QUALITY) -> np.ndarray:
    """Resample a whole mono signal; identical to streaming it through :class:`StreamResampler`.

    Args:
        x: 1-D float samples at ``sr_in``.
        sr_in: input rate (Hz).
        sr_out: output rate (Hz).
        quality: soxr quality preset.

    Returns:
        1-D float32 samples at ``sr_out``, ``round(len(x) * sr_out / sr_in)`` long.
    """
    stream = StreamResampler(sr_in, sr_out, quality)
    head = stream.process(x)
    return np.concatenate([head, stream.flush()])


def resample_fixed(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """``librosa.resample(x, res_type="soxr_hq")`` bit for bit: soxr HQ, then the length fixed to
    librosa's ``ceil(n * (sr_out / sr_in))`` (computed in floating point, which can exceed the exact
    ceiling by one: 74970 samples at 44.1 -> 24 kHz give 40801), cut or zero-padded; float32."""
    if sr_in == sr_out:
        return np.ascontiguousarray(x, dtype=np.float32)
    n_out = math.ceil(x.shape[0] * (float(sr_out) / sr_in))
    out = soxr.resample(x, sr_in, sr_out, quality="HQ")
    if out.shape[0] > n_out:
        out = out[:n_out]
    elif out.shape[0] < n_out:
        out = np.pad(out, (0, n_out - out.shape[0]))
    return np.ascontiguousarray(out, dtype=np.float32)
