"""Failure paths: missing bucket, server stopped mid-run (then restarted), corrupt local objects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.s3 import MotoServer
from voxcast.errors import StorageError
from voxcast.storage import LocalBlobStore, open_store
from voxcast.storage.s3 import S3BlobStore


def test_missing_bucket_is_a_clear_error(s3_client: Any) -> None:
    with pytest.raises(StorageError, match="does not exist"):
        S3BlobStore(s3_client, "no-such-bucket-xyz")
    store = S3BlobStore(s3_client, "no-such-bucket-xyz", check_bucket=False)
    with pytest.raises(StorageError, match="does not exist"):
        store.put_bytes("k", b"x")
    with pytest.raises(StorageError, match="does not exist"):
        store.get_bytes("k")


def test_open_store_with_bucket(s3_server: MotoServer, s3_bucket: str) -> None:
    store = open_store(s3_server.storage_config(s3_bucket, VOXCAST_S3_PREFIX="pre"))
    assert isinstance(store, S3BlobStore)
    assert store.put_bytes("k", b"v", if_none_match=True)
    assert store.get_bytes("k") == b"v"
    with pytest.raises(StorageError, match="does not exist"):
        open_store(s3_server.storage_config("missing-bucket-abc"))


def test_prefix_isolates_stores(s3_client: Any, s3_bucket: str) -> None:
    a = S3BlobStore(s3_client, s3_bucket, prefix="a")
    b = S3BlobStore(s3_client, s3_bucket, prefix="b/c")
    a.put_bytes("k", b"1")
    assert b.head("k") is None and list(b.list_keys()) == [] and list(a.list_keys()) == ["k"]
    assert s3_client.get_object(Bucket=s3_bucket, Key="a/k")["Body"].read() == b"1"


def test_server_stopped_mid_run_then_restarted(s3_server: MotoServer, s3_bucket: str) -> None:
    config = s3_server.storage_config(s3_bucket)
    store = open_store(config)
    store.put_bytes("k", b"before")
    assert isinstance(store, S3BlobStore)
    sent: list[str] = []  # each HTTP attempt, retries included
    store.client.meta.events.register("before-send", lambda request, **_: sent.append(request.method))
    s3_server.stop()
    try:
        for op in (
            lambda: store.put_bytes("k2", b"x", if_none_match=True),
            lambda: store.get_bytes("k"),
            lambda: store.head("k"),
            lambda: list(store.list_keys()),
            lambda: store.delete("k"),
        ):
            sent.clear()
            with pytest.raises(StorageError) as ei:
                op()
            assert ei.value.__cause__ is not None  # raise ... from e
            # bounded retries: it gave up after VOXCAST_S3_MAX_ATTEMPTS attempts in all, the first
            # included (botocore's retries "max_attempts" would count retries only: one more)
            assert len(sent) == config.max_attempts, sent
    finally:
        s3_server.start()
    # A restarted moto server has empty state: the same client works again once the bucket exists.
    with pytest.raises(StorageError, match="does not exist"):
        store.put_bytes("k", b"after")
    store.client.create_bucket(Bucket=s3_bucket)
    assert store.put_bytes("k", b"after", if_none_match=True)
    assert store.get_bytes("k") == b"after"


def test_server_stopped_during_streaming_read(s3_server: MotoServer, s3_bucket: str) -> None:
    store = open_store(s3_server.storage_config(s3_bucket))
    data = bytes(range(256)) * 40_000  # ~10 MB: larger than the socket buffers
    store.put_bytes("big", data)
    it = store.iter_chunks("big", 4096)
    got = next(it)
    s3_server.stop()
    try:
        with pytest.raises(StorageError):
            for chunk in it:
                got += chunk
        assert len(got) < len(data)
    finally:
        s3_server.start()


def test_corrupt_local_object(local_store: LocalBlobStore) -> None:
    local_store.put_bytes("k", b"hello", metadata={"a": "b"})
    path = local_store.root / "k"
    path.write_bytes(b"garbage that is not what was stored")  # the sidecar's size no longer matches
    with pytest.raises(StorageError, match="does not match its metadata"):
        local_store.get_bytes("k")
    with pytest.raises(StorageError):
        local_store.head("k")
    (local_store.root / ".meta" / "k.json").write_bytes(b"{not json")
    with pytest.raises(StorageError, match="corrupt metadata"):
        local_store.get_bytes("k")


def test_local_store_leaves_no_temp_files(local_store: LocalBlobStore) -> None:
    for i in range(5):
        local_store.put_bytes("k", b"x" * i, if_none_match=bool(i % 2))
    assert list((local_store.root / ".tmp").iterdir()) == []
    assert list(local_store.list_keys()) == ["k"]


def test_local_symlink_escape_rejected(local_store: LocalBlobStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (local_store.root / "link").symlink_to(outside)
    with pytest.raises(StorageError, match="outside"):
        local_store.put_bytes("link/x", b"x")
    assert not (outside / "x").exists()
