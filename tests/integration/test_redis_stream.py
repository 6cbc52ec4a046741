"""The Redis Streams protocol against a real redis-server (tests/fixtures/redis.py)."""

from __future__ import annotations

import threading

import pytest
import redis

from tests.fixtures.polling import wait_until
from voxcast.engine.request import REQUEST_ID_RE
from voxcast.serving.rq.stream import (
    EntryType,
    StreamEntry,
    StreamPublisher,
    StreamSettings,
    StreamTimeout,
    follow,
    read_all,
    stream_key,
)

ALL_BYTES = bytes(range(256))


def _publish(pub: StreamPublisher, n: int) -> None:
    pub.start({"request_id": "r1", "format": "pcm", "attempt": 1})
    for i in range(n):
        pub.chunk(i, ALL_BYTES * (i + 1), format="pcm", sample_rate=24000, t_ms=80.0 * i, frames=1)
    pub.eos({"request_id": "r1", "audio_key": "audio/x", "timing": {"ttfa_ms": 12.5}})


def test_stream_keys_follow_the_request_id_rule_and_never_collide() -> None:
    assert stream_key("abc-1_2") == "voxcast:stream:abc-1_2"
    odd = ["", "a b", "x/y", "a" * 129, "a" * 128 + "b", "ü", "abc-1.2:3"]
    keys = [stream_key(i) for i in odd]
    assert len(set(keys)) == len(odd)
    assert all(REQUEST_ID_RE.match(k.removeprefix("voxcast:stream:")) for k in keys)


def test_late_reader_replays_everything_binary_safe(redis_client: redis.Redis) -> None:
    key = stream_key("r1")
    _publish(StreamPublisher(redis_client, key), 5)
    entries = list(follow(redis_client, key, block_ms=50, idle_timeout_s=2))
    assert [e.type for e in entries] == [EntryType.START] + [EntryType.CHUNK] * 5 + [EntryType.EOS]
    chunks = entries[1:-1]
    assert [c.seq for c in chunks] == list(range(5))
    assert all(c.audio == ALL_BYTES * (c.seq + 1) for c in chunks if c.seq is not None)
    assert chunks[2].t_ms == 160.0 and chunks[2].sample_rate == 24000 and chunks[2].format == "pcm"
    assert entries[-1].info["timing"]["ttfa_ms"] == 12.5 and entries[-1].terminal
    assert entries[0].info["attempt"] == 1
    assert [e.entry_id for e in read_all(redis_client, key)] == [e.entry_id for e in entries]


def test_live_reader_sees_entries_as_they_are_written(redis_client: redis.Redis) -> None:
    """The publisher writes each chunk only once the reader has the one before (a handshake, no
    timing threshold): a reader that waited for the end would leave the publisher stuck."""
    key = stream_key("live")
    got: list[StreamEntry] = []
    arrived = threading.Condition()

    def read() -> None:
        for e in follow(redis_client, key, block_ms=50):
            with arrived:
                got.append(e)
                arrived.notify_all()

    reader = threading.Thread(target=read)
    reader.start()
    pub = StreamPublisher(redis_client, key)
    pub.start({"request_id": "r1", "format": "pcm", "attempt": 1})  # the reader was waiting for the stream
    for i in range(4):
        with arrived:
            assert arrived.wait_for(lambda i=i: len(got) == i + 1, timeout=10), f"entry {i} not seen live"
        pub.chunk(i, ALL_BYTES * (i + 1), format="pcm", sample_rate=24000, t_ms=80.0 * i, frames=1)
    with arrived:
        assert arrived.wait_for(lambda: len(got) == 5, timeout=10), "last chunk not seen live"
    pub.eos({"request_id": "r1", "audio_key": "audio/x", "timing": {"ttfa_ms": 12.5}})
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert [e.type for e in got] == [EntryType.START] + [EntryType.CHUNK] * 4 + [EntryType.EOS]
    assert [e.seq for e in got[1:-1]] == [0, 1, 2, 3]


def test_maxlen_is_exact_and_ttls_follow_the_lifecycle(redis_client: redis.Redis) -> None:
    key = stream_key("bounded")
    pub = StreamPublisher(redis_client, key, StreamSettings(maxlen=5, ttl_s=30, live_ttl_s=300))
    pub.start({})
    for i in range(12):
        pub.chunk(i, b"x", format="pcm", sample_rate=8000, t_ms=0)
    assert redis_client.xlen(key) == 5
    assert 290 < redis_client.ttl(key) <= 300
    pub.eos({})
    assert 25 < redis_client.ttl(key) <= 30
    seqs = [e.seq for e in read_all(redis_client, key) if e.type is EntryType.CHUNK]
    assert seqs == [8, 9, 10, 11]  # + the eos: exactly the last 5 entries


def test_chunk_reports_cancellation_in_the_same_round_trip(redis_client: redis.Redis) -> None:
    pub = StreamPublisher(redis_client, stream_key("c"), cancel_key="voxcast:cancel:c")
    assert pub.chunk(0, b"a", format="pcm", sample_rate=24000, t_ms=0) is False
    redis_client.set("voxcast:cancel:c", b"1")
    assert pub.chunk(1, b"b", format="pcm", sample_rate=24000, t_ms=80) is True
    pub.cancelled()
    last = read_all(redis_client, pub.key)[-1]
    assert last.type is EntryType.CANCELLED and last.info["code"] == "cancelled"


def test_only_one_terminal_entry(redis_client: redis.Redis) -> None:
    pub = StreamPublisher(redis_client, stream_key("e"))
    pub.error({"code": "invalid_request", "message": "text: empty", "field": "text"})
    pub.eos({})
    entries = read_all(redis_client, pub.key)
    assert [e.type for e in entries] == [EntryType.ERROR]
    assert entries[0].info["field"] == "text"


def test_reader_times_out_on_a_silent_stream(redis_client: redis.Redis) -> None:
    raised: list[StreamTimeout] = []

    def read() -> None:
        try:
            list(follow(redis_client, stream_key("nobody"), block_ms=50, idle_timeout_s=0.3))
        except StreamTimeout as e:
            raised.append(e)

    reader = threading.Thread(target=read, daemon=True)  # one that never gives up is left behind
    reader.start()
    reader.join(30)  # a bound against hanging, not a measurement (the default idle timeout is 120 s)
    assert raised, "the reader did not give up on a silent stream"


def test_decode_rejects_foreign_entries() -> None:
    with pytest.raises(ValueError):
        StreamEntry.decode(b"1-0", {b"foo": b"bar"})


@pytest.mark.slow
def test_reader_resumes_after_redis_restart(redis_server, redis_client: redis.Redis) -> None:
    key = stream_key("restart")
    got: list[StreamEntry] = []

    def read() -> None:
        for e in follow(redis_client, key, block_ms=100, idle_timeout_s=20):
            got.append(e)

    reader = threading.Thread(target=read)
    pub = StreamPublisher(redis_client, key)
    pub.start({})
    pub.chunk(0, b"a", format="pcm", sample_rate=24000, t_ms=0)
    reader.start()
    wait_until(lambda: len(got) == 2, what="the reader's first two entries")
    redis_server.restart()  # no persistence: the stream is gone, the reader keeps its last id
    pub.chunk(1, b"b", format="pcm", sample_rate=24000, t_ms=80)
    pub.eos({"ok": True})
    reader.join(timeout=20)
    assert not reader.is_alive()
    assert [e.type for e in got] == [EntryType.START, EntryType.CHUNK, EntryType.CHUNK, EntryType.EOS]
    assert [e.seq for e in got if e.seq is not None] == [0, 1]
