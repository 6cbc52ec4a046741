"""AudioCache: canonical keys, create-once fills, streamed hits; against both backends."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.fixtures.s3 import MotoServer
from voxcast.cache import AudioCache
from voxcast.engine.request import parse_request
from voxcast.errors import StorageError
from voxcast.storage import BlobNotFound, BlobStore, open_store

MODEL = "Qwen3-TTS-12Hz-0.6B-CustomVoice@abc123"


def _req(**kw: Any) -> Any:
    return parse_request({"text": "Press one for sales.", "voice": "Vivian", "seed": 7, **kw})


def _key(**kw: Any) -> str:
    return AudioCache.key_for(_req(**kw), model_identity=MODEL)


def test_texts_spoken_the_same_share_a_key() -> None:
    """The key is taken on the normalised text, which is also what the engine speaks."""
    assert _req(text="  Cafe\u0301\t\n  au \u201clait\u201d\u200b ").text == 'Caf\u00e9 au "lait"'
    assert _key(text="Press \u201cone\u201d") == _key(text='Press  "one"') != _key(text="Press one")


def test_cacheable_needs_determinism_and_opt_in() -> None:
    assert AudioCache.cacheable(_req())
    assert AudioCache.cacheable(parse_request({"text": "x", "greedy": True}))
    assert not AudioCache.cacheable(parse_request({"text": "x"}))  # unseeded sampling
    assert not AudioCache.cacheable(_req(cache=False))


def test_key_is_canonical() -> None:
    base = _key()
    assert len(base) == 64
    # Same output -> same key: whitespace/NFC, streaming/chunking, request id, speaker case.
    for same in [
        {"text": "  Press one   for sales. "},
        {"stream": False},
        {"chunk_frames": 4, "first_chunk_frames": 2},
        {"request_id": "abc"},
        {"voice": "vivian"},
    ]:
        assert _key(**same) == base, same
    alias = parse_request({"input": "Press one for sales.", "voice": "Vivian", "seed": 7})
    assert AudioCache.key_for(alias, model_identity=MODEL) == base
    # Anything that changes the bytes -> a different key.
    different = [
        {"text": "Press two for sales."},
        {"voice": "Ryan"},
        {"seed": 8},
        {"temperature": 0.5},
        {"response_format": "mulaw"},
        {"sample_rate": 8000},
        {"language": "english"},
        {"instruct": "slowly"},
        {"non_streaming_text": True},
        {"max_frames": 100},
    ]
    keys = {_key(**kw) for kw in different}
    assert len(keys) == len(different) and base not in keys
    assert AudioCache.key_for(_req(), model_identity=MODEL + "x") != base
    assert AudioCache.key_for(_req(), model_identity=MODEL, extra={"loudness": -16}) != base


def test_greedy_ignores_sampling_knobs() -> None:
    a = AudioCache.key_for(
        parse_request({"text": "x", "greedy": True, "temperature": 0.3}), model_identity=MODEL
    )
    b = AudioCache.key_for(parse_request({"text": "x", "greedy": True, "seed": 5}), model_identity=MODEL)
    assert a == b


def test_ref_audio_needs_a_resolved_voice() -> None:
    req = parse_request({"text": "x", "ref_audio": "UklGRg==", "seed": 1})
    with pytest.raises(ValueError):
        AudioCache.key_for(req, model_identity=MODEL)
    assert len(AudioCache.key_for(req, model_identity=MODEL, voice="vx_" + "0" * 32)) == 64


def test_fill_lookup_open_stream(blob_store: BlobStore) -> None:
    cache = AudioCache(blob_store, chunk_bytes=1000)
    key, data = _key(), bytes(range(256)) * 40
    assert cache.lookup(key) is None and cache.open(key) is None
    meta = {
        "format": "wav",
        "sample_rate": 24000,
        "audio_s": 0.2,
        "timing": {"ttfa_ms": 91.5, "total_ms": 300.0},
    }
    assert cache.fill(key, data, meta) is True
    hit = cache.lookup(key)
    assert (
        hit is not None and hit.size == len(data) and hit.content_type == "audio/wav" and hit.metadata == meta
    )
    assert b"".join(cache.iter_chunks(key)) == data
    with cache.open(key) as stream:  # type: ignore[union-attr]
        assert stream.audio.metadata["timing"]["ttfa_ms"] == 91.5
        chunks = list(stream.iter_chunks())
    assert b"".join(chunks) == data and max(map(len, chunks)) <= 1000
    assert cache.fill(key, b"other bytes", meta) is False
    assert b"".join(cache.iter_chunks(key)) == data
    cache.delete(key)
    assert cache.lookup(key) is None
    with pytest.raises(BlobNotFound):
        cache.iter_chunks(key)


def test_oversized_metadata_is_trimmed(blob_store: BlobStore) -> None:
    cache = AudioCache(blob_store)
    key = _key()
    cache.fill(key, b"x", {"format": "pcm", "timing": {f"f{i}": i for i in range(400)}})
    hit = cache.lookup(key)
    assert hit is not None and hit.metadata == {"format": "pcm"} and hit.content_type == "audio/L16"


def test_foreign_object_under_a_cache_key(blob_store: BlobStore) -> None:
    cache = AudioCache(blob_store)
    key = _key()
    blob_store.put_bytes(cache.blob_key(key), b"not ours")
    with pytest.raises(StorageError, match="not a voxcast audio"):
        cache.lookup(key)
    with pytest.raises(StorageError):
        cache.open(key)
    blob_store.put_bytes(
        cache.blob_key(key), b"x", metadata={"voxcast-kind": "audio", "voxcast-audio": "{bad"}
    )
    with pytest.raises(StorageError, match="corrupt"):
        cache.lookup(key)


def test_eight_concurrent_fills_never_mix(blob_store: BlobStore) -> None:
    cache = AudioCache(blob_store)
    key = _key()
    bodies = [bytes([i]) * 150_000 for i in range(8)]
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def fill(i: int) -> None:
        barrier.wait()
        results.append(cache.fill(key, bodies[i], {"format": "pcm", "writer": i}))

    threads = [threading.Thread(target=fill, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    hit = cache.lookup(key)
    assert hit is not None
    assert b"".join(cache.iter_chunks(key)) == bodies[hit.metadata["writer"]]


def test_presigned_url_of_an_entry(s3_store: BlobStore) -> None:
    import urllib.request

    cache = AudioCache(s3_store)
    key = _key()
    cache.fill(key, b"RIFF....WAVE", {"format": "wav"})
    url = cache.presigned_url(key, 60)
    assert url is not None
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.read() == b"RIFF....WAVE" and resp.headers["Content-Type"] == "audio/wav"


def test_server_down_fill_and_lookup_raise_storage_error(s3_server: MotoServer, s3_bucket: str) -> None:
    cache = AudioCache(open_store(s3_server.storage_config(s3_bucket)))
    key = _key()
    s3_server.stop()
    try:
        with pytest.raises(StorageError):
            cache.fill(key, b"data", {"format": "wav"})
        with pytest.raises(StorageError):
            cache.lookup(key)
    finally:
        s3_server.start()
