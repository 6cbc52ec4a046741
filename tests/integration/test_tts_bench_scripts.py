"""The open benchmark's scripts where the benchmark itself is absent (as in CI: it is not vendored):
``gpu_check.sh``'s ``tts_bench`` step skips, saying why, and lets the run go on; ``run_tts_bench.sh``
refuses at once, naming what it needs. (Their real runs: docs/benchmarks.md.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bash(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path / "out"), **env}
    return subprocess.run(
        ["bash", f"scripts/{script}"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120
    )


def test_gpu_check_skips_the_tts_bench_step_without_the_benchmark(tmp_path: Path) -> None:
    done = _bash("gpu_check.sh", tmp_path, STEPS="tts_bench", DEVICE="cpu", TTS_BENCH_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "tts_bench: skipped: no benchmark tree" in done.stdout
    assert "== gpu_check: done" in done.stdout


def test_run_tts_bench_needs_the_benchmark_tree(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TTS_BENCH_DIR"}
    done = subprocess.run(
        ["bash", "scripts/run_tts_bench.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "TTS_BENCH_DIR" in done.stderr
    done = _bash("run_tts_bench.sh", tmp_path, TTS_BENCH_DIR=str(tmp_path))
    assert done.returncode == 2 and "no tts_bench/src" in done.stderr
