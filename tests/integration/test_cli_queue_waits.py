"""``voxcast listen`` / ``enqueue --follow`` / ``register-voice`` say what they wait for and end
with the documented exit code (README: 2 for bad input, also when a worker is the one to find it),
against a real redis-server and, where a job must run, a real ``worker.py`` on the tiny model."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fixtures.rq_worker import WorkerProcess
from voxcast.serving.cli.main import main

QUEUE = "voxcast-cli-exits"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_listen_to_an_unknown_job_says_so_at_once(capsys: pytest.CaptureFixture[str], redis_url: str) -> None:
    code, _, err = _run(capsys, "listen", "nosuchjob", "--redis-url", redis_url, "--idle-timeout", "30")
    assert (code, err) == (1, "error: no such job 'nosuchjob' (unknown or expired)\n")


def test_follow_on_a_queue_no_worker_serves_says_so_after_the_idle_timeout(
    capsys: pytest.CaptureFixture[str], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOXCAST_FOLLOW_IDLE_TIMEOUT_S", "1")
    code, out, err = _run(
        capsys, "enqueue", "Hello.", "--queue", "lonely", "--follow", "--redis-url", redis_url
    )
    job_id, _, err = err.partition("\n")  # the job id first (stdout is kept for the result's JSON)
    assert code == 1 and job_id and out == ""
    assert err.startswith(
        "waiting: no worker serves queue 'lonely' (start one: voxcast worker --queues lonely)"
    )
    assert err.endswith(f"error: job {job_id} still queued after 1 s: no worker serves queue 'lonely' "
                        "(start one: voxcast worker --queues lonely)\n")  # fmt: skip
    code, _, err = _run(capsys, "listen", job_id, "--redis-url", redis_url, "--idle-timeout", "0.5")
    assert code == 1 and "still queued after 0.5 s: no worker serves queue 'lonely'" in err


@pytest.fixture
def worker(
    tiny_model_dir, tmp_path: Path, redis_url: str, redis_client: redis.Redis
) -> Iterator[WorkerProcess]:
    w = WorkerProcess(
        redis_url, tiny_model_dir("custom_voice"), tmp_path / "store", tmp_path / "w.log", QUEUE
    )
    try:
        w.wait_ready(redis_client, timeout_s=300)
        yield w
    finally:
        if w.alive:
            w.proc.send_signal(signal.SIGTERM)
        w.stop()


def test_bad_input_found_by_the_worker_exits_2(
    capsys: pytest.CaptureFixture[str], redis_url: str, worker: WorkerProcess, tmp_path: Path
) -> None:
    code, _, err = _run(
        capsys,
        "enqueue",
        "Hello.",
        "--voice",
        "nosuchvoice",
        "--queue",
        QUEUE,
        "--follow",
        "--redis-url",
        redis_url,
    )
    assert code == 2, err
    not_audio = tmp_path / "notes.wav"
    not_audio.write_bytes(b"this is not audio at all" * 100)
    code, _, err = _run(capsys, "register-voice", str(not_audio), "--queue", QUEUE, "--redis-url", redis_url)
    assert code == 2 and '"code": "invalid_request"' in err, err  # a CustomVoice model cannot clone
    code, _, err = _run(capsys, "register-voice", str(tmp_path / "missing.wav"), "--redis-url", redis_url)
    assert (code, err) == (2, f"error: no such file: {tmp_path / 'missing.wav'}\n")
