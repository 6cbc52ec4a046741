"""The consumer side of one synthesis: a lazy iterator of :class:`AudioChunk`.

Nothing runs until the first ``next()``: then the request is handed to the engine's scheduler
thread, and chunks arrive through a queue as frames are decoded. ``timing`` is complete once the
iterator is exhausted; its ``ttfa_ms`` and ``total_ms`` count from ``t_origin``: the first ``next()``
unless the caller set an earlier moment (the service sets the time it received the request, so
voice resolution is included). ``cancel()`` may be called from any thread; the scheduler notices before its
next frame and the iterator ends (``timing.finish_reason == "cancelled"``).

A stream opened for text that arrives in pieces (``Engine.open``) has a :class:`TextFeed`:
``push(delta)`` as the text comes, ``close_text()`` when it is complete. Audio starts as soon as the
text decides the prompt; iterate on one thread while pushing from another (or push between
``next()`` calls: a stream waiting for text blocks ``next()`` until text arrives or it times out).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from voxcast.engine.chunks import AudioChunk
from voxcast.engine.request import SynthesisRequest
from voxcast.engine.text_feed import TextFeed, require_feed
from voxcast.engine.timing import Timing
from voxcast.errors import EngineUnavailable

__all__ = ["SynthesisStream"]

_END = object()
_POLL_S = 0.5


class SynthesisStream(Iterator[AudioChunk]):
    """Iterator over the chunks of one request (see module docstring)."""

    def __init__(
        self,
        request: SynthesisRequest,
        voice: Any,
        submit: Callable[[SynthesisStream], None],
        alive: Callable[[], bool],
        prepare: Callable[[SynthesisStream], None] | None = None,
        feed: TextFeed | None = None,
        on_cancel: Callable[[], None] | None = None,
        *,
        realtime: bool = True,
        refusable: bool = False,
    ) -> None:
        self.request = request
        #: Someone plays it as it arrives (pacing keeps it ahead of playback); False: no deadline.
        self.realtime = realtime
        #: Refused with :class:`~voxcast.errors.OverCapacity` when the engine is full (else it waits).
        self.refusable = refusable
        self.voice = voice
        #: The text as it arrives (None: the request's text is the whole text).
        self.feed = feed
        self._on_cancel = on_cancel
        self.timing = Timing(request_id=request.request_id or "")
        #: When the request began, for ``timing.ttfa_ms`` / ``total_ms`` (perf_counter seconds); a
        #: caller may set it before iterating, otherwise the first ``next()`` does.
        self.t_origin: float | None = None
        #: When the request was handed to the scheduler (after a voice built from ``ref_audio``).
        self.t_submit = 0.0
        self._submit = submit
        self._alive = alive
        self._prepare = prepare
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._taken = threading.Event()  # set when the consumer took an item (the first-chunk hand-off)
        self._cancel = threading.Event()
        self._started = False
        self._finished = False
        self._done = False  # the producer put its last item (the end or an error)

    # -- consumer side -------------------------------------------------------------------------
    def __iter__(self) -> SynthesisStream:
        return self

    def __next__(self) -> AudioChunk:
        if self._finished:
            raise StopIteration
        if not self._started:
            self._start()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._alive():
                    self._finished = True
                    raise EngineUnavailable("the engine stopped while this request was running") from None
        self._taken.set()
        if item is _END:
            self._finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        assert isinstance(item, AudioChunk)
        return item

    def _start(self) -> None:
        self._started = True
        if self.t_origin is None:
            self.t_origin = time.perf_counter()
        if self._prepare is not None:
            try:
                self._prepare(self)
            except BaseException:
                self._finished = True
                raise
        self.t_submit = time.perf_counter()
        try:
            self._submit(self)
        except BaseException:
            self._finished = True
            raise

    def cancel(self) -> None:
        """Stop generating (thread-safe); the iterator ends within one frame."""
        self._cancel.set()
        if self._on_cancel is not None:
            self._on_cancel()

    def push(self, delta: str | bytes) -> None:
        """Add text to a stream opened for text in pieces (thread-safe).

        Raises:
            InvalidRequest: the stream was not opened for text in pieces, its text is complete, or
                the text grew too long (field "text").
        """
        require_feed(self.feed).push(delta)

    def close_text(self) -> None:
        """The text is complete: the stream speaks to its end, then ends (thread-safe, idempotent)."""
        require_feed(self.feed).close()

    close = cancel

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def started_at(self) -> float:
        """``t_origin`` once the stream has started (perf_counter seconds)."""
        return self.t_origin if self.t_origin is not None else self.t_submit

    @property
    def finished(self) -> bool:
        """True once the iterator has ended (normally, by error or by cancellation)."""
        return self._finished

    @property
    def done(self) -> bool:
        """True once the engine is through with it (ended or failed): text pushed now is never spoken;
        chunks may still wait to be read."""
        return self._done

    def __del__(self) -> None:
        self._cancel.set()

    # -- producer side (scheduler thread) ------------------------------------------------------
    def _put(self, chunk: AudioChunk) -> None:
        self._queue.put(chunk)

    def _fail(self, exc: BaseException) -> None:
        self._done = True
        self._queue.put(exc)

    def _end(self) -> None:
        self._done = True
        self._queue.put(_END)
