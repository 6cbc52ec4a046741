"""Give freed heap memory back to the operating system.

glibc keeps freed blocks of a large allocation in its arenas, so a process that once decoded a big
buffer keeps the resident memory. ``malloc_trim(0)`` returns free pages; on other C libraries this is
a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

__all__ = ["trim_heap"]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim_heap() -> bool:
    """Return free heap pages to the OS; False where the C library has no ``malloc_trim``."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
