"""Serving a request from the rendered-audio cache: the lookup, and the stored file streamed back.

A deterministic request (seeded or greedy) whose rendering is in the cache is streamed from storage
without touching the model (``timing.cache_hit``). The lookup runs under the store guard's deadline:
a store that fails, is too slow or is skipped counts as a miss, and generation starts without waiting
for it (:func:`open_cached`). A hit is sent as the bytes a live stream of the same audio would send
(:func:`from_cache`), so a client cannot tell a hit from a render but by its speed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from voxcast.audio.av_stream import unfinalize_flac
from voxcast.audio.formats import AudioFormat
from voxcast.audio.wav import WavCodec, data_span, stream_header
from voxcast.audio.word_times import file_word_times
from voxcast.cache import CachedStream
from voxcast.engine.request import SynthesisRequest
from voxcast.engine.timing import Timing
from voxcast.errors import StorageError
from voxcast.service.backends import Backends
from voxcast.service.stream import EncodedChunk, ServiceStream, word_times
from voxcast.storage.guard import StoreSkipped, StoreTimeout

__all__ = ["CACHE_READ_CHUNK_BYTES", "cache_key", "from_cache", "open_cached"]

log = logging.getLogger(__name__)

CACHE_READ_CHUNK_BYTES = 32 * 1024
"""Chunk size when a cache hit is streamed from storage."""

_RAW_G711 = frozenset({AudioFormat.MULAW, AudioFormat.ALAW})
"""Formats streamed as raw bytes but stored as WAV files."""


def cache_key(b: Backends, req: SynthesisRequest, voice_key: str, watermark: bool) -> str:
    """The cache key of ``req`` spoken in the voice whose cache-key part is ``voice_key``, stored
    marked when ``watermark`` (and the service has a watermark)."""
    return b.cache.key_for(
        req,
        model_identity=b.engine.identity,
        voice=voice_key or None,
        extra=_render_settings(b, watermark),
    )


def _render_settings(b: Backends, watermark: bool) -> dict[str, Any] | None:
    """What besides the request changes a stored render: the model's stream settings and the
    watermark (the cache key's ``extra``)."""
    settings = dict(b.engine.render_settings or {})
    if watermark and b.watermarker is not None:
        settings["watermark"] = b.watermarker.identity
    return settings or None


def open_cached(b: Backends, key: str, timing: Timing) -> CachedStream | None:
    """The cached file, or None: a miss, or a store that failed, was too slow or is skipped (the
    outcome is ``timing.extra["cache_lookup"]``; generation never waits past the deadline)."""
    try:
        hit = b.guard.lookup(lambda: b.cache.open(key), on_late=_close_late_hit)
    except StorageError as e:
        outcome = (
            "skipped"
            if isinstance(e, StoreSkipped)
            else "timeout"
            if isinstance(e, StoreTimeout)
            else "error"
        )
        timing.extra["cache_lookup"] = outcome
        timing.extra["cache_lookup_error"] = str(e)
        if outcome != "skipped":
            log.warning("cache lookup %s for %s: %s", outcome, key, e)
        return None
    timing.extra["cache_lookup"] = "hit" if hit is not None else "miss"
    return hit


def _close_late_hit(hit: CachedStream | None) -> None:
    """A cache lookup answered after its deadline: the request went on without it."""
    if hit is not None:
        hit.close()


def from_cache(
    b: Backends,
    s: ServiceStream,
    key: str,
    hit: CachedStream,
    timing: Timing,
    t0: float,
    voice_id: str | None,
) -> Iterator[EncodedChunk]:
    """The chunks of ``s`` read from the cached file ``hit`` (under ``key``); then ``s.result``.

    Args:
        b: the service's parts.
        s: the stream served.
        key: the cache key ``hit`` was found under.
        hit: the open cached file (closed here).
        timing: the request's timing record (filled in here).
        t0: when the request started (``time.perf_counter()``).
        voice_id: the registered voice spoken, or None (for the result).
    """
    req = s.request
    seq, total = 0, 0
    kept: list[bytes] = []
    with hit:
        body = hit.iter_chunks(CACHE_READ_CHUNK_BYTES)
        if s.keep_file or req.word_timestamps:
            body = _tee(body, kept)
        body = _as_streamed(body, req.response_format, req.sample_rate)  # the bytes a live stream sends
        for data in body:
            if s.cancelled:
                break
            if not data:
                continue
            t_ms = (time.perf_counter() - t0) * 1000
            if seq == 0:
                timing.ttfa_ms = t_ms
            total += len(data)
            yield EncodedChunk(seq, data, req.response_format, req.sample_rate, 0, t_ms)
            seq += 1
    if s.keep_file and not s.cancelled:
        s.file = b"".join(kept)
    duration_s = _hit_timing(s, hit.audio.metadata, timing, seq, t0)
    s.result = b.result(s, timing, total, duration_s, b.cache.blob_key(key), voice_id, None)
    if req.word_timestamps and not _cut(req.max_frames, hit.audio.metadata):
        file = b"".join(kept)
        s.result.words = word_times(
            timing, lambda: file_word_times(req.text, file, req.response_format, req.sample_rate)
        )


def _cut(max_frames: int | None, meta: Mapping[str, Any]) -> bool:
    """Whether the stored render stopped at its frame limit, its text not all spoken (entries from
    before ``finish_reason`` was stored: it made ``max_frames`` frames)."""
    if "finish_reason" in meta:
        return meta["finish_reason"] == "max_frames"
    return max_frames is not None and int(meta.get("frames", 0) or 0) >= max_frames


def _hit_timing(s: ServiceStream, meta: Mapping[str, Any], timing: Timing, chunks: int, t0: float) -> float:
    """Fill in ``timing`` of a hit sent in ``chunks`` chunks, from the stored file's metadata ``meta``;
    returns the stored audio's duration in seconds."""
    if meta.get("watermark"):
        timing.extra["watermark"] = meta["watermark"]
    timing.cache_hit = True
    timing.chunks = chunks
    timing.total_ms = (time.perf_counter() - t0) * 1000
    timing.finish_reason = "cancelled" if s.cancelled else "cache"
    duration_s = float(meta.get("duration_s", meta.get("audio_s", 0.0)) or 0.0)  # what was stored
    timing.audio_s = duration_s * s.request.speed  # the model's, as a request that rendered it reports
    if s.request.speed != 1.0:
        timing.extra["speed"] = s.request.speed
    timing.frames = int(meta.get("frames", 0) or 0)
    return duration_s


def _as_streamed(chunks: Iterator[bytes], fmt: AudioFormat, sample_rate: int) -> Iterator[bytes]:
    """A stored file's chunks turned into the bytes a live stream of the same audio sends: raw
    samples for G.711, the streaming header (sizes unknown) for WAV, "length unknown" for FLAC; the
    other formats are stored as streamed."""
    if fmt in _RAW_G711:
        return _wav_samples(chunks)
    if fmt == AudioFormat.WAV:
        return _head_rewritten(
            _wav_samples(chunks), 0, lambda head: stream_header(WavCodec.PCM16, sample_rate) + head
        )
    if fmt == AudioFormat.FLAC:
        return _head_rewritten(chunks, 26, unfinalize_flac)
    return chunks


def _wav_samples(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The sample bytes of a WAV file given as chunks (header and RIFF pad byte dropped)."""
    head = b""
    for data in chunks:
        head += data
        if len(head) >= 64:
            break
    offset, length = data_span(head)
    remaining = len(head) - offset if length is None else length
    first = head[offset : offset + remaining]
    remaining -= len(first)
    yield first
    for data in chunks:
        if length is not None:
            data = data[:remaining]
            remaining -= len(data)
        yield data


def _head_rewritten(chunks: Iterator[bytes], size: int, rewrite: Callable[[bytes], bytes]) -> Iterator[bytes]:
    """``chunks`` with their first ``size`` bytes (at least one chunk) passed through ``rewrite``."""
    head = b""
    for data in chunks:
        head += data
        if len(head) >= size:
            break
    yield rewrite(head)
    yield from chunks


def _tee(chunks: Iterator[bytes], into: list[bytes]) -> Iterator[bytes]:
    """``chunks``, each also appended to ``into``."""
    for chunk in chunks:
        into.append(chunk)
        yield chunk
