"""A thread-safe LRU map bounded by the total size of its values in bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

__all__ = ["ByteLRU"]

V = TypeVar("V")


class ByteLRU(Generic[V]):
    """Least-recently-used cache whose budget is bytes, not entries.

    Args:
        max_bytes: total size budget; an item larger than this is not cached at all.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        """The value (marked most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, value: V, size: int) -> bool:
        """Insert or replace ``key``; evict the least recently used until within budget.

        Returns:
            False if ``size`` alone exceeds the budget (the value is then not cached).
        """
        with self._lock:
            self._pop(key)
            if size > self.max_bytes:
                return False
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, old) = self._items.popitem(last=False)
                self._bytes -= old
            return True

    def discard(self, key: str) -> None:
        """Remove ``key`` if present."""
        with self._lock:
            self._pop(key)

    def clear(self) -> None:
        """Remove everything."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def _pop(self, key: str) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self._bytes -= item[1]

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
