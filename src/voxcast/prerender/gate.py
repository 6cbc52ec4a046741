"""The quality gate of a prerendered prompt: checks a render must pass before it is stored.

An IVR library is played thousands of times; a prompt that runs away, mumbles for a second, stops
for two seconds in the middle or clips must not reach it. Every render is checked; a failing prompt
is rendered again with the next seed (``seed + 1``, ``seed + 2``, ...) up to ``max_attempts`` times,
then reported with its failed checks and not stored. The manifest records, per prompt, the checks,
the attempt used and its seed.

===================  ==========================================================================
check                passes when
===================  ==========================================================================
``finished``         the model ended the speech itself (end-of-speech, or a cached render of one)
``duration``         speech time fits the text: ``chars / max_cps - 0.25 s`` to ``chars / min_cps
                     + 1 s``, counting letters and digits; per script: Latin and others 5-25/s,
                     Han 1.5-9/s, kana 2.5-14/s, Hangul 2-12/s (override: ``chars_per_s``); a
                     row's ``speed`` divides the window (and ``max_pause_ms``)
``edge_silence``     leading and trailing silence of the stored audio at most ``edge_silence_ms``
                     (default: the trim pad + 50 ms with trimming on, 1000 ms off)
``pause``            no silence inside the speech longer than ``max_pause_ms`` (1500)
``clipping``         no run of ``clip_run`` (3) samples at full scale in the model's output
``loudness``         every preset's file within ``loudness_tolerance_lu`` (2.0, ATSC A/85's
                     window) of the target; a prompt whose peaks are high for its loudness misses
                     it when the true-peak ceiling lowers its gain (speech's peak-to-loudness
                     ratio is 12-20 dB, and -19 LUFS under -1 dBTP allows 18)
``true_peak``        every preset's file at most 0.1 dB over the true-peak ceiling
===================  ==========================================================================

A row decoded greedily gets one attempt (another seed would not change it).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from voxcast.audio.trim import silence_profile
from voxcast.errors import InvalidRequest
from voxcast.prerender.levels import Leveled

__all__ = ["CHARS_PER_S", "GateResult", "GateSettings", "check_render", "script_of"]

#: Letters and digits per second of speech, (slowest, fastest) accepted, by script.
CHARS_PER_S: dict[str, tuple[float, float]] = {
    "latin": (5.0, 25.0),
    "han": (1.5, 9.0),
    "kana": (2.5, 14.0),
    "hangul": (2.0, 12.0),
}

_FULL_SCALE = 0.999
_PEAK_SLACK_DB = 0.1


@dataclass(frozen=True)
class GateSettings:
    """What the gate checks (see the module docstring); part of a prompt's render hash."""

    enabled: bool = True
    max_attempts: int = 3
    chars_per_s: tuple[float, float] | None = None
    max_pause_ms: float = 1500.0
    edge_silence_ms: float | None = None
    loudness_tolerance_lu: float = 2.0
    clip_run: int = 3

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "max_attempts": self.max_attempts,
            "chars_per_s": list(self.chars_per_s) if self.chars_per_s else None,
            "max_pause_ms": self.max_pause_ms,
            "edge_silence_ms": self.edge_silence_ms,
            "loudness_tolerance_lu": self.loudness_tolerance_lu,
            "clip_run": self.clip_run,
        }

    @classmethod
    def from_payload(cls, value: Any) -> GateSettings:
        """``true``/``false``/``null`` or an object of the fields above.

        Raises:
            InvalidRequest: naming ``gate`` or ``gate.<field>``.
        """
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(enabled=False)
        if not isinstance(value, Mapping):
            raise InvalidRequest("gate must be true, false or an object", field="gate")
        unknown = sorted(set(value) - set(cls().to_dict()))
        if unknown:
            raise InvalidRequest(f"unknown gate setting {unknown[0]!r}", field=f"gate.{unknown[0]}")
        return cls(
            enabled=_bool(value, "enabled", True),
            max_attempts=int(_number(value, "max_attempts", 3, 1, 10, whole=True)),
            chars_per_s=_window(value.get("chars_per_s")),
            max_pause_ms=_number(value, "max_pause_ms", 1500.0, 50.0, 60_000.0),
            edge_silence_ms=(
                None
                if value.get("edge_silence_ms") is None
                else _number(value, "edge_silence_ms", 0.0, 0.0, 60_000.0)
            ),
            loudness_tolerance_lu=_number(value, "loudness_tolerance_lu", 2.0, 0.1, 20.0),
            clip_run=int(_number(value, "clip_run", 3, 1, 10_000, whole=True)),
        )


def _bool(value: Mapping[str, Any], name: str, default: bool) -> bool:
    v = value.get(name, default)
    if not isinstance(v, bool):
        raise InvalidRequest(f"gate.{name} must be true or false", field=f"gate.{name}")
    return v


def _number(
    value: Mapping[str, Any], name: str, default: float, lo: float, hi: float, whole: bool = False
) -> float:
    v = value.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or (whole and not float(v).is_integer()):
        kind = "a whole number" if whole else "a number"
        raise InvalidRequest(f"gate.{name} must be {kind}", field=f"gate.{name}")
    if not lo <= float(v) <= hi:
        raise InvalidRequest(f"gate.{name} must be between {lo:g} and {hi:g}", field=f"gate.{name}")
    return float(v)


