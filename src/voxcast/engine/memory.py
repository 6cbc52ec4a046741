"""Resident memory: read it, and hand freed heap memory back to the OS after start-up.

Loading a checkpoint and warming up allocate and free gigabytes of temporary tensors (weights read
in one dtype and stored in another, projections fused or quantized, warm-up activations). glibc
serves blocks up to 32 MB from its heap and keeps freed heap memory for reuse, so a process that
loaded a 0.6B model stays hundreds of MB to GB above what it holds (measured by
``scripts/bench_memory.py``). ``malloc_trim(0)`` returns those free pages; afterwards a stream's
allocations take pages back as they need them. Elsewhere (not Linux/glibc) this does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os

__all__ = ["rss_mb", "trim_heap"]

log = logging.getLogger(__name__)


def rss_mb() -> float | None:
    """This process's resident memory in MB (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return None


def trim_heap() -> dict[str, float] | None:
    """Collect garbage and return free heap pages to the OS.

    Returns:
        ``{"rss_before_mb", "rss_after_mb"}``, or None where glibc's ``malloc_trim`` or /proc is
        not available.
    """
    gc.collect()
    before = rss_mb()
    trim = None
    with contextlib.suppress(OSError, AttributeError):
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    if trim is None or before is None:
        return None
    trim(0)
    after = rss_mb()
    if after is None:
        return None
    log.info("returned free heap memory: RSS %.0f -> %.0f MB", before, after)
    return {"rss_before_mb": before, "rss_after_mb": after}
