"""The local store's cap on rendered audio (``VOXCAST_STORAGE_MAX_RENDER_GB``): past it the oldest
renders go, with their sidecars; voices and libraries stay; what is left reads back intact."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from voxcast.storage import open_store
from voxcast.storage.base import BlobNotFound
from voxcast.storage.config import StorageConfig
from voxcast.storage.local import LocalBlobStore

KB = 1000


def _age(store: LocalBlobStore, key: str, mtime: float) -> None:
    os.utime(store.root / key, (mtime, mtime))


def test_the_oldest_renders_go_first_and_nothing_else(tmp_path: Path) -> None:
    written = LocalBlobStore(tmp_path / "s", fsync=False)  # no cap while the files are written
    written.put_bytes("voices/v1/m/vx_old.safetensors", b"v" * 4 * KB)  # older than every render
    written.put_bytes("libraries/ivr/mulaw8k/welcome.wav", b"l" * 4 * KB)
    renders = [f"renders/r{i}.wav" for i in range(8)] + [f"audio/v1/ab/k{i}" for i in range(8)]
    for i, key in enumerate(renders):
        written.put_bytes(key, bytes([i]) * KB, content_type="audio/wav")
        _age(written, key, 1_000_000 + i)  # a second apart, oldest first
    _age(written, "voices/v1/m/vx_old.safetensors", 1)
    _age(written, "libraries/ivr/mulaw8k/welcome.wav", 1)
    store = LocalBlobStore(tmp_path / "s", fsync=False, max_render_bytes=10 * KB)
    assert store.retention is not None

    assert store.retention.prune() == (7, 7 * KB)  # 16 KB of renders -> 9 KB (90 % of the cap)
    gone, kept = renders[:7], renders[7:]
    for key in gone:
        assert not store.exists(key) and not (store.root / ".meta" / f"{key}.json").exists()
        with pytest.raises(BlobNotFound):
            store.get_bytes(key)
    for i, key in enumerate(kept, start=7):
        assert store.get_bytes(key) == bytes([i]) * KB and store.head(key).content_type == "audio/wav"  # type: ignore[union-attr]
    assert store.get_bytes("voices/v1/m/vx_old.safetensors") == b"v" * 4 * KB
    assert store.get_bytes("libraries/ivr/mulaw8k/welcome.wav") == b"l" * 4 * KB
    assert store.retention.prune() == (0, 0)  # within the cap: nothing to do


def test_writes_past_the_cap_prune_in_the_background(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "s", fsync=False, max_render_bytes=20 * KB)
    assert store.retention is not None
    for i in range(40):
        store.put_bytes(f"renders/r{i:02d}.wav", b"x" * KB)
        store.retention.wait(10)  # one prune at a time; waiting keeps the count exact
    left = sorted(p.name for p in (store.root / "renders").iterdir())
    assert sum((store.root / "renders" / n).stat().st_size for n in left) <= 20 * KB
    assert "r39.wav" in left and "r00.wav" not in left  # the newest stay


def test_the_cap_comes_from_the_environment_and_0_turns_it_off(tmp_path: Path) -> None:
    on = open_store(StorageConfig.from_env({"VOXCAST_STORAGE_DIR": str(tmp_path / "a")}))
    assert isinstance(on, LocalBlobStore) and on.retention is not None
    assert on.retention.max_bytes == 10 * 10**9  # 10 GB by default
    off = open_store(
        StorageConfig.from_env(
            {"VOXCAST_STORAGE_DIR": str(tmp_path / "b"), "VOXCAST_STORAGE_MAX_RENDER_GB": "0"}
        )
    )
    assert isinstance(off, LocalBlobStore) and off.retention is None
