"""Where a checkpoint lives: a local directory, or a hub id resolved to the local hub cache.

Offline-safe: with ``HF_HUB_OFFLINE=1`` nothing is downloaded and a missing checkpoint is a clear
:class:`~voxcast.errors.CheckpointError`.
"""

from __future__ import annotations

import os
from pathlib import Path

from voxcast.errors import CheckpointError

__all__ = ["not_a_checkpoint", "resolve_checkpoint"]


def not_a_checkpoint(name_or_path: str | Path) -> str | None:
    """Why ``name_or_path`` can name no checkpoint (a path that is missing or not a directory, and
    not a hub id's ``owner/name``), or None: checked before anything loads, so a mistyped path is bad
    input found in a second (the CLI's exit 2)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return None
    if path.exists():
        return f"{path} is not a directory"
    name = str(name_or_path)
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return f"{name}: no such directory (and not a hub id like 'Qwen/Qwen3-TTS-...')"
    return None


def resolve_checkpoint(name_or_path: str | Path, *, local_files_only: bool | None = None) -> Path:
    """A local directory for ``name_or_path`` (an existing directory, or a hub id to download).

    Args:
        name_or_path: a directory, or ``owner/name`` on the Hugging Face hub.
        local_files_only: only use the local hub cache; default: true when ``HF_HUB_OFFLINE=1``.

    Raises:
        CheckpointError: not a directory and not found on the hub (or in its cache when offline).
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    wrong = not_a_checkpoint(name_or_path)
    if wrong is not None:
        raise CheckpointError(wrong)
    name = str(name_or_path)
    if local_files_only is None:
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=local_files_only))
    except Exception as e:  # the hub raises many types (offline, not found, auth, network)
        where = "the local hub cache (offline)" if local_files_only else "the hub"
        raise CheckpointError(f"{name}: cannot get it from {where}: {e}") from e
