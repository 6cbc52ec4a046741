"""VoiceRegistry against both backends, with a small deterministic prompt type (safetensors + JSON)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from tests.fixtures.s3 import MotoServer
from voxcast.errors import InvalidRequest, StorageError, VoiceNotFound
from voxcast.storage import BlobStore, open_store
from voxcast.storage.keys import voice_keys
from voxcast.voices import VoiceRegistry


@dataclass
class FakePrompt:
    """Stands in for the model's VoicePrompt: an x-vector derived from the audio, plus the mode."""

    x_vector: np.ndarray
    ref_text: str | None
    x_vector_only: bool

    def to_bytes(self) -> bytes:
        meta = {"ref_text": json.dumps(self.ref_text), "x_vector_only": str(self.x_vector_only)}
        return st_save({"x_vector": self.x_vector}, metadata=meta)

    @classmethod
    def from_bytes(cls, data: bytes) -> FakePrompt:
        tensors = st_load(data)
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8 : 8 + header_len])["__metadata__"]
        return cls(tensors["x_vector"], json.loads(meta["ref_text"]), meta["x_vector_only"] == "True")


class CountingBuilder:
    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, audio: bytes, ref_text: str | None, x_vector_only: bool) -> FakePrompt:
        with self._lock:
            self.calls += 1
        if audio.startswith(b"BAD"):
            raise InvalidRequest("not audio", field="ref_audio")
        seed = int.from_bytes(hashlib.sha256(audio).digest()[:4], "little")
        vec = np.random.default_rng(seed).standard_normal(1024).astype(np.float32)
        return FakePrompt(vec, ref_text, x_vector_only)


def _registry(
    store: BlobStore, builder: CountingBuilder, model: str = "qwen3-tts-base-tiny", **kw: object
) -> VoiceRegistry[FakePrompt]:
    return VoiceRegistry(store, model, builder, FakePrompt.from_bytes, **kw)  # type: ignore[arg-type]


AUDIO = b"RIFF" + bytes(range(256)) * 100


def test_register_is_idempotent_and_shared_between_workers(blob_store: BlobStore) -> None:
    builder = CountingBuilder()
    reg = _registry(blob_store, builder)
    vid = reg.register(AUDIO, "  hello there ")
    assert vid.startswith("vx_") and reg.register(AUDIO, "hello there") == vid
    assert builder.calls == 1
    prompt, hit = reg.lookup(vid)
    assert hit and prompt.ref_text == "hello there"

    other_builder = CountingBuilder()  # another worker: same store, empty memory
    other = _registry(blob_store, other_builder)
    assert other.register(AUDIO, "hello there") == vid and other_builder.calls == 0
    assert other.lookup(vid)[1] is True  # register loaded it into memory
    third = _registry(blob_store, CountingBuilder())
    loaded, hit = third.lookup(vid)
    assert not hit and np.array_equal(loaded.x_vector, prompt.x_vector)
    assert third.lookup(vid)[1] is True


def test_modes_and_texts_give_distinct_ids(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder())
    ids = {reg.register(AUDIO, "a"), reg.register(AUDIO, "b"), reg.register(AUDIO, None, True)}
    assert len(ids) == 3
    assert reg.register(AUDIO, "ignored in this mode", True) in ids


def test_unknown_and_malformed_ids(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder())
    for bad in ["vx_" + "0" * 32, "../../etc/passwd", "nobody", ""]:
        with pytest.raises(VoiceNotFound) as ei:
            reg.get(bad)
        assert ei.value.field == "voice"


def test_other_models_voices_are_invisible(blob_store: BlobStore) -> None:
    vid = _registry(blob_store, CountingBuilder(), "model-a").register(AUDIO, "x")
    other = _registry(blob_store, CountingBuilder(), "model-b")
    with pytest.raises(VoiceNotFound):
        other.get(vid)
    assert [v.voice_id for v in other.list_voices()] == []


