"""Partial audio over Redis Streams: the wire protocol, a publisher and a reader.

One stream per request, key ``voxcast:stream:<request id>``. Every entry has a ``type`` field and a
``ts`` field (publisher wall clock, Unix seconds, for cross-process latency figures):

``start``      ``info``: JSON metadata (request id, job id, attempt, format, sample rate, content type).
               An attempt that restarts (RQ retry) writes a new ``start``; readers drop what they
               collected from the earlier attempt.

Every entry a job's attempt writes also carries ``run``: a random token of that attempt (its
publisher). :func:`follow` reads only the run of the latest ``start`` it has seen, so two publishers on
one stream (an attempt that a stalled worker resumes after its retry started, two processes with one
job id) never mix: entries of another run are dropped. Entries without ``run`` (written on a job's
behalf by another process, e.g. a dead worker's ``error``) belong to whichever run is current.
``chunk``      ``seq`` (0-based), ``format``, ``sample_rate``, ``t_ms`` (emit time from request start),
               ``frames``, ``audio`` (raw bytes in the response format; the first WAV chunk carries a
               streaming header, so the concatenation of all chunks is the file).
``eos``        terminal: ``info`` = JSON result (timing, audio key/URL, bytes, duration...).
``error``      terminal: ``info`` = JSON ``{"code", "message", "field"?}``.
``cancelled``  terminal: ``info`` = JSON ``{"code": "cancelled", "message"}``.

Lifetime: while a request streams, every write refreshes a *safety* TTL (``live_ttl_s``) so a stream
whose publisher died disappears on its own; the terminal entry sets the final TTL (``ttl_s``) so late
readers can replay the whole request for that long (EXPIRE survives later XADDs; XADD never sets it).

Bound: ``XADD ... MAXLEN = n`` (exact), not ``MAXLEN ~ n``. With ``~`` Redis trims whole radix-tree
nodes (~100 entries) whenever it likes, so the beginning of a stream (the ``start`` entry and the WAV
header) could vanish at an unpredictable length; exact trimming keeps precisely the last ``n`` entries,
is cheap at our sizes (a stream holds at most a few thousand entries and is only trimmed past ``n``),
and makes truncation deterministic. ``n`` is a safety limit sized far above a normal request; a reader
that sees a gap in ``seq`` (or no ``start``) knows the stream was truncated.

Binary-safe: use clients with ``decode_responses=False``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import redis

from voxcast.ids import request_id_for

if TYPE_CHECKING:
    from voxcast.service import EncodedChunk

__all__ = [
    "DEFAULT_LIVE_TTL_S",
    "DEFAULT_MAXLEN",
    "DEFAULT_TTL_S",
    "EntryType",
    "StreamEntry",
    "StreamPublisher",
    "StreamSettings",
    "StreamTimeout",
    "follow",
    "new_run",
    "read_all",
    "stream_key",
]

log = logging.getLogger(__name__)

STREAM_KEY_PREFIX = "voxcast:stream:"

DEFAULT_MAXLEN = 10_000
"""Entries kept per stream: 10k chunks is >13 min of audio even at one 80 ms frame per chunk."""

DEFAULT_TTL_S = 3600
"""Seconds a finished stream stays readable (late readers replay it)."""

DEFAULT_LIVE_TTL_S = 600
"""Safety TTL refreshed on every write while streaming: a dead publisher's stream expires after this."""


class EntryType(StrEnum):
    """The ``type`` field of a stream entry."""

    START = "start"
    CHUNK = "chunk"
    EOS = "eos"
    ERROR = "error"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (EntryType.EOS, EntryType.ERROR, EntryType.CANCELLED)


class StreamTimeout(TimeoutError):
    """A reader waited longer than its idle timeout without a new entry."""


@dataclass(frozen=True)
class StreamSettings:
    """Bounds of one stream (see the module docstring for the choices).

    Attributes:
        maxlen: exact ``MAXLEN`` of every XADD.
        ttl_s: TTL set by the terminal entry.
        live_ttl_s: safety TTL refreshed by every write before the terminal entry.
    """

    maxlen: int = DEFAULT_MAXLEN
    ttl_s: int = DEFAULT_TTL_S
    live_ttl_s: int = DEFAULT_LIVE_TTL_S

    def __post_init__(self) -> None:
        if self.maxlen < 2 or self.ttl_s < 1 or self.live_ttl_s < 1:
            raise ValueError("maxlen must be >= 2 and TTLs >= 1 s")


def stream_key(job_id: str) -> str:
    """The Redis key of a job's stream: ``voxcast:stream:<request id>``, where the request id is
    :func:`~voxcast.engine.request.request_id_for` the job id (the id itself when it follows the
    request-id rule; distinct job ids never share a stream)."""
    return STREAM_KEY_PREFIX + request_id_for(job_id)


