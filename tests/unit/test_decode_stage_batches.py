"""The decode stage's batches (voxcast/engine/decode_stage.py): batchable jobs queued right behind one
another run as one batch, a key (a stream) at most once, every job in submission order; inline they
wait for ``flush`` or the next other job."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from voxcast.engine.decode_stage import DecodeStage


def _busy(stage: DecodeStage) -> threading.Event:
    """Keep ``stage``'s worker busy until the returned event is set: what follows queues up."""
    gate = threading.Event()

    def wait() -> None:
        gate.wait()

    stage.run(wait, print)
    return gate


def test_the_worker_batches_the_jobs_queued_behind_one_another() -> None:
    log: list[object] = []
    stage = DecodeStage(True, batch=lambda items: log.append(list(items)))
    gate = _busy(stage)
    for key, item in (("a", 1), ("b", 2), ("a", 3), ("c", 4)):
        stage.run_batched(key, item, print)
    stage.run(lambda: log.append("other"), print)
    stage.run_batched("a", 5, print)
    gate.set()
    stage.join(timeout=10)
    # "a" twice: its second item starts the next batch; another job ends a batch
    assert log == [[1, 2], [3, 4], "other", [5]]


def test_a_batch_that_raises_fails_each_of_its_jobs() -> None:
    def boom(items: list[object]) -> None:
        raise RuntimeError("shared call")

    failed: list[str] = []
    stage = DecodeStage(True, batch=boom)
    gate = _busy(stage)

    def on_error(key: str) -> Callable[[Exception], None]:
        return lambda e: failed.append(f"{key}: {e}")

    for key in ("a", "b"):
        stage.run_batched(key, key, on_error(key))
    gate.set()
    stage.join(timeout=10)
    assert failed == ["a: shared call", "b: shared call"]


def test_inline_jobs_wait_for_flush_or_the_next_other_job() -> None:
    log: list[object] = []
    stage = DecodeStage(False, batch=lambda items: log.append(list(items)))
    stage.run_batched("a", 1, print)
    stage.run_batched("b", 2, print)
    assert log == []
    stage.flush()
    stage.run_batched("a", 3, print)
    stage.run_batched("a", 4, print)  # the same key again: the held batch runs first
    stage.run(lambda: log.append("other"), print)
    stage.run_batched("b", 5, print)
    stage.stop()
    assert log == [[1, 2], [3], [4], "other", [5]]


def test_a_stage_without_a_batch_runner_refuses_batchable_jobs() -> None:
    stage = DecodeStage(False)
    assert not stage.batches
    with pytest.raises(RuntimeError, match="no batch runner"):
        stage.run_batched("a", 1, print)


def test_the_worker_measures_its_busy_time_on_the_stage_clock() -> None:
    """Admission reads how busy the decode thread is: each job's and batch's time counts, a failing
    one's too; inline jobs run within the scheduler's rounds and do not."""
    now = [100.0]

    def work(seconds: float, fail: bool = False) -> Callable[[], None]:
        def job() -> None:
            now[0] += seconds
            if fail:
                raise RuntimeError("decode")

        return job

    stage = DecodeStage(True, batch=lambda items: work(window / 8)(), clock=lambda: now[0])
    window = stage.busy.window_s
    stage.run(work(window / 4), print)
    stage.run(work(window / 8, fail=True), print)
    stage.run_batched("a", 1, print)
    stage.join(timeout=10)
    assert stage.busy.fraction(now[0]) == pytest.approx(0.5)  # half of the window, just now
    now[0] += window * 3 / 4  # the window now holds only the last quarter window of the jobs
    assert stage.busy.fraction(now[0]) == pytest.approx(0.25)
    inline = DecodeStage(False, clock=lambda: now[0])
    inline.run(work(0.5), print)
    assert inline.busy.fraction(now[0]) == 0.0
