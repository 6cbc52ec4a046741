"""Graceful stop of a serving process (RQ worker, RunPod queue worker): drain, then cancel.

On SIGTERM/SIGINT a process stops taking new work (its platform loop does that part) and calls
:meth:`Drain.begin`: the process reports ``draining`` from then on, and the work in flight may finish
until ``VOXCAST_DRAIN_S`` has passed. At that deadline every piece of work still registered with
:meth:`Drain.track` is cancelled with :data:`SHUTDOWN` as its reason, so its caller is told (a
``cancelled`` entry with reason ``shutdown``, an error ``shutdown``), never cut off silently.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping

from voxcast.envvars import env_float
from voxcast.errors import VoxcastError

__all__ = ["DEFAULT_DRAIN_S", "SHUTDOWN", "Drain", "WorkerShutdown", "drain_seconds"]

log = logging.getLogger(__name__)

SHUTDOWN = "shutdown"
"""The error code / cancel reason of work cut at the drain deadline."""

DEFAULT_DRAIN_S = 30.0
"""``VOXCAST_DRAIN_S`` when unset."""


def drain_seconds(env: Mapping[str, str]) -> float:
    """``VOXCAST_DRAIN_S``: how long work in flight may go on after SIGTERM/SIGINT (>= 0).

    Raises:
        ValueError: malformed or negative, naming the variable.
    """
    return env_float(env, "VOXCAST_DRAIN_S", DEFAULT_DRAIN_S, lo=0.0)


class WorkerShutdown(VoxcastError):
    """Work cancelled because its process was stopping and the drain deadline passed."""

    code = SHUTDOWN


class Drain:
    """The drain of one process.

    Args:
        deadline_s: how long work in flight may run after :meth:`begin` (0: cancel at once).
        on_begin: called once, on the thread that calls :meth:`begin` (a signal handler: keep it
            short), e.g. to report ``draining``.
    """

    def __init__(self, deadline_s: float, on_begin: Callable[[], None] | None = None) -> None:
        self.deadline_s = max(0.0, deadline_s)
        self.on_begin = on_begin
        self.expired = threading.Event()
        # Reentrant: begin() runs in a signal handler on the main thread, which may be inside
        # track()'s locked section right then (requests on the event loop); a plain lock deadlocked.
        self._lock = threading.RLock()
        self._work: dict[int, Callable[[str], None]] = {}
        self._ids = itertools.count()
        self._idle = threading.Condition(self._lock)
        self.begun = False
        self._told: threading.Thread | None = None

    @property
    def reason(self) -> str:
        """The message given to work cancelled at the deadline."""
        return f"the worker is shutting down (drain deadline of {self.deadline_s:g} s passed)"

    def begin(self) -> bool:
        """Start draining (once; later calls do nothing and return False)."""
        with self._lock:
            if self.begun:
                return False
            self.begun = True
            active = len(self._work)
        if self.on_begin is not None:
            self.on_begin()
        # logged from another thread: a signal handler that writes to the log stream while the main
        # thread is inside a write of its own fails ("reentrant call inside BufferedWriter")
        self._told = threading.Thread(
            target=log.info,
            args=("draining: %d in flight, deadline %g s", active, self.deadline_s),
            name="voxcast-drain-log",
            daemon=True,
        )
        self._told.start()
        timer = threading.Timer(self.deadline_s, self._expire)
        timer.daemon = True
        timer.name = "voxcast-drain"
        timer.start()
        return True

    @contextlib.contextmanager
    def track(self, cancel: Callable[[str], None]) -> Iterator[None]:
        """Register work in flight for the ``with`` block; ``cancel(reason)`` stops it at the deadline
        (from the drain's timer thread; it must be thread-safe and must not block). Work that starts
        after the deadline is cancelled at once."""
        key = next(self._ids)
        with self._lock:
            self._work[key] = cancel
        if self.expired.is_set():
            cancel(self.reason)
        try:
            yield
        finally:
            with self._lock:
                self._work.pop(key, None)
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Until no work is tracked; False if ``timeout_s`` passed first."""
        if self._told is not None:  # the "draining" line is in the log before the process moves on
            self._told.join(1.0)
        with self._lock:
            return self._idle.wait_for(lambda: not self._work, timeout=timeout_s)

    def _expire(self) -> None:
        with self._lock:
            cancels = list(self._work.values())
            self.expired.set()
        if cancels:
            log.warning("drain deadline passed: cancelling %d in flight", len(cancels))
        for cancel in cancels:
            try:
                cancel(self.reason)
            except Exception:
                log.exception("cancelling work at the drain deadline failed")
