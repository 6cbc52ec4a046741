"""Silence trimming keeps the whole speech region plus the pad."""

from __future__ import annotations

import numpy as np
import pytest

from voxcast.audio.trim import active_span, trim_silence

SR = 24000


def _clip(lead_s: float, speech_s: float, tail_s: float, seed: int = 0) -> tuple[np.ndarray, int, int]:
    """Silence + a 'word' (noise burst, a quiet fricative, a pause, a tone) + silence + faint noise."""
    rng = np.random.default_rng(seed)
    lead, speech, tail = (int(s * SR) for s in (lead_s, speech_s, tail_s))
    x = np.zeros(lead + speech + tail, np.float32)
    word = np.zeros(speech, np.float32)
    q = speech // 4
    word[:q] = 0.01 * rng.standard_normal(q)  # quiet onset "s" ~ -40 dBFS, 34 dB below the vowel
    word[q : 2 * q] = 0.5 * np.sin(2 * np.pi * 220 * np.arange(q) / SR)
    word[3 * q :] = 0.3 * rng.standard_normal(speech - 3 * q)  # after a silent pause
    x[lead : lead + speech] = word
    x += (1e-5 * rng.standard_normal(len(x))).astype(np.float32)  # -100 dBFS noise floor
    return x, lead, lead + speech


@pytest.mark.parametrize("pad_ms", [0.0, 50.0, 100.0, 250.0])
def test_trim_keeps_speech_and_pad(pad_ms: float) -> None:
    x, s0, s1 = _clip(0.8, 1.2, 1.5)
    res = trim_silence(x, SR, pad_ms=pad_ms)
    pad = int(pad_ms * SR / 1000)
    frame = SR // 100
    assert res.start <= s0 and res.end >= s1  # never cuts speech
    assert s0 - res.start <= pad + frame and res.end - s1 <= pad + frame
    assert s0 - res.start >= min(pad, s0) - 1
    kept_speech = res.pcm[s0 - res.start : s1 - res.start]
    np.testing.assert_array_equal(kept_speech, x[s0:s1])  # the fade stays inside the pad
    assert len(res.pcm) == res.end - res.start


def test_no_leading_silence_and_short_pads() -> None:
    x, _, _ = _clip(0.0, 0.5, 0.02)
    res = trim_silence(x, SR, pad_ms=100.0)
    assert res.start == 0 and res.end == len(x)


def test_silence_is_returned_unchanged() -> None:
    x = np.zeros(SR, np.float32)
    res = trim_silence(x, SR)
    assert (res.start, res.end) == (0, SR)
    assert active_span(np.zeros(0, np.float32), SR) is None
    quiet = (1e-5 * np.random.default_rng(1).standard_normal(SR)).astype(np.float32)
    assert active_span(quiet, SR) is None  # under the absolute floor


def test_int16_input() -> None:
    x, s0, s1 = _clip(0.5, 0.5, 0.5)
    res = trim_silence((x * 32767).astype(np.int16), SR, pad_ms=20.0)
    assert res.start <= s0 and res.end >= s1 and res.pcm.dtype == np.float32
