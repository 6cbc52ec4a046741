"""MP3 encoded as it comes (LAME through ``lameenc``): constant bit rate, mono, frames out as soon as
LAME has them (about 50 ms behind the input), no Xing/LAME info frame.

A stream's bytes are plain MPEG audio frames from the first one, so a player can start on the first
chunk and the concatenation of the chunks is the complete file. The output does not depend on how the
input was cut into chunks (LAME frames 1152 or 576 samples whatever it is given), so a stream and a
one-shot encoding of the same samples are byte for byte equal. Without an info frame a decoder does
not know LAME's delay and padding: decoded audio starts with about 50 ms of encoder delay and ends with
up to one frame of padding (as every headerless MP3 stream).
"""

from __future__ import annotations

import lameenc
import numpy as np

from voxcast.audio.pcm import float_to_int16

__all__ = ["BIT_RATES", "Mp3Encoder"]

BIT_RATES = {8000: 32, 16000: 48, 22050: 64, 24000: 64, 44100: 96, 48000: 96}
"""Kilobits per second (mono, CBR) for each output rate: transparent for speech at that rate."""

_QUALITY = 2
"""LAME's algorithm quality (2 = high; the cost is small next to the model's)."""


class Mp3Encoder:
    """One MP3 stream at ``sample_rate``.

    Raises:
        ValueError: a rate MP3 cannot carry here (see :data:`BIT_RATES`).
    """

    def __init__(self, sample_rate: int) -> None:
        if sample_rate not in BIT_RATES:
            raise ValueError(f"mp3 supports sample rates {sorted(BIT_RATES)}, not {sample_rate}")
        self._lame = lameenc.Encoder()
        self._lame.set_in_sample_rate(sample_rate)
        self._lame.set_out_sample_rate(sample_rate)
        self._lame.set_channels(1)
        self._lame.set_bit_rate(BIT_RATES[sample_rate])
        self._lame.set_quality(_QUALITY)
        self._lame.silence()
        self._started = False  # lameenc refuses to flush an encoder that was never given samples

    def encode(self, x: np.ndarray) -> bytes:
        """MP3 frames completed by these samples (float32 at the stream's rate); often ``b""`` for a
        few ms of input."""
        if len(x) == 0:
            return b""
        self._started = True
        return bytes(self._lame.encode(float_to_int16(x).astype("<i2", copy=False).tobytes()))

    def finish(self) -> bytes:
        """The last frames (LAME's buffered samples, padded to a whole frame)."""
        return bytes(self._lame.flush()) if self._started else b""
