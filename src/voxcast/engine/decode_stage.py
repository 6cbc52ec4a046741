"""The decode stage: audio decoding on its own thread, overlapped with generating the next frames.

The scheduler thread generates a frame for every active stream per round; turning a chunk of codes
into audio (the stateful streaming codec decoder) costs tens of ms per frame on a CPU. Done inline,
every stream's generation waits for every decode. A :class:`DecodeStage` runs those jobs in
submission order on one worker thread instead (torch ops release the GIL, so decoding and the next
batched step overlap). One thread and one FIFO keep each stream's chunks in order, which its stateful
decoder needs, and put a stream's end behind its last chunk. Without a thread (``threaded=False``)
every job runs inline, at once, exactly as before the stage existed.

Batches: a stage given a ``batch`` runner also takes batchable jobs (:meth:`DecodeStage.run_batched`,
one item each, keyed by their stream). The worker runs the batchable jobs queued right behind one
another as one batch (a key at most once: each stream's items stay in order, each in its own batch),
so chunks of several streams that wait for the decoder are decoded together (a model that
:class:`~voxcast.models.base.DecodesTogether`). Inline, batchable jobs are held until :meth:`flush`
(the scheduler calls it once a round) or the next other job, which runs after them.

Busy time: the worker marks each job's (or batch's) start and end on a
:class:`~voxcast.engine.pacing.BusyMeter` (:attr:`DecodeStage.busy`, on the stage's clock), which
admission control reads: a decode thread busy most of the time cannot take one more stream.

Torch threads: with two threads each using torch's full intra-op pool the cores are oversubscribed.
``torch.set_num_threads`` called on a thread sets that thread's OpenMP/MKL pool size, but it also
stores the process-wide default that every thread starting torch work later picks up; the stage
sets its worker's size and then restores that default, so no other thread is affected.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from voxcast.engine.pacing import BusyMeter

__all__ = ["DecodeStage"]

log = logging.getLogger(__name__)

Job = Callable[[], None]
OnError = Callable[[Exception], None]

_STOP = None


@dataclass(frozen=True)
class _Batched:
    """A batchable job: ``item`` for the stage's batch runner, ``key`` its stream."""

    key: object
    item: Any
    on_error: OnError


class DecodeStage:
    """Runs jobs in submission order: on one worker thread (``threaded``) or inline.

    Args:
        threaded: run jobs on a worker thread; False runs each job inside :meth:`run`.
        torch_threads: intra-op threads for the worker's torch ops (0 = torch's default).
        name: the worker thread's name.
        batch: runs the items of batchable jobs (:meth:`run_batched`) together, in submission order;
            it handles each item's errors itself (an exception it raises fails every item in it).
        clock: seconds, monotonic: what :attr:`busy` measures with.
    """

    def __init__(
        self,
        threaded: bool,
        torch_threads: int = 0,
        name: str = "voxcast-decode",
        batch: Callable[[list[Any]], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.threaded = threaded
        self._batch = batch
        self.clock = clock
        #: The worker's busy time (stays 0 inline: inline jobs run within the scheduler's rounds).
        self.busy = BusyMeter()
        self._jobs: queue.SimpleQueue[tuple[Job, OnError] | _Batched | None] = queue.SimpleQueue()
        self._held: list[_Batched] = []  # inline: batchable jobs until flush()
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
            self.flush()
            job()
        else:
            self._jobs.put((job, on_error))

    @property
    def batches(self) -> bool:
        """Whether the stage takes batchable jobs (it was given a batch runner)."""
        return self._batch is not None

    def run_batched(self, key: object, item: Any, on_error: OnError) -> None:
        """Queue ``item`` for the batch runner, in order with every other job (see the module
        docstring); ``on_error`` gets an exception the runner raises.

        Raises:
            RuntimeError: the stage has no batch runner.
        """
        if self._batch is None:
            raise RuntimeError("this decode stage has no batch runner")
        job = _Batched(key, item, on_error)
        if self._thread is not None:
            self._jobs.put(job)
            return
        if any(h.key is key for h in self._held):
            self.flush()
        self._held.append(job)

    def flush(self) -> None:
        """Inline: run the held batchable jobs now, as one batch (no-op threaded or with none)."""
        held, self._held = self._held, []
        if held:
            self._run_batch(held)

    def stop(self) -> None:
        """Let the worker finish the jobs already submitted, then end (inline: run the held jobs)."""
        if self._thread is not None:
            self._jobs.put(_STOP)
        else:
            self.flush()

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
        carry: list[tuple[Job, OnError] | _Batched | None] = []  # taken while gathering a batch
        with torch.inference_mode():
            while (item := carry.pop() if carry else self._jobs.get()) is not _STOP:
                self.busy.start(self.clock())
                try:
                    self._run_item(item, carry)
                finally:
                    self.busy.stop(self.clock())

    def _run_item(
        self, item: tuple[Job, OnError] | _Batched, carry: list[tuple[Job, OnError] | _Batched | None]
    ) -> None:
        if isinstance(item, _Batched):
            self._run_batch(self._gather(item, carry))
            return
        job, on_error = item
        try:
            job()
        except Exception as e:
            log.exception("decode job failed")
            on_error(e)

    def _gather(self, first: _Batched, carry: list[tuple[Job, OnError] | _Batched | None]) -> list[_Batched]:
        """``first`` and the batchable jobs queued right behind it, a key at most once; the first
        job that does not join (another kind, a key already in) goes to ``carry``, to run next."""
        batch = [first]
        while True:
            try:
                more = self._jobs.get_nowait()
            except queue.Empty:
                return batch
            if not isinstance(more, _Batched) or any(b.key is more.key for b in batch):
                carry.append(more)
                return batch
            batch.append(more)

    def _run_batch(self, batch: list[_Batched]) -> None:
        assert self._batch is not None
        try:
            self._batch([b.item for b in batch])
        except Exception as e:
            log.exception("decode batch failed (%d jobs)", len(batch))
            for b in batch:
                b.on_error(e)