def new_run() -> str:
    """A fresh run token (one per attempt's publisher)."""
    return uuid.uuid4().hex[:16]


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else value


@dataclass(frozen=True)
class StreamEntry:
    """One decoded stream entry (fields not used by its ``type`` are None/empty).

    Attributes:
        entry_id: the Redis stream id (``"<ms>-<n>"``).
        type: what the entry is.
        ts: publisher wall clock (Unix s) at write.
        received_ts: reader wall clock (Unix s) when the entry was read.
        info: decoded JSON of start/eos/error/cancelled entries.
        run: the token of the attempt that wrote it (None: written on the job's behalf).
    """

    entry_id: str
    type: EntryType
    ts: float = 0.0
    received_ts: float = 0.0
    seq: int | None = None
    format: str | None = None
    sample_rate: int | None = None
    t_ms: float | None = None
    frames: int | None = None
    audio: bytes = b""
    info: dict[str, Any] = field(default_factory=dict)
    run: str | None = None

    @property
    def terminal(self) -> bool:
        return self.type.terminal

    @classmethod
    def decode(cls, entry_id: bytes | str, fields: Mapping[bytes | str, bytes | str]) -> StreamEntry:
        """Build an entry from raw XREAD/XRANGE fields.

        Raises:
            ValueError: the entry is not of this protocol.
        """
        raw = {_text(k): v for k, v in fields.items()}
        try:
            etype = EntryType(_text(raw.get("type")) or "")
        except ValueError as e:
            raise ValueError(f"stream entry {entry_id!r} has no valid type") from e
        info_raw = raw.get("info")
        audio = raw.get("audio", b"")
        return cls(
            entry_id=_text(entry_id) or "",
            type=etype,
            ts=float(raw.get("ts", 0) or 0),
            received_ts=time.time(),
            seq=int(raw["seq"]) if "seq" in raw else None,
            format=_text(raw.get("format")),
            sample_rate=int(raw["sample_rate"]) if "sample_rate" in raw else None,
            t_ms=float(raw["t_ms"]) if "t_ms" in raw else None,
            frames=int(raw["frames"]) if "frames" in raw else None,
            audio=audio.encode("latin-1") if isinstance(audio, str) else bytes(audio),
            info=json.loads(info_raw) if info_raw else {},
            run=_text(raw.get("run")) or None,
        )


class StreamPublisher:
    """Writes one request's stream. Not thread-safe; one publisher per request.

    Args:
        client: a Redis client (``decode_responses=False``).
        key: the stream key (:func:`stream_key`).
        settings: bounds and TTLs.
        cancel_key: if given, every :meth:`chunk` also checks (in the same round trip) whether this
            key exists and returns the answer, so cooperative cancellation costs no extra latency.
        run: the run token written with every entry (:func:`new_run`; one per attempt). None: the
            entries belong to the current run (a terminal entry written on a job's behalf).
    """

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        settings: StreamSettings | None = None,
        *,
        cancel_key: str | None = None,
        run: str | None = None,
    ) -> None:
        self.client = client
        self.key = key
        self.settings = settings or StreamSettings()
        self.cancel_key = cancel_key
        self.run = run
        self.ended: EntryType | None = None
        self.entries = 0

    def start(self, info: Mapping[str, Any], *, reset: bool = False) -> None:
        """Write the ``start`` entry with request metadata.

        Args:
            reset: delete what the stream held first (in the same transaction): the job id names a new
                job, not a retry of the one whose entries are there (a RunPod job id run again).
        """
        self._add({"type": EntryType.START.value, "info": json.dumps(dict(info))}, reset=reset)

    def chunk(
        self, seq: int, audio: bytes, *, format: str, sample_rate: int, t_ms: float, frames: int = 0
    ) -> bool:
        """Write one audio chunk.

        Returns:
            True if cancellation was requested (``cancel_key`` exists), else False.
        """
        fields: dict[Any, Any] = {
            "type": EntryType.CHUNK.value,
            "seq": str(seq),
            "format": format,
            "sample_rate": str(sample_rate),
            "t_ms": f"{t_ms:.3f}",
            "frames": str(frames),
            "audio": audio,
        }
        return self._add(fields)

    def publish_chunk(self, chunk: EncodedChunk) -> bool:
        """Write one of the service's encoded chunks (:meth:`chunk` with its fields).

        Returns:
            True if cancellation was requested (``cancel_key`` exists), else False.
        """
        return self.chunk(
            chunk.seq,
            chunk.data,
            format=str(chunk.format),
            sample_rate=chunk.sample_rate,
            t_ms=chunk.t_ms,
            frames=chunk.frames,
        )

    def eos(self, info: Mapping[str, Any]) -> None:
        """Terminal success entry (``info``: the JSON result, with timing and the audio key)."""
        self._end(EntryType.EOS, info)

    def error(self, info: Mapping[str, Any]) -> None:
        """Terminal failure entry (``info``: ``{"code", "message", "field"?}``)."""
        self._end(EntryType.ERROR, info)

    def cancelled(self, message: str = "cancelled by the caller", *, code: str = "cancelled") -> None:
        """Terminal cancellation entry (``code``: ``cancelled``, or ``shutdown`` for a job cut when
        its worker stopped)."""
        self._end(EntryType.CANCELLED, {"code": code, "message": message})

    def _end(self, etype: EntryType, info: Mapping[str, Any]) -> None:
        if self.ended is not None:
            log.warning("stream %s: already ended with %s; not writing %s", self.key, self.ended, etype)
            return
        self._add({"type": etype.value, "info": json.dumps(dict(info), default=str)}, terminal=True)
        self.ended = etype

    def _add(self, fields: dict[Any, Any], *, terminal: bool = False, reset: bool = False) -> bool:
        """XADD + EXPIRE (+ EXISTS cancel key) in one round trip (a MULTI transaction)."""
        fields["ts"] = f"{time.time():.6f}"
        if self.run is not None:
            fields["run"] = self.run
        pipe = self.client.pipeline(transaction=True)
        if reset:
            pipe.delete(self.key)
        pipe.xadd(self.key, fields, maxlen=self.settings.maxlen, approximate=False)
        ttl = self.settings.ttl_s if terminal else self.settings.live_ttl_s
        pipe.expire(self.key, ttl)
        if self.cancel_key is not None and not terminal:
            pipe.exists(self.cancel_key)
        replies = pipe.execute()[1 if reset else 0 :]
        self.entries += 1
        return bool(replies[2]) if len(replies) > 2 else False


