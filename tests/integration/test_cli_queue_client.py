"""The queue commands as a client-only install runs them: no torch (it is made unimportable here),
a real redis-server, and a reader of standard output that may go away (``| head -1``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}

#: Runs ``voxcast ARGS`` with torch unimportable (``import torch`` raises ImportError).
_NO_TORCH = """
import sys
sys.modules["torch"] = None
from voxcast.serving.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _voxcast_without_torch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *argv], capture_output=True, text=True, env=ENV, timeout=120
    )


def test_queue_commands_run_without_torch(redis_url: str) -> None:
    enqueued = _voxcast_without_torch("enqueue", "Hello there.", "--voice", "ryan", "--redis-url", redis_url)
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    status = _voxcast_without_torch("status", job_id, "--redis-url", redis_url)
    assert status.returncode == 0 and '"status": "queued"' in status.stdout, status.stderr
    workers = _voxcast_without_torch("workers", "--redis-url", redis_url)
    assert (workers.returncode, workers.stdout.strip()) == (0, "[]"), workers.stderr
    cancel = _voxcast_without_torch("cancel", job_id, "--redis-url", redis_url)
    assert (cancel.returncode, cancel.stdout.strip()) == (0, "cancelled"), cancel.stderr
    listen = _voxcast_without_torch("listen", job_id, "--redis-url", redis_url)
    assert listen.returncode == 1 and '"status": "cancelled"' in listen.stdout, listen.stderr
    bad = _voxcast_without_torch("enqueue", "hi", "--sample-rate", "7", "--redis-url", redis_url)
    assert bad.returncode == 2 and "sample_rate" in bad.stderr


@pytest.mark.parametrize("command", [["workers"], ["enqueue", "Hello.", "--voice", "ryan"]])
def test_a_closed_standard_output_ends_the_command_quietly(redis_url: str, command: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first byte, as `| head -1` can have
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "voxcast.serving.cli.main", *command, "--redis-url", redis_url],
            stdout=write_end, stderr=subprocess.PIPE, text=True, env=ENV, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == ""


def test_a_command_whose_packages_are_missing_is_listed_and_says_what_to_install() -> None:
    """Before: with soundfile missing, enqueue, listen, status, cancel and workers vanished from
    ``voxcast`` ("invalid choice"), the ImportError swallowed even at --log-level DEBUG."""
    code = _NO_TORCH.replace(
        'sys.modules["torch"] = None', 'sys.modules["torch"] = sys.modules["soundfile"] = None'
    )
    run = subprocess.run(
        [sys.executable, "-c", code, "enqueue", "Hello.", "--voice", "ryan"],
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert (
        "voxcast enqueue needs the package 'soundfile'" in run.stderr
        and "requirements-client.txt" in run.stderr
    )
    listed = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert all(c in listed.stdout for c in ("enqueue", "listen", "status", "cancel", "workers")), (
        listed.stdout
    )


def test_status_of_no_such_job_and_a_bad_enqueue_out_are_one_error_line(
    redis_url: str, tmp_path: Path
) -> None:
    """Before: ``status nosuchjob`` printed JSON (exit 1) where cancel and listen print an error line;
    ``enqueue --out nodir/x.wav`` was checked only after Redis (unreachable: a Redis error instead)."""
    status = _voxcast_without_torch("status", "nosuchjob", "--redis-url", redis_url)
    assert (status.returncode, status.stdout) == (1, "")
    assert status.stderr == "error: no such job 'nosuchjob' (unknown or expired)\n"
    unreachable = "redis://127.0.0.1:1/0"
    out = _voxcast_without_torch(
        "enqueue", "Hi.", "--out", str(tmp_path / "nodir" / "x.wav"), "--redis-url", unreachable
    )
    assert out.returncode == 2 and '"field": "out"' in out.stderr, out.stderr
