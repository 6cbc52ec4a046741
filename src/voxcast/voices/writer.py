"""A background writer: store writes that a request need not wait for, run in order on one thread.

A request that brings a new reference clip needs the built voice at once, but not the voice's copy in
the store: that copy only spares other workers (and later restarts) the build. Writing it before the
first audio put two store round trips (the prompt and its sidecar, each retried with backoff while
the store is down) on that request's critical path. :class:`BackgroundWriter` runs such writes on one
daemon thread, in submission order; :meth:`flush` waits for everything submitted so far (shutdown,
tests, and anything that must see the store up to date, such as a delete).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["BackgroundWriter"]

log = logging.getLogger(__name__)

#: At interpreter exit, how long the queued writes may still take.
_EXIT_WAIT_S = 30.0


class BackgroundWriter:
    """Runs submitted callables one at a time, in order, on a daemon thread started on first use.

    A callable's exception is logged and dropped (the caller arranged for a later retry); the thread
    keeps going. Thread-safe.
    """

    def __init__(self, name: str = "voxcast-writer") -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, fn: Callable[[], None]) -> None:
        """Queue ``fn``; it runs after everything submitted before it (once the writer is closed: now,
        on the calling thread, with the same handling of its exception)."""
        with self._idle:
            closed = self._closed
            if not closed:
                self._pending += 1
            if not closed and self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                # a daemon thread dies with the interpreter: let what is queued finish first
                atexit.register(self.flush, _EXIT_WAIT_S)
        if closed:
            self._call(fn)
        else:
            self._queue.put(fn)

    @property
    def pending(self) -> int:
        """Callables submitted and not finished yet."""
        return self._pending

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything submitted so far has run; False if ``timeout`` (s) passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Run what is queued, then stop the thread; later :meth:`submit` calls run on their caller.

        Returns:
            False if ``timeout`` (s) passed before the queue drained (the thread then ends after it).
        """
        with self._idle:
            if self._closed:
                return self._pending == 0
            self._closed = True
            started = self._thread is not None
        if not started:
            return True
        self._queue.put(None)
        return self.flush(timeout)

    def _run(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                return
            try:
                self._call(fn)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    @staticmethod
    def _call(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # the caller's retry path covers it; the writer must keep going
            log.exception("background write failed")
