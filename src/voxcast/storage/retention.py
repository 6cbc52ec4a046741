"""A size cap on the local store's rendered audio: the oldest renders go first.

A server on the embedded local store keeps every complete render (``renders/``, for its
``audio_key``) and every cached one (``audio/``); nothing else removes them, so a long-running
server fills its disk. With a cap (``VOXCAST_STORAGE_MAX_RENDER_GB``), once the bytes written under
those prefixes since the last look pass a twentieth of the cap, a background thread sums their
files and deletes the least recently modified (with their sidecars) until they take at most 90 %
of it. Voices (``voices/``) and prompt libraries (``libraries/``) are never touched. A reader that
still has a deleted file open reads it to its end; a later lookup is a miss (the cache renders
again). On S3 a bucket lifecycle rule does this job (docs/storage.md).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

__all__ = ["PRUNED_PREFIXES", "RenderRetention"]

log = logging.getLogger(__name__)

PRUNED_PREFIXES = ("renders/", "audio/")
"""Keys whose objects the cap may delete: rendered audio, which can always be rendered again."""

_KEEP = 0.9
"""A prune stops once the renders take at most this share of the cap (not just under it)."""


class RenderRetention:
    """Keeps the files under ``root/<prefix>`` for :data:`PRUNED_PREFIXES` within ``max_bytes``.

    Args:
        root: the local store's directory.
        meta_root: its sidecar directory (``<meta_root>/<key>.json`` is deleted with each file).
        max_bytes: the cap (> 0).
    """

    def __init__(self, root: Path, meta_root: Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root, self.meta_root, self.max_bytes = root, meta_root, max_bytes
        self._lock = threading.Lock()
        self._written = max_bytes  # the first write looks (files from earlier runs count too)
        self._thread: threading.Thread | None = None

    def applies(self, key: str) -> bool:
        return key.startswith(PRUNED_PREFIXES)

    def wrote(self, size: int) -> None:
        """``size`` bytes were stored under a pruned prefix: look in the background when due."""
        with self._lock:
            self._written += size
            if self._written < self.max_bytes // 20 or (self._thread is not None and self._thread.is_alive()):
                return
            self._written = 0
            self._thread = threading.Thread(target=self._prune_logged, name="voxcast-retention", daemon=True)
            self._thread.start()

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the prune under way (if any) has ended."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _prune_logged(self) -> None:
        try:
            removed, freed = self.prune()
        except Exception:  # a failed prune must not end the process; the next write tries again
            log.exception("pruning rendered audio failed")
            return
        if removed:
            log.info(
                "store: removed the %d oldest renders (%.1f MB) to stay under %.1f MB",
                removed, freed / 1e6, self.max_bytes / 1e6,
            )  # fmt: skip

    def prune(self) -> tuple[int, int]:
        """Delete the oldest renders until they take at most 90 % of the cap (nothing while they
        are within it); returns ``(files removed, bytes freed)``."""
        files: list[tuple[float, int, str]] = []
        for prefix in PRUNED_PREFIXES:
            top = self.root / prefix.rstrip("/")
            for folder, _, names in os.walk(top):
                for name in names:
                    path = os.path.join(folder, name)
                    try:
                        st = os.stat(path)
                    except FileNotFoundError:  # deleted meanwhile
                        continue
                    files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        if total <= self.max_bytes:
            return 0, 0
        files.sort()
        removed = freed = 0
        for _, size, path in files:
            if total - freed <= self.max_bytes * _KEEP:
                break
            key = os.path.relpath(path, self.root).replace(os.sep, "/")
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            (self.meta_root / f"{key}.json").unlink(missing_ok=True)
            removed += 1
            freed += size
        return removed, freed
