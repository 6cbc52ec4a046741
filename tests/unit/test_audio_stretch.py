"""Speaking rate (``speed``): WSOLA time-stretching that keeps the pitch, streamed exactly."""

from __future__ import annotations

import numpy as np
import pytest

from voxcast.audio.stretch import TimeStretch, check_speed, stretch
from voxcast.cache.audio import AudioCache
from voxcast.engine.request import parse_request
from voxcast.errors import InvalidRequest

SR = 24000


def _voiced(seconds: float, f0: float = 140.0, seed: int = 0) -> np.ndarray:
    """A speech-like test signal: a harmonic tone whose pitch glides, under a syllable envelope, with
    a little noise (deterministic)."""
    t = np.arange(int(SR * seconds)) / SR
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.1 * np.sin(2 * np.pi * 0.7 * t))) / SR
    tone = sum(np.sin(h * phase) / h for h in range(1, 6))
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t)
    noise = 0.01 * np.random.default_rng(seed).standard_normal(len(t))
    return (0.3 * tone * envelope + noise).astype(np.float32)


def _dominant_hz(x: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / SR)[np.argmax(spectrum)])


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.25, 2.0, 4.0])
def test_length_is_the_input_over_speed_and_the_pitch_stays(speed: float) -> None:
    t = np.arange(SR * 2) / SR
    tone = (0.5 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    out = stretch(tone, speed, SR)
    assert out.dtype == np.float32 and len(out) == round(len(tone) / speed)
    middle = out[2400:-2400]
    assert _dominant_hz(middle) == pytest.approx(200, abs=1.0)  # a resampler would give 200 * speed
    rms = np.sqrt(np.mean(middle**2)) / np.sqrt(np.mean(tone**2))
    assert rms == pytest.approx(1.0, abs=0.03)  # aligned frames add up without phase cancellation


@pytest.mark.parametrize("speed", [0.5, 0.9, 1.5, 3.0])
def test_any_chunk_schedule_gives_the_one_shot_output_bit_for_bit(speed: float) -> None:
    x = _voiced(1.3)
    whole = stretch(x, speed, SR)
    rng = np.random.default_rng(int(speed * 10))
    for _ in range(3):
        ts, parts, i = TimeStretch(speed, SR), [], 0
        while i < len(x):
            n = int(rng.integers(0, 4000))  # empty chunks too
            parts.append(ts.process(x[i : i + n]))
            i += n
        parts.append(ts.finish())
        assert np.array_equal(np.concatenate(parts), whole)


def test_speed_one_reproduces_the_input() -> None:
    x = _voiced(0.5)
    np.testing.assert_allclose(stretch(x, 1.0, SR), x, rtol=0, atol=1e-6)


def test_digital_silence_keeps_its_place() -> None:
    """A gap of exact zeros gives the search nothing to align: the frames continue where they were,
    so speech after the gap starts on time and nothing before it is copied into it."""
    x = np.concatenate([_voiced(0.3), np.zeros(3000, dtype=np.float32), _voiced(0.3, seed=1)])
    np.testing.assert_allclose(stretch(x, 1.0, SR), x, rtol=0, atol=1e-6)
    out = stretch(x, 2.0, SR)
    gap = out[round(0.3 * SR / 2) + 600 : round((0.3 * SR + 3000) / 2) - 600]
    assert len(gap) > 0 and not gap.any()
    assert not stretch(np.zeros(5000, dtype=np.float32), 0.5, SR).any()


def test_output_follows_the_input_with_a_short_hold_back() -> None:
    """A streamed chunk's audio comes out with that chunk, less about 35 ms held for the search."""
    ts = TimeStretch(1.0, SR)
    first = ts.process(_voiced(0.08))  # one 80 ms model frame
    assert 0.035 * SR <= len(first) <= 0.08 * SR


def test_bad_use_is_refused() -> None:
    ts = TimeStretch(2.0, SR)
    ts.finish()
    with pytest.raises(RuntimeError):
        ts.process(np.zeros(10, dtype=np.float32))
    with pytest.raises(RuntimeError):
        ts.finish()
    for bad in (0.2, 4.5, True, "2", None, float("nan")):
        with pytest.raises(ValueError):
            check_speed(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.1, 5, True, "fast", None, "nan", "9"])
def test_the_request_schema_names_the_speed_field(bad: object) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_request({"text": "Hi.", "speed": bad})
    assert err.value.field == "speed" and "0.25" in err.value.message


def test_speed_as_a_number_or_a_numeric_string() -> None:
    assert parse_request({"text": "Hi.", "speed": "1.25"}).speed == 1.25
    assert parse_request({"text": "Hi.", "speed": 2}).speed == 2.0
    assert parse_request({"text": "Hi."}).speed == 1.0


def test_speed_is_in_the_cache_key_only_when_it_changes_the_audio() -> None:
    base = {"text": "Hi.", "voice": "ryan", "seed": 1}

    def key(**kw: object) -> str:
        return AudioCache.key_for(parse_request({**base, **kw}), model_identity="m")

    assert key() == key(speed=1.0) == key(speed=1)  # keys from before the field existed still hold
    assert len({key(), key(speed=1.5), key(speed=0.75)}) == 3