def _window(v: Any) -> tuple[float, float] | None:
    if v is None:
        return None
    ok = (
        isinstance(v, list | tuple)
        and len(v) == 2
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
        and 0 < v[0] < v[1] <= 100
    )
    if not ok:
        raise InvalidRequest(
            "gate.chars_per_s must be [slowest, fastest] characters a second, 0 < slowest < fastest <= 100",
            field="gate.chars_per_s",
        )
    return float(v[0]), float(v[1])


def script_of(text: str) -> str:
    """The script most of ``text``'s letters are in: ``han``, ``kana``, ``hangul`` or ``latin``."""
    counts = {"han": 0, "kana": 0, "hangul": 0, "latin": 0}
    for ch in text:
        if not ch.isalnum():
            continue
        name = unicodedata.name(ch, "")
        if name.startswith("CJK"):
            counts["han"] += 1
        elif name.startswith(("HIRAGANA", "KATAKANA")):
            counts["kana"] += 1
        elif name.startswith("HANGUL"):
            counts["hangul"] += 1
        else:
            counts["latin"] += 1
    if counts["kana"]:  # Japanese mixes kana and kanji: its pace is the kana one
        counts["kana"] += counts["han"]
    return max(counts, key=lambda k: counts[k])


@dataclass(frozen=True)
class GateResult:
    """Every check as ``{"ok", "value", "limit"}``; ``passed`` when all are ok."""

    checks: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(c["ok"] for c in self.checks.values())

    @property
    def failed(self) -> list[str]:
        return [name for name, c in self.checks.items() if not c["ok"]]

    def describe(self) -> str:
        """One line naming each failed check with its value and limit."""
        return "; ".join(
            f"{n}: {self.checks[n]['value']} (limit {self.checks[n]['limit']})" for n in self.failed
        )


def _longest_full_scale_run(x: np.ndarray) -> int:
    hot = np.abs(x) >= _FULL_SCALE
    if not hot.any():
        return 0
    edges = np.diff(np.concatenate([[0], hot.astype(np.int8), [0]]))
    return int((np.nonzero(edges == -1)[0] - np.nonzero(edges == 1)[0]).max())


def check_render(
    *,
    settings: GateSettings,
    text: str,
    finish_reason: str,
    model_pcm: np.ndarray,
    stored_pcm: np.ndarray,
    sample_rate: int,
    files: Mapping[str, Leveled],
    target_lufs: float | None,
    ceiling_dbtp: float,
    pad_ms: float | None,
    speed: float = 1.0,
) -> GateResult:
    """Run every check on one render.

    Args:
        settings: the gate's limits.
        text: the prompt's text.
        finish_reason: the synthesis's ``timing.finish_reason``.
        model_pcm: the model's output (float32, before trimming and levelling).
        stored_pcm: the trimmed prompt the presets were encoded from (``sample_rate``).
        sample_rate: rate of both.
        files: each preset's encoded file and its measurements.
        target_lufs: the loudness target (None: not normalised, no loudness check).
        ceiling_dbtp: the true-peak ceiling.
        pad_ms: the trim pad (None: trimming off).
        speed: the request's speaking rate: the duration window and the longest pause scale by
            ``1 / speed`` (the audio is the model's, time-stretched).
    """
    checks: dict[str, dict[str, Any]] = {}
    checks["finished"] = {"ok": finish_reason in ("eos", "cache"), "value": finish_reason, "limit": "eos"}
    prof = silence_profile(stored_pcm, sample_rate)
    chars = sum(ch.isalnum() for ch in text)
    script = script_of(text)
    slow, fast = settings.chars_per_s or CHARS_PER_S[script]
    lo, hi = max(0.0, chars / fast - 0.25) / speed, (chars / slow + 1.0) / speed
    speech_s = prof.speech_ms / 1000.0
    checks["duration"] = {
        "ok": lo <= speech_s <= hi,
        "value": round(speech_s, 2),
        "limit": [round(lo, 2), round(hi, 2)],
        "script": script,
    }
    edge = settings.edge_silence_ms
    if edge is None:
        edge = pad_ms + 50.0 if pad_ms is not None else 1000.0 / speed  # untrimmed: the model's, stretched
    worst_edge = max(prof.leading_ms, prof.trailing_ms)
    checks["edge_silence"] = {"ok": worst_edge <= edge, "value": round(worst_edge), "limit": round(edge)}
    max_pause = settings.max_pause_ms / speed
    checks["pause"] = {
        "ok": prof.longest_pause_ms <= max_pause,
        "value": round(prof.longest_pause_ms),
        "limit": round(max_pause),
    }
    run = _longest_full_scale_run(model_pcm)
    checks["clipping"] = {"ok": run < settings.clip_run, "value": run, "limit": settings.clip_run}
    if target_lufs is not None:
        misses = {
            name: abs(f.loudness_lufs - target_lufs) if f.loudness_lufs is not None else math.inf
            for name, f in files.items()
        }
        worst = max(misses.values(), default=0.0)
        checks["loudness"] = {
            "ok": worst <= settings.loudness_tolerance_lu,
            "value": round(worst, 2) if math.isfinite(worst) else None,
            "limit": settings.loudness_tolerance_lu,
        }
    peaks = [f.true_peak_dbtp for f in files.values() if f.true_peak_dbtp is not None]
    top = max(peaks, default=-math.inf)
    checks["true_peak"] = {
        "ok": top <= ceiling_dbtp + _PEAK_SLACK_DB,
        "value": round(top, 2) if math.isfinite(top) else None,
        "limit": ceiling_dbtp,
    }
    return GateResult(checks)
