"""Keep the scheduler thread the only long-lived thread with an OpenMP team.

PyTorch's CPU kernels run their parallel regions on OpenMP (GNU libgomp in the PyPI wheels). Every
thread that starts a parallel region gets its own team of worker threads, kept until that thread
exits, and libgomp counts all of them: once more threads are managed than there are CPUs, workers stop
spin-waiting between regions (a ~100-spin "throttled" wait) and sleep in the kernel, so every later
region pays a futex wake-up. A decode frame runs hundreds of small regions (int8 linears, attention):
measured on 2 cores (0.6B, int8, one stream), a frame took 87-92 ms on a thread whose team was the only
one and 127-135 ms on a thread started after the main thread had run torch work (quantized linears
+28%, attention 3.3x). The engine therefore runs its one-off torch work (loading, voice prompts,
warm-up) on short-lived threads, whose teams end with them, and leaves the scheduler thread the only
lasting team.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["on_fresh_thread"]

T = TypeVar("T")


def on_fresh_thread(fn: Callable[[], T], name: str = "voxcast-oneoff") -> T:
    """``fn()`` on a new thread that ends with it (its OpenMP team too); its result or its exception."""
    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # handed to the caller below
            err.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if err:
        raise err[0]
    return out[0]
