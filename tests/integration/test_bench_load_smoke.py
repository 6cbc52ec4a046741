"""The load benchmark runs end to end on the tiny model, over the real HTTP server and in process,
and reports every figure (no test asserts a time: the figures are the benchmark's, not the test's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_load_reports_capacity_figures_over_http_and_in_process(tiny_model_dir, tmp_path: Path) -> None:
    model = tiny_model_dir("custom_voice")
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "bench_load.py"),
        "--model",
        str(model),
        "--transport",
        "both",
    ]
    cmd += [
        "--rates",
        "4",
        "--duration",
        "1.5",
        "--frames-per-word",
        "1",
        "--max-active",
        "4",
        "--out",
        str(tmp_path),
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    # one OpenMP thread for its server and its in-process engine, as the server fixtures: two teams of
    # 2 threads on 2 cores run 2-10x slower, and no figure is asserted
    env |= {"VOXCAST_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (out,) = tmp_path.glob("load-*.json")
    doc = json.loads(out.read_text())
    assert set(doc["runs"]) == {"http", "inprocess"}
    for run in doc["runs"].values():
        (level,) = run["levels"]
        assert level["rate"] == 4.0 and level["requests"] > 0
        assert level["errors"] == 0, level["first_errors"]
        for key in (
            "ttfa_ms_p50",
            "ttfa_ms_p95",
            "ttfa_ms_p99",
            "viable_pct",
            "audio_s_per_s",
            "frames_per_s",
        ):
            assert level[key] is not None and level[key] >= 0, key
        assert level["audio_s_per_s"] > 0
        assert "capacity" in run and run["memory"]["server_peak_rss_mb"] > 0
    assert doc["targets"] == {"ttfa_ms": 50.0, "viable_pct": 99.0}
    assert (tmp_path / (out.stem + ".png")).stat().st_size > 1000
