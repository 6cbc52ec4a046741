"""Store calls retried over a bounded window, and writes kept for later (pure: fake stores, fake clocks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from voxcast.errors import StorageError
from voxcast.service import ServiceConfig
from voxcast.serving.rq.config import QueueConfig
from voxcast.storage import LocalBlobStore
from voxcast.storage.base import BlobNotFound
from voxcast.storage.pending import PendingSettings, PendingWrites
from voxcast.storage.retry import RetryingStore, RetryPolicy, StoreGaveUp, retry_call


class Clock:
    """A fake monotonic clock that a fake wait advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


def failing(n: int, result: Any = "ok") -> Callable[[], Any]:
    """A call that raises StorageError ``n`` times, then returns ``result``."""
    calls = [0]

    def call() -> Any:
        calls[0] += 1
        if calls[0] <= n:
            raise StorageError(f"down ({calls[0]})")
        return result

    return call


def test_a_call_is_retried_with_growing_pauses_until_it_succeeds() -> None:
    clock = Clock()
    assert (
        retry_call(failing(5), RetryPolicy(window_s=60), what="put k", wait=clock.wait, clock=clock) == "ok"
    )
    assert len(clock.waits) == 5
    fixed = [0.5, 1, 2, 4, 8]  # half of each pause is fixed, half random
    assert all(f / 2 <= w <= f for w, f in zip(clock.waits, fixed, strict=True))


def test_past_the_window_the_last_error_is_raised_as_store_gave_up() -> None:
    clock = Clock()
    with pytest.raises(StoreGaveUp) as e:
        retry_call(failing(1000), RetryPolicy(window_s=20), what="put k", wait=clock.wait, clock=clock)
    assert e.value.code == "storage_error" and isinstance(e.value.__cause__, StorageError)
    assert 20 <= e.value.waited_s <= 20.001 and e.value.attempts == len(clock.waits) + 1
    assert sum(clock.waits) == pytest.approx(20)  # the last pause ends at the window, not past it
    assert "tried" in e.value.message and "down" in e.value.message


def test_a_missing_key_is_an_answer_and_a_zero_window_never_retries() -> None:
    clock = Clock()

    def missing() -> None:
        raise BlobNotFound("no object")

    with pytest.raises(BlobNotFound):
        retry_call(missing, RetryPolicy(), what="get k", wait=clock.wait, clock=clock)
    with pytest.raises(StoreGaveUp):
        retry_call(failing(1), RetryPolicy(window_s=0), what="put k", wait=clock.wait, clock=clock)
    assert clock.waits == []


def test_a_wait_that_says_stop_ends_the_retries_at_once() -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(StoreGaveUp) as e:
        retry_call(failing(1000), RetryPolicy(window_s=3600), what="put k", wait=stop.wait)
    assert e.value.attempts == 1


def test_retrying_store_retries_every_call(tmp_path: Any) -> None:
    class Flaky(LocalBlobStore):
        """A local store whose every call fails once, then works."""

        def __init__(self, root: Any) -> None:
            super().__init__(root, fsync=False)
            self.failed: set[str] = set()

        def _flaky(self, op: str) -> None:
            if op not in self.failed:
                self.failed.add(op)
                raise StorageError(f"{op} down")

        def put_bytes(self, key: str, data: bytes, **kw: Any) -> bool:
            self._flaky("put")
            return super().put_bytes(key, data, **kw)

        def list_keys(self, prefix: str = "") -> Any:
            self._flaky("list")
            return super().list_keys(prefix)

    store = RetryingStore(Flaky(tmp_path), RetryPolicy(first_s=0.01, cap_s=0.01))
    assert store.put_bytes("a/k", b"x")
    assert list(store.list_keys("a/")) == ["a/k"] and store.get_bytes("a/k") == b"x"
    assert store.store.failed == {"put", "list"}  # type: ignore[attr-defined]


def test_bad_policies_are_refused() -> None:
    for kwargs in ({"window_s": -1}, {"first_s": 0}, {"first_s": 2, "cap_s": 1}):
        with pytest.raises(ValueError):
            RetryPolicy(**kwargs)


def test_the_windows_and_bounds_come_from_the_environment() -> None:
    assert QueueConfig.from_env({}).storage_retry_s == 60
    assert QueueConfig.from_env({"VOXCAST_STORAGE_RETRY_S": "5.5"}).storage_retry_s == 5.5
    with pytest.raises(ValueError, match="VOXCAST_STORAGE_RETRY_S"):
        QueueConfig.from_env({"VOXCAST_STORAGE_RETRY_S": "-1"})
    pending = ServiceConfig.from_env({"VOXCAST_STORE_PENDING_MB": "1", "VOXCAST_STORE_PENDING_S": "30"})
    assert pending.store_pending.max_bytes == 2**20 and pending.store_pending.max_age_s == 30
    assert ServiceConfig.from_env({}).store_pending == PendingSettings()


# -- kept writes ----------------------------------------------------------------------------------
def test_kept_writes_are_made_in_order_once_the_store_answers() -> None:
    done: list[str] = []
    down = threading.Event()
    down.set()

    def write(name: str) -> Callable[[], None]:
        def call() -> None:
            if down.is_set():
                raise StorageError("down")
            done.append(name)

        return call

    written = threading.Event()
    pending = PendingWrites(PendingSettings(first_s=0.01, cap_s=0.02), on_written=written.set)
    assert pending.add("a", 10, write("a")) and pending.add("b", 10, write("b"))
    assert not pending.flush(0.2) and pending.report()["pending"] == 2
    down.clear()
    assert pending.flush(5) and done == ["a", "b"] and written.is_set()
    assert pending.report() == {"pending": 0, "pending_bytes": 0, "stored": 2, "dropped": 0}
    pending.close()


def test_kept_writes_are_bounded_in_bytes_and_in_time() -> None:
    clock = Clock()

    def down() -> None:
        raise StorageError("down")

    pending = PendingWrites(
        PendingSettings(max_bytes=100, max_age_s=60, first_s=0.01, cap_s=0.01), clock=clock
    )
    assert pending.add("a", 60, down)
    assert not pending.add("b", 60, down)  # no room: dropped at once
    assert pending.report()["pending_bytes"] == 60 and pending.dropped == 1
    clock.now += 61  # the store failed for longer than max_age_s: the write is dropped
    assert pending.flush(5) and pending.report() == {
        "pending": 0,
        "pending_bytes": 0,
        "stored": 0,
        "dropped": 2,
    }
    assert pending.add("c", 100, down)
    pending.close(0.5)  # still failing at shutdown: lost, and counted
    assert pending.report()["dropped"] == 3 and not pending.add("d", 1, down)
    assert not PendingWrites(PendingSettings(max_bytes=0)).add("e", 1, down)  # keeping is off


def test_a_write_past_its_deadline_that_then_fails_is_handed_on() -> None:
    from voxcast.storage.guard import GuardSettings, StoreGuard, StoreTimeout

    release, late = threading.Event(), []

    def slow_failure() -> None:
        release.wait(5)
        raise StorageError("down")

    guard = StoreGuard(GuardSettings(write_s=0.05))
    with pytest.raises(StoreTimeout):
        guard.write(slow_failure, on_late_error=late.append)
    release.set()
    guard.close()
    for _ in range(100):
        if late:
            break
        time.sleep(0.05)
    assert [str(e) for e in late] == ["down"]
