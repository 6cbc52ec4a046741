"""Per-preset loudness measured on the encoded files, and the prerender quality gate's checks."""

from __future__ import annotations

import io
import math

import numpy as np
import pyloudnorm
import pytest
import soundfile as sf

from voxcast.audio.encode import encode_file
from voxcast.audio.loudness import normalize_loudness, true_peak_dbfs
from voxcast.errors import InvalidRequest
from voxcast.prerender.gate import GateSettings, check_render, script_of
from voxcast.prerender.levels import Leveled, encode_leveled
from voxcast.prerender.presets import PRESETS, PostProcess, Preset, postprocess
from voxcast.testing.signals import speech_like

TARGET, CEILING = -19.0, -1.0


_RAW_SUBTYPES = {"mulaw": "ULAW", "alaw": "ALAW", "pcm": "PCM_16"}


def _measure(data: bytes, preset: Preset | None = None) -> tuple[float, float, int]:
    """pyloudnorm's loudness and the true peak of a stored file, read back with soundfile (a raw
    preset's headerless file as libsndfile's RAW format of its encoding and rate, as sox reads it)."""
    raw = {}
    if preset is not None and preset.raw:
        raw = {
            "format": "RAW",
            "subtype": _RAW_SUBTYPES[preset.sample_format],
            "samplerate": preset.sample_rate,
        }
        raw |= {"channels": 1, "endian": "LITTLE"}
    x, sr = sf.read(io.BytesIO(data), dtype="float64", **raw)
    return float(pyloudnorm.Meter(sr).integrated_loudness(x)), true_peak_dbfs(x.astype(np.float32), sr), sr


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_file_measures_the_target_and_records_what_was_measured(name: str) -> None:
    preset = PRESETS[name]
    pcm, _ = postprocess(speech_like(3.0, seed=1), PostProcess())
    out = encode_leveled(pcm, preset, TARGET, CEILING)
    lufs, peak, sr = _measure(out.data, preset)
    assert sr == preset.sample_rate and (out.data[:4] == b"RIFF") == (
        preset.format.value in ("wav", "mulaw", "alaw") and not preset.raw
    )
    assert out.loudness_lufs == pytest.approx(lufs, abs=0.02) and out.true_peak_dbtp == pytest.approx(
        peak, abs=0.02
    )
    assert peak <= CEILING + 0.1
    assert abs(lufs - TARGET) <= 0.3 or (out.peak_limited and lufs < TARGET)


@pytest.mark.parametrize("name", ["mulaw8k", "alaw8k", "pcm8k", "pcm16k"])
def test_broadband_audio_normalised_once_at_24k_misses_at_telephone_rates(name: str) -> None:
    """The original failure: a random model's broadband output, normalised at 24 kHz and resampled
    afterwards, lands far under the target in 8 kHz files; levelled per preset it is on target."""
    rng = np.random.default_rng(3)
    noise = (0.05 * rng.standard_normal(24000 * 3)).astype(np.float32)
    preset = PRESETS[name]
    once = normalize_loudness(noise, 24000, TARGET, CEILING).pcm
    old, _, _ = _measure(encode_file(once, preset.format, preset.sample_rate))
    new, _, _ = _measure(encode_leveled(noise, preset, TARGET, CEILING).data)
    assert abs(old - TARGET) > 1.5  # what the issue measured (-38 to -40 LUFS at 8 kHz, -21.4 at 16 kHz)
    assert abs(new - TARGET) <= 0.3


def test_the_true_peak_ceiling_wins_over_the_target() -> None:
    pcm = speech_like(2.0, seed=2)
    out = encode_leveled(pcm, PRESETS["wav24k"], -6.0, CEILING)
    lufs, peak, _ = _measure(out.data)
    assert out.peak_limited and peak <= CEILING + 0.1 and lufs < -6.5


def test_no_target_leaves_the_level_alone() -> None:
    pcm = speech_like(2.0, seed=2)
    out = encode_leveled(pcm, PRESETS["pcm16k"], None, CEILING)
    assert out.gain_db == 0.0 and not out.peak_limited and out.passes == 1


def test_a_true_peak_is_above_the_sample_peak_between_samples() -> None:
    sr = 8000
    t = np.arange(sr) / sr
    x = np.sin(2 * np.pi * (sr / 4) * t + np.pi / 4).astype(np.float32)  # samples at +-0.707 of a 1.0 sine
    assert true_peak_dbfs(x, sr) > 20 * math.log10(float(np.abs(x).max())) + 2.5


# -- the gate ----------------------------------------------------------------------------------------
TEXT = "Thank you for calling Acme."  # 22 letters: 0.63-5.4 s of speech with the Latin window


def _check(
    pcm: np.ndarray,
    *,
    text: str = TEXT,
    finish: str = "eos",
    settings: GateSettings | None = None,
    post: PostProcess | None = None,
    model_pcm: np.ndarray | None = None,
    speed: float = 1.0,
) -> dict[str, dict]:
    post = post or PostProcess()
    stored, _ = postprocess(pcm, post)
    files = {
        n: encode_leveled(stored, PRESETS[n], post.loudness_lufs, post.peak_dbfs) for n in ("mulaw8k", "mp3")
    }
    verdict = check_render(
        settings=settings or GateSettings(),
        text=text,
        finish_reason=finish,
        model_pcm=pcm if model_pcm is None else model_pcm,
        stored_pcm=stored,
        sample_rate=24000,
        files=files,
        target_lufs=post.loudness_lufs,
        ceiling_dbtp=post.peak_dbfs,
        pad_ms=post.pad_ms if post.trim else None,
        speed=speed,
    )
    assert verdict.passed == (not verdict.failed)
    return verdict.checks


