"""Ending a serving process at once, logs flushed first (shared by the RunPod handler and the HTTP server)."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import sys

__all__ = ["die"]


def die(code: int) -> None:
    """Exit now, flushing logs first (``os._exit``: engine threads must not keep a broken process alive).

    Child processes (the RunPod SDK's heartbeat process) are stopped first: ``os._exit`` skips the
    ``atexit`` hook that would, and they would outlive the worker."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(Exception):
            child.terminate()
            child.join(2)
    logging.shutdown()
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    os._exit(code)
