"""The text of one stream as it arrives (an LLM's tokens): written by the caller, read by the scheduler.

The caller pushes deltas (split anywhere: inside words, between a letter and its combining mark; as
``bytes``, even inside a UTF-8 sequence) and closes the text when it is complete; the scheduler
reads a snapshot (the text so far, whether it is complete, a version number) whenever the version
changed. Pushing wakes the scheduler.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable

from voxcast.engine.request import MAX_TEXT_CHARS
from voxcast.errors import InvalidRequest

__all__ = ["TextFeed", "require_feed"]


class TextFeed:
    """Thread-safe accumulation of one stream's text deltas.

    Args:
        max_chars: the most characters the whole text may have (a request's limit by default).
        text: text known from the start (pushed, so held to the same limit).
        on_change: called (on the writer's thread) after every push and on close.
    """

    def __init__(
        self, max_chars: int = MAX_TEXT_CHARS, text: str = "", on_change: Callable[[], None] | None = None
    ) -> None:
        self.max_chars = max_chars
        self.on_change = on_change
        self._lock = threading.Lock()
        self._parts: list[str] = []
        self._chars = 0
        self._bytes = codecs.getincrementaldecoder("utf-8")("strict")
        self._closed = False
        self._version = 0
        #: monotonic time of the last push or close (the scheduler's wait timeout counts from it)
        self.last_change = time.monotonic()
        if text:
            self.push(text)

    def push(self, delta: str | bytes) -> None:
        """Append a piece of text.

        Raises:
            InvalidRequest: the text is already complete, the whole text would exceed ``max_chars``
                or ``bytes`` are not UTF-8 (field "text").
        """
        with self._lock:
            if self._closed:
                raise InvalidRequest("this stream's text is already complete", field="text")
            if isinstance(delta, bytes):
                try:
                    delta = self._bytes.decode(delta)
                except UnicodeDecodeError as e:
                    raise InvalidRequest(f"text is not valid UTF-8: {e.reason}", field="text") from None
            if self._chars + len(delta) > self.max_chars:
                raise InvalidRequest(
                    f"text would have more than {self.max_chars} characters; the limit is {self.max_chars}",
                    field="text",
                )
            if not delta:
                return
            self._parts.append(delta)
            self._chars += len(delta)
            self._changed()
        self._notify()

    def close(self) -> None:
        """The text is complete (idempotent).

        Raises:
            InvalidRequest: ``bytes`` pushed so far end inside a UTF-8 sequence (field "text").
        """
        with self._lock:
            if self._closed:
                return
            try:
                tail = self._bytes.decode(b"", final=True)
            except UnicodeDecodeError as e:
                raise InvalidRequest(
                    f"text ends inside a UTF-8 character: {e.reason}", field="text"
                ) from None
            if tail:
                self._parts.append(tail)
            self._closed = True
            self._changed()
        self._notify()

    def snapshot(self) -> tuple[str, bool, int]:
        """``(text so far, complete, version)``; the version changes with every push and the close."""
        with self._lock:
            if len(self._parts) > 1:
                self._parts = ["".join(self._parts)]
            return (self._parts[0] if self._parts else ""), self._closed, self._version

    @property
    def version(self) -> int:
        return self._version

    @property
    def closed(self) -> bool:
        return self._closed

    def _changed(self) -> None:
        self._version += 1
        self.last_change = time.monotonic()

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()


def require_feed(feed: TextFeed | None) -> TextFeed:
    """``feed``, for a stream that takes text in pieces.

    Raises:
        InvalidRequest: the stream was given its whole text (field "text").
    """
    if feed is None:
        raise InvalidRequest("this stream was given its whole text; it takes no more", field="text")
    return feed
