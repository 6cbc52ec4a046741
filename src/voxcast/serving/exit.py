"""Ending a serving process at once, logs flushed first (shared by the RunPod handler and the HTTP server)."""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

__all__ = ["die", "ends_process"]

P = ParamSpec("P")


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


def ends_process(command: Callable[P, int]) -> Callable[P, int]:
    """A serving command that ends its process through :func:`die` with the code it returns.

    A serving process must not end through the interpreter's normal exit: a daemon thread still
    inside a torch call then (an engine thread recording a step, a decode finishing a cancelled
    stream's window) is torn down in C++ code that may not unwind, and the process aborts
    (SIGABRT, "terminate called without an active exception") instead of exiting with its code."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> int:
        code = command(*args, **kwargs)
        die(code)
        return code  # only reached when die is patched out in tests

    return run