def _failed(checks: dict[str, dict]) -> set[str]:
    return {n for n, c in checks.items() if not c["ok"]}


def test_a_plausible_render_passes_every_check() -> None:
    checks = _check(speech_like(1.8))
    assert _failed(checks) == set()
    assert set(checks) == {
        "finished",
        "duration",
        "edge_silence",
        "pause",
        "clipping",
        "loudness",
        "true_peak",
    }


@pytest.mark.parametrize(
    ("case", "failed"),
    [
        ("runaway", {"finished"}),
        ("too_short", {"duration"}),
        ("too_long", {"duration"}),
        ("long_pause", {"pause"}),
        ("clipped", {"clipping"}),
        ("leading_silence_untrimmed", {"edge_silence"}),
        ("loudness_out_of_reach", {"loudness"}),
    ],
)
def test_each_defect_fails_its_check_only(case: str, failed: set[str]) -> None:
    kw: dict = {}
    pcm = speech_like(1.8)
    if case == "runaway":
        kw["finish"] = "max_frames"
    elif case == "too_short":
        pcm = speech_like(0.25)
    elif case == "too_long":
        pcm = speech_like(8.0)
    elif case == "long_pause":
        pcm = speech_like(1.8, pause_s=2.0)
    elif case == "clipped":
        model = pcm.copy()
        model[5000:5004] = 1.0
        kw["model_pcm"] = model
    elif case == "leading_silence_untrimmed":
        pcm = speech_like(1.8, lead_s=1.5)
        kw["post"] = PostProcess(trim=False)
    elif case == "loudness_out_of_reach":  # the ceiling stops the gain far short of a loud target
        kw["post"] = PostProcess(loudness_lufs=-6.0)
    assert _failed(_check(pcm, **kw)) == failed


def test_a_cached_render_counts_as_finished_and_cjk_text_has_its_own_pace() -> None:
    assert _failed(_check(speech_like(1.8), finish="cache")) == set()
    assert script_of("欢迎致电") == "han" and script_of("お電話ありがとうございます") == "kana"
    assert script_of("안녕하세요") == "hangul" and script_of("Hello 123") == "latin"
    # 8 Han characters take 0.9-6.3 s; the Latin window would have wanted at most 2.6 s for 8 letters
    checks = _check(speech_like(4.0), text="感谢您的来电再见")
    assert checks["duration"]["ok"] and checks["duration"]["script"] == "han"


def test_a_rows_speed_scales_the_duration_window_and_the_longest_pause() -> None:
    """At speed 0.5 the same text takes twice as long and its pauses too: a render that is too long
    or pauses too long at 1.0 passes at 0.5, and one that passes at 1.0 is too long at 0.25."""
    slow = _check(speech_like(8.0), speed=0.5)
    assert _failed(_check(speech_like(8.0))) == {"duration"} and _failed(slow) == set()
    assert slow["duration"]["limit"][1] == pytest.approx(2 * _check(speech_like(8.0))["duration"]["limit"][1])
    paused = speech_like(1.8, pause_s=2.0)
    assert _failed(_check(paused)) == {"pause"} and "pause" not in _failed(_check(paused, speed=0.5))
    assert "duration" in _failed(_check(speech_like(1.8), speed=4.0))
    untrimmed = {"post": PostProcess(trim=False)}  # the edge limit, untrimmed, is the model's 1 s stretched
    lead = speech_like(1.8, lead_s=1.5)
    assert "edge_silence" in _failed(_check(lead, **untrimmed))
    assert "edge_silence" not in _failed(_check(lead, speed=0.5, **untrimmed))


def test_gate_settings_name_the_field() -> None:
    assert GateSettings.from_payload(None) == GateSettings() and not GateSettings.from_payload(False).enabled
    s = GateSettings.from_payload({"max_attempts": 5, "chars_per_s": [3, 30], "max_pause_ms": 800})
    assert (s.max_attempts, s.chars_per_s, s.max_pause_ms) == (5, (3.0, 30.0), 800.0)
    for bad, field in [
        ("yes", "gate"),
        ({"max_attempts": 0}, "gate.max_attempts"),
        ({"max_attempts": 1.5}, "gate.max_attempts"),
        ({"chars_per_s": [30, 3]}, "gate.chars_per_s"),
        ({"max_pause_ms": "long"}, "gate.max_pause_ms"),
        ({"enabled": "no"}, "gate.enabled"),
        ({"colour": 1}, "gate.colour"),
    ]:
        with pytest.raises(InvalidRequest) as e:
            GateSettings.from_payload(bad)
        assert e.value.field == field


def test_leveled_facts_are_what_the_manifest_records() -> None:
    out = encode_leveled(speech_like(1.0), PRESETS["alaw8k"], TARGET, CEILING)
    assert isinstance(out, Leveled)
    assert set(out.facts()) == {"loudness_lufs", "true_peak_dbtp", "gain_db", "peak_limited"}
