"""Speech-shaped test signals: what loudness and quality checks can be measured on without a model.

:func:`speech_like` is noise with the long-term average spectrum of speech (flat to 500 Hz, falling
about 6 dB an octave above it, nothing below 80 Hz), modulated at a syllable rate of ~4 Hz and cut into
words and sentence pauses. Its energy, like speech's, sits mostly under 4 kHz, so an 8 kHz telephony
file keeps most of it, unlike the broadband noise of a random-weight model.
"""

from __future__ import annotations

import numpy as np

__all__ = ["speech_like"]


def speech_like(
    seconds: float = 2.0,
    sample_rate: int = 24000,
    *,
    seed: int = 0,
    level: float = 0.1,
    lead_s: float = 0.3,
    tail_s: float = 0.3,
    pause_s: float = 0.0,
) -> np.ndarray:
    """Float32 mono: ``lead_s`` of silence, ``seconds`` of speech-shaped sound (with one pause of
    ``pause_s`` in the middle when given), ``tail_s`` of silence. ``level`` is the RMS of the sound."""
    rng = np.random.default_rng(seed)
    n = round(seconds * sample_rate)
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1.0 / sample_rate)
    shape = np.where(f < 80, 0.0, np.where(f <= 500, 1.0, 500.0 / np.maximum(f, 1.0)))
    x = np.fft.irfft(spec * shape, n)
    t = np.arange(n) / sample_rate
    syllables = np.clip(np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, np.pi)), 0.0, None) ** 0.7
    x = x * syllables
    x *= level / max(float(np.sqrt(np.mean(x**2))), 1e-12)
    if pause_s > 0:
        half = n // 2
        x = np.concatenate([x[:half], np.zeros(round(pause_s * sample_rate)), x[half:]])
    pad = [np.zeros(round(s * sample_rate)) for s in (lead_s, tail_s)]
    return np.concatenate([pad[0], x, pad[1]]).astype(np.float32)