def _xread_entries(reply: Any) -> list[tuple[Any, Any]]:
    """Entries of a one-stream XREAD reply, RESP2 list shape or RESP3 dict shape."""
    if not reply:
        return []
    if isinstance(reply, dict):
        for value in reply.values():
            return list(value[0] if value and isinstance(value[0], list) else value)
        return []
    return list(reply[0][1])


def follow(
    client: redis.Redis,
    key: str,
    *,
    from_id: str = "0-0",
    block_ms: int = 1000,
    idle_timeout_s: float | None = 120.0,
    count: int = 256,
) -> Iterator[StreamEntry]:
    """Read a stream from ``from_id`` as it grows, until (and including) its terminal entry.

    From ``"0-0"`` (the default) a late reader replays every entry first. The reader keeps the last id
    it saw, so a dropped connection (or a restarted Redis) resumes where it left off; transient
    connection errors are retried with the client's retry policy and then up to ``idle_timeout_s``.
    Only the run of the latest ``start`` is read (see the module docstring): entries of another run
    are dropped, so the terminal entry returned is the current run's.

    Args:
        client: Redis client (``decode_responses=False``).
        key: stream key.
        from_id: exclusive start id.
        block_ms: XREAD BLOCK per call.
        idle_timeout_s: raise :class:`StreamTimeout` after this long without a new entry (a stream that
            does not exist yet counts as idle); None waits forever.
        count: max entries per XREAD.

    Raises:
        StreamTimeout: nothing new within ``idle_timeout_s``.
    """
    last = from_id
    idle_since = time.monotonic()
    run: str | None = None
    while True:
        try:
            reply = client.xread({key: last}, count=count, block=block_ms)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            log.warning("stream %s: read failed (%s); retrying from %s", key, e, last)
            time.sleep(min(1.0, block_ms / 1000))
            reply = None
        entries = _xread_entries(reply)
        if not entries:
            if idle_timeout_s is not None and time.monotonic() - idle_since > idle_timeout_s:
                raise StreamTimeout(f"no entry on {key} for {idle_timeout_s:.0f} s (after id {last})")
            continue
        idle_since = time.monotonic()
        for entry_id, fields in entries:
            entry = StreamEntry.decode(entry_id, fields)
            last = entry.entry_id
            if entry.type is EntryType.START or run is None:
                run = entry.run
            elif entry.run is not None and entry.run != run:
                log.info("stream %s: dropped a %s entry of another run (%s)", key, entry.type, entry.run)
                continue
            yield entry
            if entry.terminal:
                return


def read_all(client: redis.Redis, key: str) -> list[StreamEntry]:
    """Every entry currently in the stream (non-blocking XRANGE), oldest first."""
    raw: Any = client.xrange(key, "-", "+")
    return [StreamEntry.decode(i, f) for i, f in raw or []]
