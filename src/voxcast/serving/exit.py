"""Ending a serving process at once, logs flushed first (shared by the RunPod handler and the HTTP server)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

__all__ = ["die"]


def die(code: int) -> None:
    """Exit now, flushing logs first (``os._exit``: engine threads must not keep a broken process alive)."""
    logging.shutdown()
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    os._exit(code)
