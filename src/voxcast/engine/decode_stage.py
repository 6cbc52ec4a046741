"""The decode stage: audio decoding on its own thread, overlapped with generating the next frames.

The scheduler thread generates a frame for every active stream per round; turning a chunk of codes
into audio (the stateful streaming codec decoder) costs tens of ms per frame on a CPU. Done inline,
every stream's generation waits for every decode. A :class:`DecodeStage` runs those jobs in
submission order on one worker thread instead (torch ops release the GIL, so decoding and the next
batched step overlap). One thread and one FIFO keep each stream's chunks in order, which its stateful
decoder needs, and put a stream's end behind its last chunk. Without a thread (``threaded=False``)
every job runs inline, at once, exactly as before the stage existed.

Torch threads: with two threads each using torch's full intra-op pool the cores are oversubscribed.
``torch.set_num_threads`` called on a thread sets that thread's OpenMP/MKL pool size, but it also
stores the process-wide default that every thread starting torch work later picks up; the stage
sets its worker's size and then restores that default, so no other thread is affected.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import torch

__all__ = ["DecodeStage"]

log = logging.getLogger(__name__)

Job = Callable[[], None]
OnError = Callable[[Exception], None]

_STOP = None


class DecodeStage:
    """Runs jobs in submission order: on one worker thread (``threaded``) or inline.

    Args:
        threaded: run jobs on a worker thread; False runs each job inside :meth:`run`.
        torch_threads: intra-op threads for the worker's torch ops (0 = torch's default).
        name: the worker thread's name.
    """

    def __init__(self, threaded: bool, torch_threads: int = 0, name: str = "voxcast-decode") -> None:
        self.threaded = threaded
        self._jobs: queue.SimpleQueue[tuple[Job, OnError] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if threaded:
            self._start(torch_threads, name)

    def _start(self, torch_threads: int, name: str) -> None:
        default = torch.get_num_threads()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._work, args=(torch_threads, ready), name=name, daemon=True
        )
        self._thread.start()
        ready.wait()
        if torch_threads > 0:
            torch.set_num_threads(default)  # the process-wide default again (see module docstring)

    @property
    def alive(self) -> bool:
        """False once a threaded stage's worker has ended."""
        return self._thread is None or self._thread.is_alive()

    def run(self, job: Job, on_error: OnError) -> None:
        """Run ``job`` now (inline: its errors propagate) or after every job submitted before it.

        On the worker an exception from ``job`` is logged and handed to ``on_error``; the stage
        keeps running the other jobs.
        """
        if self._thread is None:
            job()
        else:
            self._jobs.put((job, on_error))

    def stop(self) -> None:
        """Let the worker finish the jobs already submitted, then end (no-op inline)."""
        if self._thread is not None:
            self._jobs.put(_STOP)

    def join(self, timeout: float | None = None) -> None:
        """Stop and wait for the worker to end."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _work(self, torch_threads: int, ready: threading.Event) -> None:
        if torch_threads > 0:
            torch.get_num_threads()  # initialise this thread's pool first, or it re-reads the default
            torch.set_num_threads(torch_threads)
        ready.set()
        with torch.inference_mode():
            while (item := self._jobs.get()) is not _STOP:
                job, on_error = item
                try:
                    job()
                except Exception as e:
                    log.exception("decode job failed")
                    on_error(e)
