"""Deadlines and a circuit breaker for the store calls a request makes on its way.

A cache lookup runs before generation starts; a fill or a stored render runs before the final
message. With S3's own timeouts and retries a hung store could hold either for ~50 s. Through
:class:`StoreGuard`:

- a call gets a deadline: the request waits that long, then goes on (a lookup counts as a miss, a
  write is reported as not confirmed) while the call finishes on a guard thread; a lookup that
  answers late has its stream closed;
- ``failures`` errors or missed deadlines in a row open the breaker: for ``cooldown_s`` every guarded
  call is skipped at once (:class:`StoreSkipped`), then one call probes the store (half-open); a
  success closes the breaker. Opening and closing are logged; :meth:`StoreGuard.report` says where it
  stands.

Calls to a store that cannot hang on a network (the local directory, ``BlobStore.remote`` false) run
inline: their deadline would only add a thread hop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from voxcast.errors import StorageError

__all__ = ["GuardSettings", "StoreGuard", "StoreSkipped", "StoreTimeout"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoreSkipped(StorageError):
    """The breaker is open: the store failed repeatedly and is not being called for a while."""


class StoreTimeout(StorageError):
    """The store did not answer within the call's deadline (the call goes on in the background)."""


@dataclass(frozen=True)
class GuardSettings:
    """Deadlines and breaker thresholds (see :class:`voxcast.service.ServiceConfig`)."""

    lookup_s: float = 0.1
    write_s: float = 10.0
    failures: int = 3
    cooldown_s: float = 30.0
    threads: int = 4

    def __post_init__(self) -> None:
        if self.lookup_s <= 0 or self.write_s <= 0 or self.cooldown_s < 0:
            raise ValueError("store deadlines must be > 0 and the breaker cooldown >= 0")
        if self.failures < 1 or self.threads < 1:
            raise ValueError("breaker failures and guard threads must be >= 1")


class StoreGuard:
    """Runs store calls with a deadline behind a circuit breaker (thread-safe)."""

    def __init__(
        self,
        settings: GuardSettings | None = None,
        *,
        inline: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or GuardSettings()
        self._inline = inline
        self._clock = clock
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until = 0.0
        self._probing = False
        self.skipped = 0
        self.timeouts = 0
        self.errors = 0

    # -- calls ----------------------------------------------------------------------------------
    def call(
        self,
        fn: Callable[[], T],
        deadline_s: float,
        *,
        on_late: Callable[[T], None] | None = None,
        on_late_error: Callable[[StorageError], object] | None = None,
    ) -> T:
        """``fn()`` within ``deadline_s``.

        Raises:
            StoreSkipped: the breaker is open. StoreTimeout: no answer in time (``fn`` goes on; its
            late result is passed to ``on_late``, or its late StorageError to ``on_late_error``).
            StorageError: ``fn`` raised it.
        """
        self._admit()
        if self._inline:
            try:
                result = fn()
            except StorageError:
                self._failed("error")
                raise
            self._succeeded()
            return result
        future = self._executor().submit(fn)
        try:
            result = future.result(timeout=deadline_s)
        except FutureTimeout:
            self._failed("timeout")
            future.add_done_callback(lambda f: self._late(f, on_late, on_late_error))
            raise StoreTimeout(f"the store did not answer within {deadline_s * 1000:.0f} ms") from None
        except StorageError:
            self._failed("error")
            raise
        self._succeeded()
        return result

    def lookup(self, fn: Callable[[], T], *, on_late: Callable[[T], None] | None = None) -> T:
        return self.call(fn, self.settings.lookup_s, on_late=on_late)

    def write(
        self, fn: Callable[[], T], *, on_late_error: Callable[[StorageError], object] | None = None
    ) -> T:
        return self.call(fn, self.settings.write_s, on_late_error=on_late_error)

    # -- state ----------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        with self._lock:
            if self._open_until == 0.0:
                return "closed"
            return "open" if self._clock() < self._open_until else "half-open"

    def report(self) -> dict[str, Any]:
        with self._lock:
            left = max(0.0, self._open_until - self._clock()) if self._open_until else 0.0
            failures = self._failures
        return {
            "state": self.state,
            "consecutive_failures": failures,
            "open_for_s": round(left, 1),
            "skipped": self.skipped,
            "timeouts": self.timeouts,
            "errors": self.errors,
        }

    def answered(self) -> None:
        """The store answered a call made outside the guard (a kept write made later): close the
        breaker now rather than after its cooldown."""
        self._succeeded()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- internals ------------------------------------------------------------------------------
    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.settings.threads, thread_name_prefix="voxcast-store")
            return self._pool

    def _admit(self) -> None:
        with self._lock:
            if self._open_until == 0.0:
                return
            if self._clock() < self._open_until or self._probing:
                self.skipped += 1
                left = max(0.0, self._open_until - self._clock())
                raise StoreSkipped(
                    f"the store is skipped for {left:.0f} s more after {self._failures} failures in a row"
                )
            self._probing = True  # half-open: this call probes the store

    def _succeeded(self) -> None:
        with self._lock:
            was_open = self._open_until != 0.0
            self._failures, self._open_until, self._probing = 0, 0.0, False
        if was_open:
            log.warning("store answered again: circuit closed")

    def _failed(self, kind: str) -> None:
        with self._lock:
            if kind == "timeout":
                self.timeouts += 1
            else:
                self.errors += 1
            self._failures += 1
            self._probing = False
            opens = self._failures >= self.settings.failures
            if opens:
                self._open_until = self._clock() + self.settings.cooldown_s
            failures = self._failures
        if opens:
            log.warning(
                "store failed %d times in a row (last: %s): skipping it for %.0f s",
                failures,
                kind,
                self.settings.cooldown_s,
            )

    @staticmethod
    def _late(
        future: Future[Any],
        on_late: Callable[[Any], None] | None,
        on_late_error: Callable[[StorageError], object] | None,
    ) -> None:
        if future.cancelled():
            return
        error = future.exception()
        try:
            if error is None and on_late is not None:
                on_late(future.result())
            elif isinstance(error, StorageError) and on_late_error is not None:
                on_late_error(error)
        except Exception as e:  # a late callback must not kill the guard thread
            log.warning("store: handling a late answer failed: %s", e)
