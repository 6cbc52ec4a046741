"""Trim leading and trailing silence, keeping a configurable pad around the speech.

Frames of ``frame_ms`` are "active" when their RMS is within ``threshold_db`` of the loudest frame and
above an absolute floor (``floor_dbfs``). Everything from the first active frame to the end of the last
one is kept, plus ``pad_ms`` on each side, so nothing between (pauses inside a sentence, quiet
consonants next to louder ones) is ever removed; only the outer silence is cut. When the cut lands
inside non-zero audio, a short fade (``fade_ms``, inside the pad) avoids a click. Audio with no active
frame (digital silence, or only noise under the floor) is returned unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from voxcast.audio.pcm import to_float32

__all__ = [
    "DEFAULT_PAD_MS",
    "DEFAULT_THRESHOLD_DB",
    "SilenceProfile",
    "TrimResult",
    "active_frames",
    "active_span",
    "fade",
    "silence_profile",
    "trim_silence",
]

DEFAULT_PAD_MS = 100.0
"""Silence kept before and after speech: enough not to sound clipped when prompts are chained."""

DEFAULT_THRESHOLD_DB = -45.0
"""Frames more than 45 dB below the loudest frame count as silence (quiet fricatives sit ~30 dB down)."""

DEFAULT_FLOOR_DBFS = -70.0
"""Frames below this absolute RMS level never count as speech (dither, codec noise)."""


@dataclass(frozen=True, slots=True)
class TrimResult:
    """The outcome of :func:`trim_silence`.

    Attributes:
        pcm: the kept samples (float32).
        start: index of the first kept sample in the input.
        end: index one past the last kept sample in the input.
    """

    pcm: np.ndarray
    start: int
    end: int


def _frame_db(x: np.ndarray, frame: int) -> np.ndarray:
    n = -(-len(x) // frame)
    padded = np.zeros(n * frame, dtype=np.float64)
    padded[: len(x)] = x
    rms = np.sqrt(np.mean(padded.reshape(n, frame) ** 2, axis=1))
    with np.errstate(divide="ignore"):
        return 20.0 * np.log10(rms)


def active_frames(
    x: np.ndarray, sample_rate: int, threshold_db: float, floor_dbfs: float, frame_ms: float
) -> tuple[np.ndarray, int]:
    """Indices of the active frames of ``x`` (the activity rule) and the frame length in samples."""
    frame = max(1, round(sample_rate * frame_ms / 1000.0))
    if len(x) == 0:
        return np.zeros(0, dtype=np.int64), frame
    db = _frame_db(x, frame)
    return np.nonzero(db >= max(float(db.max()) + threshold_db, floor_dbfs))[0], frame


def fade(y: np.ndarray, n: int, head: bool = True, tail: bool = True) -> None:
    """Linear fades of ``n`` samples (at most half of ``y``) in at the head and out at the tail, in place."""
    n = min(n, len(y) // 2)
    if n <= 0:
        return
    ramp = np.linspace(0.0, 1.0, n, endpoint=False, dtype=np.float32)
    if head:
        y[:n] *= ramp
    if tail:
        y[len(y) - n :] *= ramp[::-1]


def active_span(
    pcm: np.ndarray,
    sample_rate: int,
    threshold_db: float = DEFAULT_THRESHOLD_DB,
    floor_dbfs: float = DEFAULT_FLOOR_DBFS,
    frame_ms: float = 10.0,
) -> tuple[int, int] | None:
    """Sample span ``[start, end)`` from the first to the end of the last active frame.

    Args:
        pcm: 1-D float32 (or int16) samples.
        sample_rate: samples per second.
        threshold_db: activity threshold relative to the loudest frame (negative dB).
        floor_dbfs: absolute RMS floor.
        frame_ms: analysis frame length.

    Returns:
        The span, or ``None`` when no frame is active.
    """
    x = to_float32(pcm)
    active, frame = active_frames(x, sample_rate, threshold_db, floor_dbfs, frame_ms)
    if len(active) == 0:
        return None
    return int(active[0]) * frame, min(len(x), (int(active[-1]) + 1) * frame)


@dataclass(frozen=True, slots=True)
class SilenceProfile:
    """Where a clip is silent (milliseconds), by the activity rule of :func:`active_span`.

    Attributes:
        leading_ms: silence before the first active frame (the whole clip when nothing is active).
        trailing_ms: silence after the last active frame.
        longest_pause_ms: longest run of silent frames between the first and last active frames.
        speech_ms: from the first active frame to the end of the last.
    """

    leading_ms: float
    trailing_ms: float
    longest_pause_ms: float
    speech_ms: float


def silence_profile(
    pcm: np.ndarray,
    sample_rate: int,
    threshold_db: float = DEFAULT_THRESHOLD_DB,
    floor_dbfs: float = DEFAULT_FLOOR_DBFS,
    frame_ms: float = 10.0,
) -> SilenceProfile:
    """Leading, trailing and longest internal silence of a clip (see :class:`SilenceProfile`)."""
    x = to_float32(pcm)
    ms = 1000.0 / sample_rate
    idx, frame = active_frames(x, sample_rate, threshold_db, floor_dbfs, frame_ms)
    if len(idx) == 0:
        return SilenceProfile(len(x) * ms, 0.0, 0.0, 0.0)
    first, last = int(idx[0]), int(idx[-1])
    gaps = np.diff(idx) - 1  # silent frames between consecutive active ones
    longest = int(gaps.max()) if len(gaps) else 0
    end = min(len(x), (last + 1) * frame)
    return SilenceProfile(
        first * frame * ms, (len(x) - end) * ms, longest * frame * ms, (end - first * frame) * ms
    )


def trim_silence(
    pcm: np.ndarray,
    sample_rate: int,
    pad_ms: float = DEFAULT_PAD_MS,
    threshold_db: float = DEFAULT_THRESHOLD_DB,
    floor_dbfs: float = DEFAULT_FLOOR_DBFS,
    frame_ms: float = 10.0,
    fade_ms: float = 5.0,
) -> TrimResult:
    """Cut leading/trailing silence down to ``pad_ms``.

    Args:
        pcm: 1-D float32 (or int16) samples.
        sample_rate: samples per second.
        pad_ms: silence to keep on each side of the active span (less if the input has less).
        threshold_db: activity threshold relative to the loudest frame.
        floor_dbfs: absolute RMS floor below which nothing is speech.
        frame_ms: analysis frame length.
        fade_ms: fade applied at a cut edge (capped at ``pad_ms``); 0 disables.

    Returns:
        A :class:`TrimResult`; the kept region always contains the whole active span.
    """
    x = to_float32(pcm)
    span = active_span(x, sample_rate, threshold_db, floor_dbfs, frame_ms)
    if span is None:
        return TrimResult(x.copy(), 0, len(x))
    pad = round(sample_rate * pad_ms / 1000.0)
    start, end = max(0, span[0] - pad), min(len(x), span[1] + pad)
    y = x[start:end].copy()
    fade(y, round(sample_rate * min(fade_ms, pad_ms) / 1000.0), head=start > 0, tail=end < len(x))
    return TrimResult(y, start, end)
