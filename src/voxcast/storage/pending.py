"""Writes the store failed, kept in memory and made again once it answers (bounded in bytes and time).

A request's complete file is stored after its audio went out (:mod:`voxcast.service.rendered`); when
the store fails then, the request stands (the failure is in ``cache_error``), but the file was lost:
a render never reached ``renders/``, a cache entry was never filled, even once the store came back.
:class:`PendingWrites` keeps such a write, the bytes being the process's own copy, and one thread
makes the oldest again after 1 s, 2 s, 4 s, ... (at most 30 s apart: one call per pause while the
store is down, not one per kept write); once one succeeds the next follows at once.

Bounds: at most ``max_bytes`` are kept (a write that does not fit is dropped at once), and a write
still failing ``max_age_s`` after it was kept is dropped. A process that exits first loses what is
still kept (logged); :meth:`PendingWrites.close` makes one last try of each while the store answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from voxcast.errors import StorageError

__all__ = ["PendingSettings", "PendingWrites"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingSettings:
    """Bounds of the kept writes (see :class:`voxcast.service.ServiceConfig`).

    Attributes:
        max_bytes: bytes kept at most (``VOXCAST_STORE_PENDING_MB``, 64 MiB); 0: nothing is kept.
        max_age_s: how long a kept write is tried again (``VOXCAST_STORE_PENDING_S``, 600).
        first_s: the first pause after a failure; each next one doubles.
        cap_s: the longest pause.
    """

    max_bytes: int = 64 * 2**20
    max_age_s: float = 600.0
    first_s: float = 1.0
    cap_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_bytes < 0 or self.max_age_s <= 0 or self.first_s <= 0 or self.cap_s < self.first_s:
            raise ValueError("kept writes need max bytes >= 0, a max age > 0 and pauses > 0")


@dataclass
class _Write:
    what: str
    nbytes: int
    write: Callable[[], Any]
    kept_at: float = field(default=0.0)


class PendingWrites:
    """Kept writes, made again oldest first on one daemon thread (started on first use). Thread-safe.

    Args:
        settings: the bounds and pauses.
        on_written: called after each kept write that succeeded (the store answers again: a
            service closes its guard's breaker, :meth:`~voxcast.storage.guard.StoreGuard.answered`).
        clock: monotonic seconds (tests pass a fake one to age writes).
    """

    def __init__(
        self,
        settings: PendingSettings | None = None,
        *,
        on_written: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or PendingSettings()
        self._on_written = on_written
        self._clock = clock
        self._items: deque[_Write] = deque()
        self._bytes = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self.stored = 0
        self.dropped = 0

    def add(self, what: str, nbytes: int, write: Callable[[], Any]) -> bool:
        """Keep ``write`` (a store call of ``nbytes`` bytes; ``what`` names it in log lines).

        Returns:
            False when it was not kept (no room, keeping is off, or closing): it is lost.
        """
        if self.settings.max_bytes == 0:
            return False
        with self._cond:
            if self._closing or self._bytes + nbytes > self.settings.max_bytes:
                self.dropped += 1
                room = self.settings.max_bytes - self._bytes
                log.warning(
                    "store: %s not kept to be written later (%d bytes; room for %d)", what, nbytes, room
                )
                return False
            self._items.append(_Write(what, nbytes, write, self._clock()))
            self._bytes += nbytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="voxcast-pending-writes", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        log.info("store: %s kept to be written when the store answers (%d kept)", what, len(self._items))
        return True

    def report(self) -> dict[str, int]:
        """``pending`` (writes kept), ``pending_bytes``, ``stored`` (later), ``dropped``."""
        with self._cond:
            return {
                "pending": len(self._items),
                "pending_bytes": self._bytes,
                "stored": self.stored,
                "dropped": self.dropped,
            }

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is kept (written or dropped); False if ``timeout_s`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._items, timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        """Try each kept write once more while the store answers (at most ``timeout_s``); drop the rest."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        with self._cond:
            lost, self._items, self._bytes = list(self._items), deque(), 0
            self.dropped += len(lost)
        if lost:
            log.warning(
                "store: %d kept writes lost at shutdown: %s", len(lost), ", ".join(w.what for w in lost)
            )

    # -- the thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._items or self._closing)
                self._expire()
                if not self._items:
                    if self._closing:
                        return
                    continue
                item = self._items[0]
            try:
                item.write()
            except StorageError as e:
                failures += 1
                if self._closing:
                    return
                pause = min(self.settings.cap_s, self.settings.first_s * 2 ** (failures - 1))
                log.info("store: %s still fails (%s); next try in %.0f s", item.what, e.message, pause)
                with self._cond:
                    self._cond.wait_for(lambda: self._closing, timeout=pause)
                continue
            except Exception:  # a bug in the write, not the store: trying again cannot help
                log.exception("store: %s failed; dropped", item.what)
                self._done(item, stored=False)
                continue
            failures = 0
            self._done(item, stored=True)
            log.warning("store: %s written %.0f s after it failed", item.what, self._clock() - item.kept_at)
            self._on_written()
            self._on_written()

    def _done(self, item: _Write, *, stored: bool) -> None:
        with self._cond:
            if self._items and self._items[0] is item:
                self._items.popleft()
                self._bytes -= item.nbytes
            if stored:
                self.stored += 1
            else:
                self.dropped += 1
            self._cond.notify_all()

    def _expire(self) -> None:
        """Drop the writes kept longer than ``max_age_s`` (call with the lock held)."""
        now = self._clock()
        while self._items and now - self._items[0].kept_at > self.settings.max_age_s:
            old = self._items.popleft()
            self._bytes -= old.nbytes
            self.dropped += 1
            log.warning("store: %s dropped: the store failed for %.0f s", old.what, now - old.kept_at)
        self._cond.notify_all()
