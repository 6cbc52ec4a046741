"""The BlobStore contract, against the moto S3 server and the local directory."""

from __future__ import annotations

import threading
import urllib.request

import pytest

from voxcast.errors import InvalidRequest, StorageError
from voxcast.storage import BlobNotFound, BlobStore


def _body(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


def test_round_trip_with_metadata(blob_store: BlobStore) -> None:
    data = _body(10_000)
    assert blob_store.put_bytes("a/b/c.bin", data, content_type="audio/wav", metadata={"x-y": "1"})
    assert blob_store.get_bytes("a/b/c.bin") == data
    info = blob_store.head("a/b/c.bin")
    assert info is not None
    assert (info.key, info.size, info.content_type, dict(info.metadata)) == (
        "a/b/c.bin",
        10_000,
        "audio/wav",
        {"x-y": "1"},
    )
    assert blob_store.exists("a/b/c.bin") and not blob_store.exists("a/b/d.bin")


def test_empty_object(blob_store: BlobStore) -> None:
    blob_store.put_bytes("empty", b"")
    assert blob_store.get_bytes("empty") == b""
    assert list(blob_store.iter_chunks("empty")) == []


def test_overwrite_replaces_body_and_metadata(blob_store: BlobStore) -> None:
    blob_store.put_bytes("k", b"old", metadata={"v": "1"})
    assert blob_store.put_bytes("k", b"newer", metadata={"v": "2"})
    info = blob_store.head("k")
    assert blob_store.get_bytes("k") == b"newer" and info is not None and info.metadata == {"v": "2"}


def test_streaming_read_in_chunks(blob_store: BlobStore) -> None:
    data = _body(300_001)
    blob_store.put_bytes("big", data)
    chunks = list(blob_store.iter_chunks("big", 65_536))
    assert b"".join(chunks) == data
    assert all(0 < len(c) <= 65_536 for c in chunks) and len(chunks) >= 5
    with blob_store.open_stream("big") as stream:
        assert stream.info.size == len(data)
        first = next(iter(stream.iter_chunks(1000)))
        assert first == data[: len(first)]


def test_missing_key(blob_store: BlobStore) -> None:
    assert blob_store.head("nope") is None
    with pytest.raises(BlobNotFound):
        blob_store.get_bytes("nope")
    with pytest.raises(BlobNotFound):
        blob_store.iter_chunks("nope")  # raised at call, not at first next()
    blob_store.delete("nope")  # no error


def test_delete_and_list(blob_store: BlobStore) -> None:
    for k in ["p/a", "p/b/c", "q/a", "pa"]:
        blob_store.put_bytes(k, b"x")
    assert list(blob_store.list_keys("p/")) == ["p/a", "p/b/c"]
    assert list(blob_store.list_keys("p")) == ["p/a", "p/b/c", "pa"]
    assert list(blob_store.list_keys()) == ["p/a", "p/b/c", "pa", "q/a"]
    blob_store.delete("p/a")
    assert list(blob_store.list_keys("p/")) == ["p/b/c"]


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../../b", ".tmp/x", "a\\b"])
def test_unsafe_keys_rejected_by_every_operation(blob_store: BlobStore, key: str) -> None:
    with pytest.raises(InvalidRequest):
        blob_store.put_bytes(key, b"x")
    with pytest.raises(InvalidRequest):
        blob_store.get_bytes(key)
    with pytest.raises(InvalidRequest):
        blob_store.head(key)
    with pytest.raises(InvalidRequest):
        blob_store.delete(key)


def test_bad_metadata_rejected(blob_store: BlobStore) -> None:
    with pytest.raises(ValueError):
        blob_store.put_bytes("k", b"x", metadata={"Upper": "1"})
    with pytest.raises(ValueError):
        blob_store.put_bytes("k", b"x", metadata={"k": "caf\u00e9"})
    with pytest.raises(ValueError):
        blob_store.put_bytes("k", b"x", metadata={"k": "x" * 3000})


def test_create_once_second_put_loses(blob_store: BlobStore) -> None:
    assert blob_store.put_bytes("once", b"first", if_none_match=True) is True
    assert blob_store.put_bytes("once", b"second", if_none_match=True) is False
    assert blob_store.get_bytes("once") == b"first"


def test_create_once_eight_concurrent_writers(blob_store: BlobStore) -> None:
    """Exactly one of 8 racing writers wins and the object is entirely the winner's bytes."""
    bodies = [_body(200_000, seed=i) for i in range(8)]
    results: list[bool | None] = [None] * 8
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def write(i: int) -> None:
        try:
            barrier.wait()
            results[i] = blob_store.put_bytes("race", bodies[i], metadata={"w": str(i)}, if_none_match=True)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    winners = [i for i, r in enumerate(results) if r]
    assert len(winners) == 1 and results.count(False) == 7
    info = blob_store.head("race")
    assert info is not None and info.metadata == {"w": str(winners[0])}
    assert blob_store.get_bytes("race") == bodies[winners[0]]


def test_presigned_url(blob_store: BlobStore) -> None:
    blob_store.put_bytes("p/x.wav", b"RIFFdata", content_type="audio/wav")
    url = blob_store.presigned_url("p/x.wav", expires_s=60)
    if url is None:  # the local store has no URLs
        return
    assert url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.read() == b"RIFFdata"
        assert resp.headers["Content-Type"] == "audio/wav"


def test_errors_are_storage_errors(blob_store: BlobStore) -> None:
    assert issubclass(BlobNotFound, StorageError)
