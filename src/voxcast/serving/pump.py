"""Run a blocking iterator on its own thread and consume it from asyncio without blocking the loop.

The RunPod SDK runs every job as a task on one event loop (several at once when
``concurrency_modifier`` > 1) and also uses that loop to POST each yielded message. An engine
stream blocks while the model computes the next frame, so it must never be iterated on the loop:
:class:`ThreadPump` iterates it on a dedicated thread and hands each item over with
``loop.call_soon_threadsafe``. A bounded number of items may wait for the consumer; beyond that the
producer thread waits (back-pressure), never the loop. Used by the RunPod handler and the HTTP server;
the HTTP server also gives up on a consumer that stops reading (``stall_s``).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["ThreadPump"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_ITEM, _END, _ERROR = "item", "end", "error"


class ThreadPump(Generic[T]):
    """Async iterator over ``source``, which is iterated on a separate daemon thread.

    Args:
        source: a blocking iterable (e.g. an engine stream); iterated only on the pump's thread.
        maxsize: items that may wait for the consumer before the producer thread blocks.
        on_item: called on the producer thread with each item before it is handed over (for
            blocking side work such as publishing to Redis); an exception from it ends the pump.
        name: thread name (for logs and debuggers).
        stall_s: give up on a consumer that leaves the queue full this long (a client that stopped
            reading): the pump closes itself, sets :attr:`stalled` and calls ``on_stall`` (e.g. to
            cancel the source). None: wait as long as it takes.
        on_stall: called on the producer thread when ``stall_s`` ran out.

    Use ``async for item in pump`` after :meth:`start`; call :meth:`close` when the consumer stops
    early (it never blocks). After ``close`` the producer keeps iterating ``source`` to its end but
    discards the items (so the source can finish its own bookkeeping): stop the source first (e.g.
    ``stream.cancel()``), or it runs to completion. An exception raised by ``source`` is re-raised
    to the consumer.
    """

    def __init__(
        self,
        source: Iterable[T],
        *,
        maxsize: int = 16,
        on_item: Callable[[T], None] | None = None,
        name: str = "voxcast-pump",
        stall_s: float | None = None,
        on_stall: Callable[[], None] | None = None,
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be >= 1")
        self._source = source
        self._on_item = on_item
        self._stall_s = stall_s
        self._on_stall = on_stall
        self.stalled = False
        """True once the consumer left the queue full for ``stall_s`` (the pump then closed itself)."""
        self._slots = threading.Semaphore(maxsize)
        self._closed = threading.Event()
        self._finished = threading.Event()
        self._pending: deque[tuple[str, Any]] = deque()  # touched on the loop thread only
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run_in_context, name=name, daemon=True)
        self._context: contextvars.Context | None = None
        self.items_after_close = 0
        """Items ``source`` produced after :meth:`close` (drained and discarded)."""
        self.t_started = 0.0
        """``time.perf_counter()`` when the producer thread started iterating ``source``."""

    def start(self) -> ThreadPump[T]:
        """Start the producer thread; must be called from the consuming event loop."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._context = contextvars.copy_context()  # the producer logs under the consumer's request id
        self._thread.start()
        return self

    def _run_in_context(self) -> None:
        assert self._context is not None
        self._context.run(self._run)

    @property
    def finished(self) -> bool:
        """True once the producer thread has stopped iterating ``source``."""
        return self._finished.is_set()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed.is_set()

    def close(self) -> None:
        """Stop handing items over; the producer drains ``source`` without waiting. Never blocks."""
        self._closed.set()
        self._slots.release()  # wake a producer waiting for room

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the producer thread (blocking!); True if it ended."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    async def wait_finished(self, timeout_s: float) -> bool:
        """Wait on the loop (without blocking it) until the producer ended; True if it did."""
        return await asyncio.to_thread(self._finished.wait, timeout_s)

    def __aiter__(self) -> ThreadPump[T]:
        return self

    async def __anext__(self) -> T:
        assert self._wakeup is not None, "start() first"
        while not self._pending:
            self._wakeup.clear()
            await self._wakeup.wait()
        kind, value = self._pending.popleft()
        if kind == _ITEM:
            self._slots.release()
            return value
        self._pending.appendleft((kind, value))  # the end (or error) stays: later calls see it too
        if kind == _ERROR:
            raise value
        raise StopAsyncIteration

    def take_ready(self, limit: int) -> list[T]:
        """Up to ``limit`` items that have already arrived, without waiting (the end of the source
        or its error stays queued for the next ``__anext__``)."""
        out: list[T] = []
        while self._pending and self._pending[0][0] == _ITEM and len(out) < limit:
            out.append(self._pending.popleft()[1])
            self._slots.release()
        return out

    def _push(self, entry: tuple[str, Any]) -> None:
        """Loop side of a hand-over."""
        self._pending.append(entry)
        assert self._wakeup is not None
        self._wakeup.set()

    # -------------------------------------------------------------- producer side
    def _run(self) -> None:
        self.t_started = time.perf_counter()
        try:
            self._produce(iter(self._source))
        except BaseException as e:  # handed to the consumer, which decides
            self._finished.set()  # before the hand-over: a consumer that sees the end sees it finished
            self._post(_ERROR, e)
        else:
            self._finished.set()
            self._post(_END, None)

    def _produce(self, it: Iterator[T]) -> None:
        for item in it:
            if self._closed.is_set():
                self.items_after_close += 1
                continue
            if self._on_item is not None:
                self._on_item(item)
            if not self._slots.acquire(timeout=self._stall_s):
                self.stalled = True
                self._closed.set()
                log.warning(
                    "pump %s: the consumer stopped reading for %.1f s", self._thread.name, self._stall_s
                )
                if self._on_stall is not None:
                    self._on_stall()
                continue
            if not self._closed.is_set():
                self._post(_ITEM, item)

    def _post(self, kind: str, value: Any) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._push, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            log.debug("pump %s: event loop closed; dropping %s", self._thread.name, kind)
