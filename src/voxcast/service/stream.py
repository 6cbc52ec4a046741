"""What a caller of the service iterates and gets back: :class:`ServiceStream`, its chunks, its result.

:meth:`Service.synthesize <voxcast.service.service.Service.synthesize>` and :meth:`Service.open
<voxcast.service.service.Service.open>` return a :class:`ServiceStream`: a lazy iterator of
:class:`EncodedChunk` (bytes in the requested format and rate) that starts the request at its first
``next()``; after iteration ``stream.result`` holds the :class:`SynthesisResult` (timing, blob key of
the complete file). The stream records the request in the metrics and the request log once, however
it ends. What produces the chunks (the cache or the engine) is given to it by the service, so this
module knows nothing of either.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from voxcast.audio.formats import AudioFormat
from voxcast.engine.request import SynthesisRequest
from voxcast.engine.stream import SynthesisStream
from voxcast.engine.text_feed import TextFeed, require_feed
from voxcast.engine.timing import Timing
from voxcast.metrics import Metrics, outcome
from voxcast.request_log import log_request

__all__ = ["EncodedChunk", "ServiceStream", "SynthesisResult", "word_times"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """Audio bytes of one chunk in the response format.

    ``t_ms`` is the time since the request started (for the first chunk: time to first audio).
    """

    seq: int
    data: bytes
    format: AudioFormat
    sample_rate: int
    frames: int
    t_ms: float


@dataclass
class SynthesisResult:
    """What is known once a stream has ended."""

    request_id: str
    format: AudioFormat
    sample_rate: int
    content_type: str
    bytes: int
    duration_s: float
    timing: Timing
    audio_key: str | None = None
    audio_url: str | None = None
    voice_id: str | None = None
    cache_error: str | None = None
    #: With ``word_timestamps``: each word's :meth:`WordTime.to_dict
    #: <voxcast.audio.word_times.WordTime.to_dict>`, in ms from the audio's start (None when not
    #: asked for, or when the text was not spoken to its end: cancelled, cut at ``max_frames``).
    words: list[dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["format"] = str(self.format)
        out["timing"] = self.timing.to_dict()
        if self.words is None:  # asked for only
            del out["words"]
        return out


def word_times(timing: Timing, estimate: Callable[[], list[Any]]) -> list[dict[str, Any]] | None:
    """The words' times ``estimate()`` gives, as dicts for :attr:`SynthesisResult.words` (None when
    the text was not spoken to its end, or the audio cannot be read back); the time it took is
    ``timing.extra["words_ms"]``."""
    if timing.finish_reason in ("cancelled", "max_frames") or timing.runaway:
        return None
    t0 = time.perf_counter()
    try:
        words = [w.to_dict() for w in estimate()]
    except ValueError as e:  # a cached file that does not decode
        log.warning("request %s: no word timestamps: %s", timing.request_id, e)
        return None
    timing.extra["words_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    return words


class ServiceStream(Iterator[EncodedChunk]):
    """Lazy iterator of encoded chunks (from the engine or from the cache); see the module docstring.

    Args:
        run: produces the chunks of a stream (the service's request path), called at the first
            ``next()``.
        metrics: where the request and its chunks are counted.
        request: the validated request.
        store: store the complete file (see :meth:`Service.synthesize
            <voxcast.service.service.Service.synthesize>`, as are the rest).
    """

    def __init__(
        self,
        run: Callable[[ServiceStream], Iterator[EncodedChunk]],
        metrics: Metrics,
        request: SynthesisRequest,
        store: bool,
        entry: str = "python",
        feed: TextFeed | None = None,
        watermark: bool = True,
        keep_file: bool = False,
        realtime: bool | None = None,
        refusable: bool = False,
    ) -> None:
        self.request = request
        #: Played as it arrives (None: the request's ``stream``); refused when the engine is full.
        self.realtime = realtime
        self.refusable = refusable
        #: Text that arrives in pieces (:meth:`Service.open`), else None.
        self.feed = feed
        #: The entry point that opened it (metrics label): http, websocket, runpod, rq, cli, python.
        self.entry = entry
        self.request_id = request.request_id or uuid.uuid4().hex
        self.result: SynthesisResult | None = None
        #: ``time.perf_counter()`` when iteration started: every chunk's ``t_ms`` counts from here.
        self.t_start = 0.0
        self._run = run
        self._metrics = metrics
        #: Store the complete file (a cache fill is decided apart from this).
        self.store = store
        #: Mark what is stored when the service has a watermark (off: the caller marks its own audio).
        self.watermark = watermark
        #: Keep the complete file in :attr:`file` (what is stored: marked where the watermark is on).
        self.keep_file = keep_file
        #: With ``keep_file``: after iteration, the complete file (None: cancelled, or it failed).
        self.file: bytes | None = None
        self._it: Iterator[EncodedChunk] | None = None
        self._engine_stream: SynthesisStream | None = None
        self._cancelled = False
        self._timing: Timing | None = None
        self._recorded = False

    def __iter__(self) -> ServiceStream:
        return self

    def __next__(self) -> EncodedChunk:
        if self._it is None:
            self._it = self._run(self)
        try:
            chunk = next(self._it)
        except StopIteration:
            self._ended(None)
            raise
        except BaseException as e:
            self._ended(e)
            raise
        self._metrics.chunk(chunk.frames)
        return chunk

    def begin(self) -> Timing:
        """The request starts (called by ``run``): :attr:`t_start` is now; returns its timing record."""
        self.t_start = time.perf_counter()
        self._timing = Timing(request_id=self.request_id)
        return self._timing

    def attach(self, engine_stream: SynthesisStream) -> None:
        """The engine renders it through ``engine_stream`` (cancelled at once if this already is)."""
        self._engine_stream = engine_stream
        if self.cancelled:
            engine_stream.cancel()

    def _ended(self, error: BaseException | None) -> None:
        """Record the request in the metrics and the request log, once."""
        if self._recorded:
            return
        self._recorded = True
        try:  # bookkeeping never turns a served request into a failed one
            metrics = self._metrics
            metrics.request_ended(self.entry, self._timing, error)
            log_request(
                self.request_id,
                self.entry,
                metrics.model,
                self.request,
                self._timing,
                outcome(self._timing, error),
            )
        except Exception:
            log.exception("request %s: recording its metrics or log line failed", self.request_id)

    def push(self, delta: str | bytes) -> None:
        """Add text to a stream from :meth:`Service.open` (thread-safe; before or while iterating).

        Raises:
            InvalidRequest: not an open stream, its text is complete, or it grew too long ("text").
        """
        require_feed(self.feed).push(delta)

    def close_text(self) -> None:
        """The text of a stream from :meth:`Service.open` is complete (thread-safe, idempotent)."""
        require_feed(self.feed).close()

    def cancel(self) -> None:
        """Stop (thread-safe): the engine stops within one frame; a cache read stops at its next chunk."""
        self._cancelled = True
        if self._engine_stream is not None:
            self._engine_stream.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def ended(self) -> bool:
        """True once it can speak no more text: the engine ended or failed it, or iteration ended."""
        engine = self._engine_stream
        return self._recorded or (engine is not None and engine.done)
