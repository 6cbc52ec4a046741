"""StoreGuard: deadlines, late answers, and the circuit breaker (a fake clock; calls held by events)."""

from __future__ import annotations

import threading

import pytest

from voxcast.errors import StorageError
from voxcast.storage.guard import GuardSettings, StoreGuard, StoreSkipped, StoreTimeout


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_call_past_its_deadline_raises_and_its_late_answer_is_handed_over() -> None:
    guard = StoreGuard(GuardSettings(lookup_s=0.05))
    release, late = threading.Event(), threading.Event()
    got: list[str] = []

    def hung() -> str:
        release.wait(30)
        return "late value"

    with pytest.raises(StoreTimeout, match="within 50 ms"):
        guard.lookup(hung, on_late=lambda v: (got.append(v), late.set()))
    release.set()
    assert late.wait(30) and got == ["late value"]
    assert guard.report()["timeouts"] == 1 and guard.state == "closed"  # one failure of three
    guard.close()


def test_failures_in_a_row_open_the_breaker_then_one_probe_closes_it() -> None:
    clock = Clock()
    guard = StoreGuard(GuardSettings(failures=2, cooldown_s=30), inline=True, clock=clock)

    def broken() -> None:
        raise StorageError("connection refused")

    calls = 0

    def healthy() -> str:
        nonlocal calls
        calls += 1
        return "ok"

    with pytest.raises(StorageError):
        guard.write(broken)
    assert guard.lookup(healthy) == "ok"  # a success in between resets the count
    for _ in range(2):
        with pytest.raises(StorageError):
            guard.write(broken)
    assert guard.state == "open"
    with pytest.raises(StoreSkipped, match="2 failures in a row"):
        guard.lookup(healthy)
    assert calls == 1 and guard.report()["skipped"] == 1  # skipped without calling the store
    clock.now += 31
    assert guard.state == "half-open"
    with pytest.raises(StorageError):
        guard.write(broken)  # the probe fails: open again for another cooldown
    assert guard.state == "open"
    clock.now += 31
    assert guard.lookup(healthy) == "ok" and guard.state == "closed" and calls == 2


def test_only_one_probe_while_half_open() -> None:
    clock = Clock()
    guard = StoreGuard(GuardSettings(failures=1, cooldown_s=5), clock=clock)
    with pytest.raises(StorageError):
        guard.write(lambda: (_ for _ in ()).throw(StorageError("down")))
    clock.now += 6
    entered, release = threading.Event(), threading.Event()

    def probe() -> str:
        entered.set()
        release.wait(30)
        return "up"

    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(guard.call(probe, 30)))
    t.start()
    assert entered.wait(30)
    with pytest.raises(StoreSkipped):  # a second caller does not pile onto a store being probed
        guard.lookup(lambda: "x")
    release.set()
    t.join(30)
    assert result == ["up"] and guard.state == "closed"
    guard.close()


@pytest.mark.parametrize(
    "kwargs", [{"lookup_s": 0}, {"write_s": -1}, {"failures": 0}, {"cooldown_s": -1}, {"threads": 0}]
)
def test_bad_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        GuardSettings(**kwargs)
