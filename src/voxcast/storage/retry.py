"""Store calls retried with exponential backoff over a bounded window, for work that may wait.

A request must never wait for the store (:mod:`voxcast.storage.guard` gives its calls deadlines).
Work that has nothing to hand back until it is stored, a prompt library's files and manifest, would
rather wait out an outage: S3's own retries (``VOXCAST_S3_MAX_ATTEMPTS``) are spent within seconds,
and one failed put would fail a whole library. :func:`retry_call` tries a call again after 0.5 s,
1 s, 2 s, ... (at most 8 s apart, jittered) until it succeeds or ``window_s`` has passed since its
first failure; then the last error is raised. :class:`RetryingStore` is a store whose every call
does that.

Every :class:`~voxcast.errors.StorageError` is retried but :class:`~voxcast.storage.base.BlobNotFound`
(a missing key is an answer, not an outage); a fault that lasts (a missing bucket, a refused
credential) therefore fails after the window instead of at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from voxcast.errors import StorageError
from voxcast.storage.base import BlobInfo, BlobNotFound, BlobStore, BlobStream

__all__ = ["DEFAULT_RETRY_WINDOW_S", "RetryPolicy", "RetryingStore", "StoreGaveUp", "retry_call"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_RETRY_WINDOW_S = 60.0
"""How long a store call that may wait is retried after its first failure (an outage of about a
minute is waited out; a longer one fails the work, which a re-run completes)."""


class StoreGaveUp(StorageError):
    """A store call failed every attempt for its whole retry window (the last error is its cause)."""

    def __init__(self, message: str, *, attempts: int, waited_s: float) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.waited_s = waited_s


@dataclass(frozen=True)
class RetryPolicy:
    """How a store call is retried.

    Attributes:
        window_s: seconds after the first failure during which it is tried again (0: never).
        first_s: the first pause; each next one doubles.
        cap_s: the longest pause.
    """

    window_s: float = DEFAULT_RETRY_WINDOW_S
    first_s: float = 0.5
    cap_s: float = 8.0

    def __post_init__(self) -> None:
        if self.window_s < 0 or self.first_s <= 0 or self.cap_s < self.first_s:
            raise ValueError("a retry window must be >= 0 and its pauses > 0")

    def pause_s(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """The pause after ``failures`` failures in a row: half fixed, half random (so that workers
        that failed together do not all come back in the same instant)."""
        full = min(self.cap_s, self.first_s * 2 ** (failures - 1))
        return full / 2 + rand() * full / 2


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def retry_call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    wait: Callable[[float], bool] = _sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``fn()``, tried again on a StorageError until ``policy.window_s`` has passed since its first
    failure (see the module docstring).

    Args:
        fn: the store call.
        policy: the window and the pauses.
        what: the call, for log lines (``"put libraries/acme/manifest.json"``).
        wait: pauses ``seconds``; True stops the retries (the last error is raised at once). Given
            to renew a job's lease or watch for a cancel while it waits.
        clock: monotonic seconds (tests pass a fake one).

    Raises:
        BlobNotFound: at once. StoreGaveUp: every attempt failed for the whole window (or ``wait``
        said stop); its ``__cause__`` is the last error.
    """
    first: float | None = None
    failures = 0
    while True:
        try:
            result = fn()
        except BlobNotFound:
            raise
        except StorageError as e:
            now = clock()
            first = now if first is None else first
            failures += 1
            left = policy.window_s - (now - first)
            if left <= 0 or wait(min(left, policy.pause_s(failures))):
                raise StoreGaveUp(
                    f"{e.message} (tried {failures} times over {now - first:.1f} s)",
                    attempts=failures,
                    waited_s=now - first,
                ) from e
            level = logging.WARNING if failures == 1 else logging.INFO
            log.log(level, "store: %s failed (%s); retrying for %.0f s more", what, e.message, left)
            continue
        if first is not None:
            log.warning("store: %s succeeded after %d failures in %.1f s", what, failures, clock() - first)
        return result


class RetryingStore(BlobStore):
    """``store`` with every call made through :func:`retry_call` (``wait``: as there).

    A streaming read is retried until it opens; a read of the whole body (:meth:`get_bytes`) is
    retried as one call, and so is a listing (:meth:`list_keys` reads every page first).
    """

    def __init__(
        self, store: BlobStore, policy: RetryPolicy, *, wait: Callable[[float], bool] = _sleep
    ) -> None:
        self.store, self.policy, self.wait = store, policy, wait
        self.remote = store.remote

    def _call(self, fn: Callable[[], T], what: str) -> T:
        return retry_call(fn, self.policy, what=what, wait=self.wait)

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        if_none_match: bool = False,
    ) -> bool:
        return self._call(
            lambda: self.store.put_bytes(
                key, data, content_type=content_type, metadata=metadata, if_none_match=if_none_match
            ),
            f"put {key}",
        )

    def open_stream(self, key: str) -> BlobStream:
        return self._call(lambda: self.store.open_stream(key), f"get {key}")

    def get_bytes(self, key: str) -> bytes:
        return self._call(lambda: self.store.get_bytes(key), f"get {key}")

    def head(self, key: str) -> BlobInfo | None:
        return self._call(lambda: self.store.head(key), f"head {key}")

    def delete(self, key: str) -> None:
        self._call(lambda: self.store.delete(key), f"delete {key}")

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        return iter(self._call(lambda: list(self.store.list_keys(prefix)), f"list {prefix}"))

    def presigned_url(self, key: str, expires_s: int = 3600) -> str | None:
        return self.store.presigned_url(key, expires_s)  # signed locally: nothing to retry
