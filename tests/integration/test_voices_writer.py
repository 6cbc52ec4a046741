"""BackgroundWriter: order, flush, failures, close."""

from __future__ import annotations

import logging
import threading

import pytest

from voxcast.voices.writer import BackgroundWriter


def test_runs_in_submission_order_off_the_caller_thread_and_flushes() -> None:
    writer = BackgroundWriter()
    gate = threading.Event()
    seen: list[tuple[int, str]] = []

    def first() -> None:
        gate.wait(5)
        seen.append((0, threading.current_thread().name))

    writer.submit(first)
    for i in range(1, 5):
        writer.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert writer.pending == 5 and not writer.flush(timeout=0.05)  # the first job holds the rest
    gate.set()
    assert writer.flush(timeout=5) and writer.pending == 0
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"voxcast-writer"}
    assert writer.close(timeout=5)


def test_a_failing_job_is_logged_and_the_next_ones_run(caplog: pytest.LogCaptureFixture) -> None:
    writer = BackgroundWriter()
    done: list[int] = []

    def fail() -> None:
        raise OSError("disk full")

    with caplog.at_level(logging.ERROR, logger="voxcast.voices.writer"):
        writer.submit(fail)
        writer.submit(lambda: done.append(1))
        assert writer.flush(timeout=5)
    assert done == [1]
    assert "background write failed" in caplog.text and "disk full" in caplog.text
    writer.close(timeout=5)


def test_close_drains_the_queue_and_later_jobs_run_on_the_caller() -> None:
    writer = BackgroundWriter()
    gate = threading.Event()
    done: list[str] = []

    def queued() -> None:
        gate.wait(5)
        done.append("queued")

    writer.submit(queued)
    threading.Timer(0.1, gate.set).start()
    assert writer.close(timeout=5) and done == ["queued"]
    writer.submit(lambda: done.append(threading.current_thread().name))
    assert done == ["queued", threading.current_thread().name]
    assert writer.close() and writer.flush(timeout=0)


def test_close_without_any_job_starts_no_thread() -> None:
    writer = BackgroundWriter()
    assert writer.close(timeout=1) and writer.pending == 0