def test_corrupt_object_is_a_clear_error(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder())
    vid = reg.register(AUDIO, "x")
    key, _ = voice_keys(reg.model_identity, vid)
    tags = dict(blob_store.head(key).metadata)  # type: ignore[union-attr]
    blob_store.put_bytes(key, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json", metadata=tags)
    fresh = _registry(blob_store, CountingBuilder())
    with pytest.raises(StorageError, match="corrupt"):
        fresh.get(vid)


def test_foreign_object_is_a_clear_error(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder())
    vid = reg.register(AUDIO, "x")
    key, _ = voice_keys(reg.model_identity, vid)
    blob_store.put_bytes(key, b"someone else's file")  # no voxcast tags
    with pytest.raises(StorageError, match="not a voice prompt"):
        _registry(blob_store, CountingBuilder()).get(vid)


def test_a_voice_copied_under_another_id_is_refused(blob_store: BlobStore) -> None:
    """Before: a prompt + sidecar copied under another ``vx_`` id was served as that voice."""
    reg = _registry(blob_store, CountingBuilder())
    vid = reg.register(AUDIO, "x")
    other = "vx_" + "0" * 32
    for src, dst in zip(
        voice_keys(reg.model_identity, vid), voice_keys(reg.model_identity, other), strict=True
    ):
        blob_store.put_bytes(dst, blob_store.get_bytes(src), metadata=dict(blob_store.head(src).metadata))  # type: ignore[union-attr]
    fresh = _registry(blob_store, CountingBuilder())
    assert fresh.get(vid).ref_text == "x"
    with pytest.raises(StorageError, match="belongs to"):
        fresh.get(other)


def test_an_untagged_prompt_is_checked_against_its_sidecar(blob_store: BlobStore) -> None:
    """Prompts stored before they named their voice: the id is recomputed from the sidecar's recipe."""
    reg = _registry(blob_store, CountingBuilder())
    vid = reg.register(AUDIO, "x")
    prompt_key, meta_key = voice_keys(reg.model_identity, vid)
    tags = {
        k: v
        for k, v in blob_store.head(prompt_key).metadata.items()
        if k not in ("voxcast-voice", "voxcast-sha256")
    }  # type: ignore[union-attr]
    data = blob_store.get_bytes(prompt_key)
    blob_store.put_bytes(prompt_key, data, metadata=tags)
    assert _registry(blob_store, CountingBuilder()).get(vid).ref_text == "x"  # the recipe gives this id
    other = "vx_" + "1" * 32
    o_prompt, o_meta = voice_keys(reg.model_identity, other)
    blob_store.put_bytes(o_prompt, data, metadata=tags)
    blob_store.put_bytes(
        o_meta, blob_store.get_bytes(meta_key), metadata=dict(blob_store.head(meta_key).metadata)
    )  # type: ignore[union-attr]
    with pytest.raises(StorageError, match="does not give that id"):
        _registry(blob_store, CountingBuilder()).get(other)


def test_builder_rejection_stores_nothing(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder())
    with pytest.raises(InvalidRequest):
        reg.register(b"BAD audio", "x")
    with pytest.raises(InvalidRequest):
        reg.register(b"", "x")
    assert list(blob_store.list_keys()) == []


def test_list_info_delete_and_builtins(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder(), speakers=["Vivian", "Ryan"])
    vid = reg.register(AUDIO, "hello")
    listed = reg.list_voices()
    assert [(v.voice_id, v.builtin) for v in listed] == [("Ryan", True), ("Vivian", True), (vid, False)]
    info = reg.info(vid)
    assert info.ref_text == "hello" and info.x_vector_only is False and info.nbytes and info.created_at
    assert reg.is_builtin("vivian") and reg.builtin_name("VIVIAN") == "Vivian" and reg.info("ryan").builtin
    with pytest.raises(InvalidRequest):
        reg.get("Vivian")
    with pytest.raises(InvalidRequest):
        reg.delete("Vivian")
    assert reg.delete(vid) is True and reg.delete(vid) is False
    with pytest.raises(VoiceNotFound):
        reg.get(vid)
    with pytest.raises(VoiceNotFound):
        reg.info(vid)
    assert [v.voice_id for v in reg.list_voices()] == ["Ryan", "Vivian"]


def test_a_voice_deleted_through_another_worker_stops_within_recheck_s(blob_store: BlobStore) -> None:
    """Withdrawn consent: a voice deleted through one worker stops speaking on another that holds
    it in memory once ``recheck_s`` has passed (one existence check in the store; none before)."""
    now = [0.0]
    a = _registry(blob_store, CountingBuilder())
    b = _registry(blob_store, CountingBuilder(), recheck_s=30.0, clock=lambda: now[0])
    vid = a.register(AUDIO, "hello")
    assert b.lookup(vid)[1] is False and b.lookup(vid)[1] is True  # loaded, then from memory
    assert a.delete(vid)
    now[0] = 29.0
    assert b.lookup(vid)[1] is True  # still trusted (no store call within recheck_s)
    now[0] = 31.0
    with pytest.raises(VoiceNotFound) as err:
        b.lookup(vid)
    assert err.value.field == "voice" and "deleted" in err.value.message
    assert vid not in b._lru  # and not held any longer
    kept = a.register(AUDIO, "kept")
    assert b.lookup(kept)[1] is False
    now[0] = 100.0
    assert b.lookup(kept)[1] is True  # due for a check, found, trusted again
    always = _registry(blob_store, CountingBuilder(), recheck_s=0.0, clock=lambda: now[0])
    assert always.lookup(kept)[1] is False and always.lookup(kept)[1] is True
    assert a.delete(kept)
    with pytest.raises(VoiceNotFound):  # 0: checked on every use, no time needs to pass
        always.lookup(kept)


def test_lru_is_bounded_in_bytes(local_store: BlobStore) -> None:
    one = len(CountingBuilder()(AUDIO, None, True).to_bytes())
    reg = _registry(local_store, CountingBuilder(), max_cache_bytes=int(2.5 * one))
    ids = [reg.register(AUDIO + bytes([i]), None, True) for i in range(4)]
    assert reg.cached_bytes <= 2.5 * one
    assert reg.lookup(ids[0])[1] is False  # evicted, reloaded from the store
    assert reg.lookup(ids[3])[1] is True  # most recent survive: now ids[3], ids[0]
    assert reg.lookup(ids[2])[1] is False


def test_concurrent_registration_builds_one_object(blob_store: BlobStore) -> None:
    regs = [_registry(blob_store, CountingBuilder()) for _ in range(8)]
    out: list[str] = []
    barrier = threading.Barrier(8)

    def go(r: VoiceRegistry[FakePrompt]) -> None:
        barrier.wait()
        out.append(r.register(AUDIO, "same"))

    threads = [threading.Thread(target=go, args=(r,)) for r in regs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 8 and len(set(out)) == 1
    assert sorted(blob_store.list_keys())[0].endswith(".json")
    assert len(list(blob_store.list_keys())) == 2
    assert _registry(blob_store, CountingBuilder()).get(out[0]).ref_text == "same"


def test_store_down_during_register_keeps_voice_in_memory(s3_server: MotoServer, s3_bucket: str) -> None:
    store = open_store(s3_server.storage_config(s3_bucket))
    builder = CountingBuilder()
    reg = _registry(store, builder)
    s3_server.stop()
    try:
        with pytest.raises(StorageError):
            reg.register(AUDIO, "x")
    finally:
        s3_server.start()
    assert builder.calls == 1
    store.client.create_bucket(Bucket=s3_bucket)  # type: ignore[attr-defined]
    vid = reg.register(AUDIO, "x")  # retries the write, does not rebuild
    assert builder.calls == 1
    assert _registry(store, CountingBuilder()).get(vid).ref_text == "x"


def test_ensure_returns_prompt_and_reports_store_failure(s3_server: MotoServer, s3_bucket: str) -> None:
    store = open_store(s3_server.storage_config(s3_bucket))
    builder = CountingBuilder()
    reg = _registry(store, builder)
    s3_server.stop()
    try:
        r = reg.ensure(AUDIO, "x")
    finally:
        s3_server.start()
    assert r.built and not r.cache_hit and isinstance(r.storage_error, StorageError)
    assert reg.get(r.voice_id) is r.prompt  # usable in this process
    store.client.create_bucket(Bucket=s3_bucket)  # type: ignore[attr-defined]
    r2 = reg.ensure(AUDIO, "x")
    assert r2.storage_error is None and r2.cache_hit and not r2.built and builder.calls == 1
    r3 = _registry(store, CountingBuilder()).ensure(AUDIO, "x")
    assert not r3.built and not r3.cache_hit and r3.storage_error is None


def test_ensure_repairs_a_corrupt_prompt(blob_store: BlobStore) -> None:
    vid = _registry(blob_store, CountingBuilder()).register(AUDIO, "x")
    key, _ = voice_keys("qwen3-tts-base-tiny", vid)
    blob_store.put_bytes(key, b"junk")
    builder = CountingBuilder()
    r = _registry(blob_store, builder).ensure(AUDIO, "x")
    assert r.built and r.storage_error is None and builder.calls == 1
    assert _registry(blob_store, CountingBuilder()).get(vid).ref_text == "x"


def test_background_persist_returns_before_the_write_and_flush_stores_it(blob_store: BlobStore) -> None:
    builder = CountingBuilder()
    reg = _registry(blob_store, builder, persist_in_background=True)
    gate = threading.Event()
    reg._writer.submit(_holding(gate))  # type: ignore[union-attr]  # hold the writer
    r = reg.ensure(AUDIO, "x")
    assert r.built and r.storage_error is None and builder.calls == 1
    assert not blob_store.exists(voice_keys("qwen3-tts-base-tiny", r.voice_id)[0])  # not written yet
    again = reg.ensure(AUDIO, "x")  # its write is queued: served from memory, not queued twice
    assert again.cache_hit and again.prompt is r.prompt and reg._writer.pending == 2  # type: ignore[union-attr]
    gate.set()
    assert reg.flush(timeout=10)
    other = _registry(blob_store, CountingBuilder())  # another worker finds it in the store
    assert other.get(r.voice_id).ref_text == "x"
    assert len(list(blob_store.list_keys())) == 2
    assert reg.close(timeout=5)


def test_background_persist_failure_is_retried_by_the_next_ensure(
    s3_server: MotoServer, s3_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(s3_server.storage_config(s3_bucket))
    builder = CountingBuilder()
    reg = _registry(store, builder, persist_in_background=True)
    s3_server.stop()
    try:
        r = reg.ensure(AUDIO, "x")  # the lookup fails, the build goes on, the write is queued
        assert r.built and r.storage_error is None and reg.get(r.voice_id) is r.prompt
        assert reg.flush(timeout=60)
    finally:
        s3_server.start()
    assert "writing it to the store failed" in caplog.text
    store.client.create_bucket(Bucket=s3_bucket)  # type: ignore[attr-defined]
    r2 = reg.ensure(AUDIO, "x")  # still unwritten: queued again, not rebuilt
    assert r2.cache_hit and not r2.built and builder.calls == 1
    assert reg.flush(timeout=30)
    assert _registry(store, CountingBuilder()).get(r.voice_id).ref_text == "x"
    r3 = reg.ensure(AUDIO, "x")
    assert r3.cache_hit and reg._writer.pending == 0  # type: ignore[union-attr]  # nothing left to write
    reg.close(timeout=5)


def test_register_waits_for_the_write_even_with_background_persist(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder(), persist_in_background=True)
    gate = threading.Event()
    reg._writer.submit(_holding(gate))  # type: ignore[union-attr]
    vid = reg.ensure(AUDIO, "x").voice_id  # queued behind the held job
    threading.Timer(0.2, gate.set).start()
    assert reg.register(AUDIO, "x") == vid  # waits for the queued write instead of writing twice
    assert blob_store.exists(voice_keys("qwen3-tts-base-tiny", vid)[0])
    reg.close(timeout=5)


def test_delete_waits_for_a_queued_write(blob_store: BlobStore) -> None:
    reg = _registry(blob_store, CountingBuilder(), persist_in_background=True)
    gate = threading.Event()
    reg._writer.submit(_holding(gate))  # type: ignore[union-attr]
    vid = reg.ensure(AUDIO, "x").voice_id
    threading.Timer(0.2, gate.set).start()
    assert reg.delete(vid)  # the write landed first, then the delete removed it
    assert list(blob_store.list_keys()) == []
    with pytest.raises(VoiceNotFound):
        _registry(blob_store, CountingBuilder()).get(vid)
    reg.close(timeout=5)


def _holding(gate: threading.Event) -> Callable[[], None]:
    """A background-writer job that holds the writer until ``gate`` is set (a store that is slow)."""

    def hold() -> None:
        gate.wait(30)

    return hold
