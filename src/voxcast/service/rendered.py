"""Serving a request through the engine: its audio encoded as it streams, then the complete file stored.

Each chunk the engine delivers is time-stretched (``speed``), encoded to the response format and sent
at once. Once the stream has ended, the complete file is assembled (from the streamed bytes, or the
audio marked with the service's watermark and encoded alike) and, within the store guard's write
deadline, fills the cache (a deterministic request) or is stored under ``renders/`` (``store``), so
the first chunk is never delayed by storage. Storage failures never fail a synthesis: they are
reported in ``result.cache_error``, and the file is kept in memory and written once the store answers
again (:mod:`voxcast.storage.pending`, bounded in bytes and time).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from voxcast.audio.encode import StreamEncoder, stream_to_file
from voxcast.audio.formats import file_content_type, file_extension
from voxcast.audio.stretch import TimeStretch
from voxcast.audio.word_times import estimate_word_times
from voxcast.engine.stream import SynthesisStream
from voxcast.engine.timing import Timing
from voxcast.errors import StorageError
from voxcast.service.backends import Backends
from voxcast.service.stream import EncodedChunk, ServiceStream, word_times
from voxcast.storage.guard import StoreSkipped, StoreTimeout
from voxcast.storage.keys import validate_key
from voxcast.text.normalize import normalize_text
from voxcast.watermark import mark_file

__all__ = ["from_engine"]

log = logging.getLogger(__name__)


def from_engine(
    b: Backends,
    s: ServiceStream,
    voice: Any,
    key: str | None,
    timing: Timing,
    t0: float,
    voice_id: str | None,
) -> Iterator[EncodedChunk]:
    """The chunks of ``s`` rendered by the engine in ``voice``; then the file stored and ``s.result``.

    Args:
        b: the service's parts.
        s: the stream served.
        voice: the voice prompt (None: a built-in speaker, or the model's own voice).
        key: the cache key to fill (a deterministic request), or None.
        timing: the request's timing record (the engine fills it in).
        t0: when the request started (``time.perf_counter()``): first audio and total count from it.
        voice_id: the registered voice spoken, or None (for the result).
    """
    yield from _Render(b, s, key, timing, t0, voice_id).chunks(voice)


class _Render:
    """One request rendered through the engine (see :func:`from_engine`)."""

    def __init__(
        self, b: Backends, s: ServiceStream, key: str | None, timing: Timing, t0: float, voice_id: str | None
    ) -> None:
        self.b, self.s, self.key, self.timing, self.t0, self.voice_id = b, s, key, timing, t0, voice_id
        req = s.request
        self.encoder = StreamEncoder(req.response_format, req.sample_rate, b.engine.sample_rate)
        self.stretcher = TimeStretch(req.speed, b.engine.sample_rate) if req.speed != 1.0 else None
        #: The complete file is needed: stored (a render or a cache fill) or kept.
        self.whole = s.store or key is not None or s.keep_file
        #: The audio to mark for the stored copy, or None.
        self.marked: list[np.ndarray] | None = [] if self.whole and s.watermark and b.watermarker else None
        #: What the words are timed in, or None.
        self.heard: list[np.ndarray] | None = [] if req.word_timestamps else None
        #: The bytes streamed so far.
        self.parts: list[bytes] = []

    def chunks(self, voice: Any) -> Iterator[EncodedChunk]:
        yield from self._encoded(self._start(voice))
        self._finish(b"".join(self.parts))

    def _start(self, voice: Any) -> SynthesisStream:
        """The engine's stream of the request (text given whole, or fed in pieces)."""
        s, engine = self.s, self.b.engine
        flags: dict[str, Any] = {"realtime": s.realtime, "refusable": s.refusable}
        es = (
            engine.synthesize(s.request, voice, **flags)
            if s.feed is None
            else engine.open(s.request, voice, s.feed, **flags)
        )
        es.timing = self.timing
        es.t_origin = self.t0  # first audio and total count from the request's arrival, voice included
        self.s.attach(es)
        return es

    def _encoded(self, es: SynthesisStream) -> Iterator[EncodedChunk]:
        """The engine's chunks, stretched and encoded (a chunk the encoder holds back is counted in
        the next one's ``frames``), then the encoder's tail."""
        req = self.s.request
        seq = held = 0
        for chunk in es:
            pcm = chunk.pcm if self.stretcher is None else self.stretcher.process(chunk.pcm)
            self._keep(pcm)
            data = self.encoder.encode(pcm)
            held += chunk.frames
            if not data:  # the encoder holds these samples (resampler or MP3 look-ahead): count them later
                continue
            self.parts.append(data)
            yield EncodedChunk(
                seq,
                data,
                req.response_format,
                req.sample_rate,
                held,
                (chunk.t_emit - self.t0) * 1000,
            )
            seq += 1
            held = 0
        tail = self._tail()
        if tail:
            self.parts.append(tail)
            yield EncodedChunk(
                seq, tail, req.response_format, req.sample_rate, held, (time.perf_counter() - self.t0) * 1000
            )

    def _keep(self, pcm: np.ndarray) -> None:
        for kept in (self.marked, self.heard):
            if kept is not None:
                kept.append(pcm)

    def _tail(self) -> bytes:
        """What the stretcher and the encoder still hold, encoded."""
        # the stretcher's held-back end (not after a cancel: nobody wants the rest)
        rest = self.stretcher.finish() if self.stretcher is not None and not self.s.cancelled else None
        if rest is not None:
            self._keep(rest)
        try:
            return (
                self.encoder.encode(rest) if rest is not None and len(rest) else b""
            ) + self.encoder.finish()
        except ValueError:  # flac/opus of a stream that produced no audio (e.g. cancelled)
            return b""

    def _finish(self, streamed: bytes) -> None:
        """Store the complete file (``streamed`` is what went out) and set ``s.result``."""
        s, timing = self.s, self.timing
        req = s.request
        if s.feed is not None:  # the text as spoken, for the request log and the result
            s.request = req = req.model_copy(update={"text": normalize_text(s.feed.snapshot()[0])})
        audio_s = timing.audio_s
        if self.stretcher is not None:  # the audio delivered, not the model's
            timing.extra["speed"] = req.speed
            audio_s = round(timing.audio_s / req.speed, 4)
        audio_key, error = self._stored(streamed, audio_s)
        error = error or timing.extra.get("cache_lookup_error")
        s.result = self.b.result(s, timing, len(streamed), audio_s, audio_key, self.voice_id, error)
        if self.heard is not None:
            audio = np.concatenate(self.heard) if self.heard else np.zeros(0, np.float32)
            s.result.words = word_times(
                timing, lambda: estimate_word_times(req.text, audio, self.b.engine.sample_rate)
            )

    def _stored(self, streamed: bytes, audio_s: float) -> tuple[str | None, str | None]:
        """``(key, None)`` of the stored complete file, else ``(None, error or None)``; keeps the file
        in ``s.file`` when asked to. Nothing of a cancelled stream."""
        s, timing = self.s, self.timing
        if timing.finish_reason == "cancelled" or not self.whole:
            return None, None
        whole_file, error = self._file(streamed)
        s.file = whole_file if s.keep_file else None
        # a runaway is never cached, so a request that does not store (synth) keeps it nowhere
        if (s.store or (self.key is not None and not timing.runaway)) and whole_file is not None:
            return self._persist(whole_file, audio_s)
        return None, error

    def _file(self, streamed: bytes) -> tuple[bytes | None, str | None]:
        """``(file, None)``: the complete file to store, the stream's bytes or the watermarked audio
        encoded alike; ``(None, error)`` when marking failed (the audio already went out: the request
        stands, nothing is stored, the error is reported like a storage failure)."""
        encoder, marked, watermarker = self.encoder, self.marked, self.b.watermarker
        fmt, rate = encoder.format, encoder.sample_rate
        if marked is None or watermarker is None or not any(len(p) for p in marked):
            return stream_to_file(fmt, rate, streamed, encoder.samples), None
        t0 = time.perf_counter()
        try:
            data = mark_file(watermarker, marked, self.b.engine.sample_rate, fmt, rate)
        except Exception as e:
            log.exception("marking the stored copy failed; nothing stored")
            return None, f"watermark failed, nothing stored: {e}"
        self.timing.extra["watermark"] = watermarker.name
        self.timing.extra["watermark_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        return data, None

    def _persist(self, data: bytes, audio_s: float) -> tuple[str | None, str | None]:
        """Fill the cache (deterministic requests) or store the rendering (``audio_s`` long), within
        the store guard's write deadline; returns ``(key, None)`` or ``(None, error)``, never raises
        StorageError. A write that failed (now, or after its deadline) is kept to be made later."""
        s, timing = self.s, self.timing
        meta = {
            "duration_s": f"{audio_s:.3f}",
            "frames": str(timing.frames),
            "request_id": s.request_id,
            "finish_reason": timing.finish_reason,  # a hit of a cut render gets no word timestamps
        }
        if "watermark" in timing.extra:  # a cache hit reports it from here
            meta["watermark"] = str(timing.extra["watermark"])

        def write() -> str:
            return self._write(data, meta)

        try:
            return self.b.guard.write(
                write, on_late_error=lambda _: self._keep_for_later(write, len(data))
            ), None
        except StoreTimeout as e:
            log.warning("request %s: storing the audio is not confirmed: %s", s.request_id, e)
            return None, f"{e}; the write goes on in the background"
        except StorageError as e:
            if not isinstance(e, StoreSkipped):
                log.warning("request %s: storing the audio failed: %s", s.request_id, e)
            if self._keep_for_later(write, len(data)):
                return None, f"{e}; the file is kept and stored when the store answers"
            return None, str(e)

    def _keep_for_later(self, write: Callable[[], str], nbytes: int) -> bool:
        """Keep a failed write of this request's file to make it again later (:mod:`voxcast.storage.pending`)."""
        if self.b.pending is None:
            return False
        fills_cache = self.key is not None and not self.timing.runaway
        what = f"request {self.s.request_id}: " + ("cache fill" if fills_cache else "render")
        return self.b.pending.add(what, nbytes, write)

    def _write(self, data: bytes, meta: dict[str, str]) -> str:
        """Fill the cache or store the render; returns the object's key. Raises StorageError."""
        s, key, cache = self.s, self.key, self.b.cache
        fmt = s.request.response_format
        content_type = file_content_type(fmt)
        if key is not None and not self.timing.runaway:
            cache.fill(key, data, meta, content_type=content_type)
            return cache.blob_key(key)
        # Create-once: a render is never replaced by another request's. A request id seen before
        # (a caller reusing one, a retried job) gets a key with a unique part instead.
        ext = file_extension(fmt)
        metadata = {k.replace("_", "-"): str(v) for k, v in meta.items()}
        for blob_key in (
            f"renders/{s.request_id}.{ext}",
            f"renders/{s.request_id}-{uuid.uuid4().hex[:12]}.{ext}",
        ):
            if self.b.store.put_bytes(
                validate_key(blob_key), data, content_type=content_type, metadata=metadata, if_none_match=True
            ):
                return blob_key
        raise StorageError(f"renders/{s.request_id}: no free key")  # two random keys taken: not expected
