"""Speaking rate: time-scale modification that keeps the pitch (WSOLA), streamed exactly.

Neither model has a speaking-rate control, so a request's ``speed`` (OpenAI's field, 0.25-4.0) is
applied to the audio: :class:`TimeStretch` shortens or lengthens it by ``1 / speed`` without changing
its pitch, by waveform-similarity overlap-add (WSOLA, Verhelst and Roelands 1993). Output frames of
``FRAME_MS`` (Hann-windowed, half overlapping, so the windows sum to one) are copied from the input
at ``speed`` times the output's pace, each shifted by up to ``TOLERANCE_MS`` to where the input
looks most like the natural continuation of the frame before it (the largest cross-correlation,
normalised by the candidate's energy so that loud stretches do not win by loudness alone; at speed
1.0 that is the continuation itself, and the input comes back unchanged; in digital silence, with
nothing to align, the continuation is kept), so pitch periods line up and nothing is pitch-shifted
or phase-smeared.

Streaming is exact: a frame is placed only once every input sample its search can look at has
arrived, and :meth:`TimeStretch.finish` pads the end with zeros the same way whatever came before,
so the concatenated outputs of any chunk schedule equal the one-shot :func:`stretch` bit for bit.
The price is latency: about ``FRAME_MS + TOLERANCE_MS`` of input (35 ms) is held back until more
arrives or the stream finishes. The output is ``round(len(input) / speed)`` samples long.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FRAME_MS", "METHOD", "TOLERANCE_MS", "TimeStretch", "check_speed", "stretch"]

FRAME_MS = 25.0
"""Output frame length: two or more pitch periods of speech."""

TOLERANCE_MS = 10.0
"""How far a frame may move from its nominal input position to line up with the one before it."""

METHOD = "wsola-25-10"
"""What produced the audio (part of cache keys: a change to the method or its constants changes it)."""

MIN_SPEED, MAX_SPEED = 0.25, 4.0


def check_speed(speed: float) -> float:
    """``speed`` as a float, or ValueError when it is not a number within [0.25, 4.0]."""
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"{speed!r} is not a number from {MIN_SPEED} to {MAX_SPEED}")
    return float(speed)


class TimeStretch:
    """Stateful WSOLA for one mono stream.

    Args:
        speed: the rate factor (2.0 speaks twice as fast: half the samples); 0.25-4.0.
        sample_rate: the audio's rate (Hz).

    Feed chunks to :meth:`process` (float32, any length, also empty) and call :meth:`finish` once.
    """

    def __init__(self, speed: float, sample_rate: int) -> None:
        self.speed = check_speed(speed)
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, not {sample_rate}")
        self._hop = max(1, round(sample_rate * FRAME_MS / 2000))  # output hop: half a frame
        self._n = 2 * self._hop
        self._tol = round(sample_rate * TOLERANCE_MS / 1000)
        n = np.arange(self._n)
        self._window = (0.5 - 0.5 * np.cos(2 * np.pi * n / self._n)).astype(np.float32)  # periodic Hann
        # The input is taken as preceded by one hop of zeros, so that the first output samples get
        # both halves of the overlap (full gain); the output's first hop is dropped in exchange.
        self._buf = np.zeros(self._hop, dtype=np.float32)
        self._base = 0  # absolute index (in the zero-led input) of _buf[0]
        self._inputs = 0  # samples received
        self._k = 0  # the next frame
        self._prev = 0  # where the previous frame was taken from (absolute)
        self._acc = np.zeros(self._n, dtype=np.float32)  # output from frame _k on, not final yet
        self._emitted = 0  # output samples returned (the zero-led output's first hop excluded)
        self._finished = False

    def _nominal(self, k: int) -> int:
        return round(k * self._hop * self.speed)

    def _need(self, k: int) -> int:
        """The absolute end of the input that frame ``k`` reads (its search and its template)."""
        if k == 0:
            return self._n
        return max(self._nominal(k) + self._tol, self._prev + self._hop) + self._n

    def _take(self, start: int, length: int) -> np.ndarray:
        return self._buf[start - self._base : start - self._base + length]

    def _place(self, k: int) -> np.ndarray:
        """Put frame ``k`` (its input present) into the output; returns the output it completed."""
        if k == 0:
            start = 0
        else:
            template = self._take(self._prev + self._hop, self._n)  # the natural continuation
            lo = max(0, self._nominal(k) - self._tol)
            hi = self._nominal(k) + self._tol
            region = self._take(lo, hi - lo + self._n)
            corr = np.correlate(region, template, mode="valid").astype(np.float64)
            squares = np.concatenate([[0.0], np.cumsum(region.astype(np.float64) ** 2)])
            energy = squares[self._n :] - squares[: -self._n]  # of each candidate
            scores = corr / np.sqrt(np.maximum(energy, 1e-12))
            best = int(np.argmax(scores))
            # silence (or nothing alike): the natural continuation, within the search range
            natural = min(max(self._prev + self._hop, lo), hi)
            start = natural if scores[best] <= 0.0 else lo + best
        self._prev = start
        self._acc += self._window * self._take(start, self._n)
        done = self._acc[: self._hop].copy()
        self._acc = np.concatenate([self._acc[self._hop :], np.zeros(self._hop, dtype=np.float32)])
        # drop input no later frame can reach: they start at or after min(nominal - tol, prev + hop)
        keep_from = min(max(0, self._nominal(k + 1) - self._tol), start + self._hop)
        if keep_from > self._base:
            self._buf = self._buf[keep_from - self._base :]
            self._base = keep_from
        return done

    def _next(self) -> np.ndarray:
        """Place the next frame; the output it completed (none for frame 0: the zero lead's hop)."""
        done = self._place(self._k)
        self._k += 1
        return done if self._k > 1 else done[:0]

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """Stretch the next chunk; returns the output now final (possibly empty)."""
        if self._finished:
            raise RuntimeError("TimeStretch.process() after finish()")
        x = np.asarray(pcm, dtype=np.float32).reshape(-1)
        self._inputs += len(x)
        self._buf = np.concatenate([self._buf, x])
        out = []
        while self._need(self._k) <= self._base + len(self._buf):
            out.append(self._next())
        return self._count(np.concatenate(out) if out else np.zeros(0, dtype=np.float32))

    def finish(self) -> np.ndarray:
        """The rest of the output: the input's end padded with zeros, cut to ``round(inputs / speed)``
        samples in all."""
        if self._finished:
            raise RuntimeError("TimeStretch.finish() called twice")
        self._finished = True
        left = round(self._inputs / self.speed) - self._emitted
        out = []
        while left > 0:
            pad = self._need(self._k) - (self._base + len(self._buf))
            if pad > 0:
                self._buf = np.concatenate([self._buf, np.zeros(pad, dtype=np.float32)])
            done = self._next()[:left]
            left -= len(done)
            out.append(done)
        return self._count(np.concatenate(out) if out else np.zeros(0, dtype=np.float32))

    def _count(self, out: np.ndarray) -> np.ndarray:
        self._emitted += len(out)
        return out


def stretch(pcm: np.ndarray, speed: float, sample_rate: int) -> np.ndarray:
    """The one-shot stretch of a whole signal (the reference for :class:`TimeStretch`'s streams)."""
    ts = TimeStretch(speed, sample_rate)
    head = ts.process(pcm)
    return np.concatenate([head, ts.finish()])
