"""Resident memory: read it, and hand freed heap memory back to the operating system.

Loading a checkpoint and warming up allocate and free gigabytes of temporary tensors (weights read
in one dtype and stored in another, projections fused or quantized, warm-up activations), and
decoding a long reference recording frees a big buffer. glibc serves blocks up to 32 MB from its
heap and keeps freed heap memory for reuse, so a process that loaded a 0.6B model stays hundreds of
MB to GB above what it holds (measured by ``scripts/bench_memory.py``). ``malloc_trim(0)`` returns
those free pages; afterwards allocations take pages back as they need them. Elsewhere (not
Linux/glibc) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import os
from collections.abc import Callable

__all__ = ["rss_mb", "trim_heap"]

log = logging.getLogger(__name__)


def rss_mb() -> float | None:
    """This process's resident memory in MB (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return None


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


def trim_heap(*, collect: bool = True) -> dict[str, float] | None:
    """Return free heap pages to the OS (after a garbage collection unless ``collect=False``).

    Returns:
        ``{"rss_before_mb", "rss_after_mb"}``, or None where glibc's ``malloc_trim`` or /proc is
        not available (the pages are still returned when only /proc is missing).
    """
    if collect:
        gc.collect()
    before = rss_mb()
    trim = _malloc_trim()
    if trim is None:
        return None
    trim(0)
    after = rss_mb()
    if before is None or after is None:
        return None
    log.info("returned free heap memory: RSS %.0f -> %.0f MB", before, after)
    return {"rss_before_mb": before, "rss_after_mb": after}
