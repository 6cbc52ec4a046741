"""The load benchmark's own arithmetic (scripts/bench_load.py): arrivals, texts, stalls, capacity."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_load.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_load", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_load"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate(bench: ModuleType) -> None:
    a = bench.poisson_arrivals(10.0, 200.0, seed=3)
    assert a == bench.poisson_arrivals(10.0, 200.0, seed=3)
    assert a != bench.poisson_arrivals(10.0, 200.0, seed=4)
    assert all(0 < x < 200 for x in a) and a == sorted(a)
    assert 1800 < len(a) < 2200  # 2000 expected; the sd is ~45


def test_agent_turns_are_seeded_sentences_of_4_to_40_words(bench: ModuleType) -> None:
    texts = bench.agent_turns(300, seed=1)
    assert texts == bench.agent_turns(300, seed=1)
    lengths = [len(t.split()) for t in texts]
    assert min(lengths) >= 4 and max(lengths) <= 40
    assert min(lengths) < 8 and max(lengths) > 35  # the range is used, not one length
    assert all(t[0].isupper() and t.endswith(".") for t in texts)


def test_playback_counts_a_stall_only_when_the_buffer_runs_dry(bench: ModuleType) -> None:
    p = bench.Playback()
    p.chunk(1.0, 0.08)  # playback starts: ends at 1.08
    p.chunk(1.05, 0.5)  # in time: ends at 1.58
    p.chunk(1.58, 0.1)  # exactly at the end: no stall; ends at 1.68
    assert p.stalls == 0
    p.chunk(1.70, 0.1)  # 20 ms late
    assert p.stalls == 1 and p.stall_s == pytest.approx(0.02)
    assert p.end_s == pytest.approx(1.80) and p.audio_s == pytest.approx(0.78)
    q = bench.Playback()
    q.chunk(0.0, 0.1)
    q.chunk(0.105, 0.1, tolerance_s=0.01)  # within a client's jitter buffer
    assert q.stalls == 0


def test_a_refused_or_stalled_request_is_not_viable(bench: ModuleType) -> None:
    ok = bench.Result(0.0, 5, audio_s=1.0)
    assert ok.viable
    assert not bench.Result(0.0, 5, audio_s=1.0, stalls=1).viable
    assert not bench.Result(0.0, 5, status="refused").viable
    assert not bench.Result(0.0, 5, audio_s=0.0).viable


def test_summary_percentiles_and_capacity(bench: ModuleType) -> None:
    rows = [
        bench.Result(i / 10, 5, ttfa_ms=float(i + 1), total_ms=float(i + 1) + 500, audio_s=1.0)
        for i in range(100)
    ]
    rows[0].stalls = 1
    s = bench.summarize(rows, wall_s=10.0, frame_rate=12.5)
    assert (s["ttfa_ms_p50"], s["ttfa_ms_p95"], s["ttfa_ms_p99"]) == (50.0, 95.0, 99.0)
    assert s["viable_pct"] == 99.0 and s["audio_s_per_s"] == 10.0 and s["frames_per_s"] == 125.0
    assert s["rtf_p50"] == pytest.approx(0.5)
    levels = [
        {"rate": 1.0, "requests": 10, "ttfa_ms_p95": 30.0, "viable_pct": 100.0},
        {"rate": 2.0, "requests": 10, "ttfa_ms_p95": 45.0, "viable_pct": 99.0},
        {"rate": 4.0, "requests": 10, "ttfa_ms_p95": 49.0, "viable_pct": 98.0},  # stalls
        {"rate": 8.0, "requests": 10, "ttfa_ms_p95": 80.0, "viable_pct": 100.0},  # slow
    ]
    assert bench.capacity(levels, 50.0, 99.0) == 2.0
    assert bench.capacity(levels, 20.0, 99.0) is None


def test_a_random_checkpoints_requests_get_a_length_from_their_words(bench: ModuleType) -> None:
    assert bench.frames_for("one two three four", 5.0, 0) == 24
    assert bench.frames_for("one two three four", 5.0, 10) == 10
    assert bench.frames_for("one two", 0.0, 0) is None
    assert bench.frames_for("one two", 0.0, 16) == 16


def test_refused_requests_count_as_not_served(bench: ModuleType) -> None:
    """A server that answers fast by refusing (503 over capacity) has no capacity at that rate."""
    rows = [bench.Result(i / 10, 5, ttfa_ms=10.0, total_ms=510.0, audio_s=1.0) for i in range(90)]
    rows += [bench.Result(9 + i / 10, 5, status="refused", error="503 over_capacity") for i in range(10)]
    s = bench.summarize(rows, wall_s=10.0, frame_rate=12.5)
    assert s["ttfa_ms_p95"] == 10.0  # the served ones were fast...
    assert (s["refused"], s["refused_pct"], s["viable_pct"]) == (10, 10.0, 90.0)  # ...but 10% were not served
    assert (s["achieved_rate"], s["served_rate"]) == (10.0, 9.0)
    assert bench.capacity([{"rate": 10.0, **s}], 50.0, 99.0) is None
    assert bench.capacity([{"rate": 10.0, **s}], 50.0, 90.0) == 10.0
