"""``python handler.py`` in a developer's shell (no RunPod variables): a one-shot run checks its job
and output before loading anything, and ends bad input with exit code 2 (README), not after a load.

The model path does not exist: a run that got as far as loading would fail there instead (exit 1,
"start-up failed"), so these runs prove the checks come first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _handler(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
    env |= {"PYTHONPATH": str(REPO / "src"), "VOXCAST_MODEL": str(cwd / "no-such-model")}
    return subprocess.run(
        [sys.executable, str(REPO / "handler.py"), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


GOOD = json.dumps({"input": {"text": "Hello.", "voice": "ryan"}})


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "nothing to run: no --test_input given and no test_input.json in"),
        (["--test_input", json.dumps({"input": {"text": ""}})], "bad test input: text:"),
        (
            ["--test_input", json.dumps({"input": {"text": "hi", "sample_rate": 7}})],
            "bad test input: sample_rate:",
        ),
        (["--test_input", "{not json"], "test input is not JSON"),
        (
            ["--test_input", GOOD, "--audio_out", "/no/such/dir/x.wav"],
            "--audio_out: no such directory: /no/such/dir",
        ),
    ],
)
def test_a_one_shot_run_fails_on_its_input_before_loading(tmp_path: Path, args: list[str], says: str) -> None:
    proc = _handler(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert says in proc.stderr and "start-up failed" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_good_one_shot_job_goes_on_to_load(tmp_path: Path) -> None:
    proc = _handler(tmp_path, "--test_input", GOOD, "--audio_out", str(tmp_path / "x.wav"))
    assert proc.returncode == 1 and "start-up failed" in proc.stderr  # the missing model, after the checks


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_runpods_flags_and_runs_nothing(tmp_path: Path, flag: str) -> None:
    """Before: ``python handler.py --help`` ran the default job (offline: a 119-line traceback)."""
    (tmp_path / "test_input.json").write_text(json.dumps({"input": {"text": "Hello."}}))
    run = _handler(tmp_path, flag)
    assert run.returncode == 0, run.stderr
    assert (
        "VOXCAST_ENDPOINT_TYPE" in run.stdout
        and "--rp_serve_api" in run.stdout
        and "--test_input" in run.stdout
    )
    assert "Traceback" not in run.stderr and "no-such-model" not in run.stderr + run.stdout
