"""``/v1/audio/speech/ws``: the ``nari.speech.v1`` WebSocket, one request per connection whose text
arrives word by word, as nari-labs' open serving benchmark (``tts_bench --target nari --transport
websocket``) speaks it.

The client must offer the subprotocol ``nari.speech.v1`` (the server echoes it). Then, JSON text
messages with a ``type``, and the audio as binary messages:

1. server: ``session.created`` ``{"protocol": "nari.speech.v1", "audio": {"encoding": "pcm_s16le",
   "sample_rate": 24000, "channels": 1}}``.
2. client: ``request.start``: the request's fields (``model``, ``voice``, ``language``,
   ``response_format`` (``pcm`` only), ``seed``, ``instructions``, ``sample_rate``, sampling...),
   checked by the request schema; no text. Server: ``request.configured`` ``{"request_id", "audio"}``.
3. client: ``input_text.append`` ``{"sequence": i, "text": "..."}``, i = 0, 1, 2...; each is
   answered by ``input_text.ack`` ``{"event": "input_text.append", "sequence": i, "request_id"}``.
   The pieces are one utterance fed to the model as they arrive (``Service.open``, the path of the
   other socket's ``words`` mode): audio starts once the first word is complete, and with a seed
   it equals the text sent whole with ``non_streaming_text: false``. At the first append the server
   sends ``response.started`` ``{"request_id", "audio"}``, then the audio: raw PCM in binary
   messages, one per chunk.
4. client: ``input_text.end`` ``{"sequence": n}`` (n: the number of appends), answered by
   ``input_text.ack`` with ``"event": "input_text.end"``. When the audio has ended the server sends
   ``response.done`` ``{"request_id", "stop_reason", "audio_chunks", "finish_reason", "timing"}``;
   ``audio_chunks`` counts the binary messages, ``stop_reason`` is ``stop`` (speech ended, or at the
   request's own ``max_frames``), ``length`` (cut at the derived frame limit: a runaway) or
   ``cancelled``. Once the input has ended too it closes the connection with code 1000.

Text that arrives after the audio ended by itself (end of speech) is acknowledged, not spoken.
``response.cancel`` stops the synthesis within a frame: no audio after it, ``response.done`` with
``stop_reason`` ``cancelled``, close 1000. Any error (a bad field, a message out of order, an unknown
type, over capacity, a failed synthesis) is one ``{"type": "error", "error": {"message", "type",
"param", "code"}}`` event naming the field, then the close: 1008 for a client's error, 1013 over
capacity, 1001 when the server shuts down (the drain deadline), 1011 for a server error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from voxcast.audio.formats import NATIVE_SAMPLE_RATE
from voxcast.errors import InvalidRequest, VoxcastError
from voxcast.logs import set_request_id
from voxcast.service import EncodedChunk, Service, ServiceStream
from voxcast.serving.drain import Drain, WorkerShutdown
from voxcast.serving.http.errors import error_for
from voxcast.serving.http.sockets import (
    encode_event,
    error_event,
    is_unicode,
    receive_object,
    takes_text,
)
from voxcast.serving.pump import ThreadPump

__all__ = ["PROTOCOL", "NariSocket", "subprotocol"]

log = logging.getLogger(__name__)

PROTOCOL = "nari.speech.v1"
"""The WebSocket subprotocol."""

_GONE = (WebSocketDisconnect, RuntimeError, OSError)
"""What sending to (or closing) a socket whose client went away raises."""
_TYPES = ("request.start", "input_text.append", "input_text.end", "response.cancel")


def subprotocol(ws: WebSocket) -> str | None:
    """The subprotocol to accept ``ws`` with: :data:`PROTOCOL` when the client offered it."""
    return PROTOCOL if PROTOCOL in ws.scope.get("subprotocols", ()) else None


def _audio(sample_rate: int) -> dict[str, Any]:
    return {"encoding": "pcm_s16le", "sample_rate": sample_rate, "channels": 1}


def _close_code(e: BaseException) -> int:
    """The close code after the error ``e``: see the module docstring."""
    if isinstance(e, WorkerShutdown):
        return 1001
    status = error_for(e).status
    return 1008 if status < 500 else 1013 if status == 503 else 1011


def _stop_reason(stream: ServiceStream, cancelled: bool) -> tuple[str, str | None]:
    """``(stop_reason, voxcast's finish_reason)`` of a response that ended."""
    timing = stream.result.timing if stream.result is not None else None
    if cancelled or timing is None:
        return "cancelled", timing.finish_reason if timing is not None else "cancelled"
    return ("length" if timing.runaway else "stop"), timing.finish_reason


class NariSocket:
    """One connection: the client's messages are read here; the audio is sent by a speaker task
    started at the first append."""

    def __init__(
        self,
        ws: WebSocket,
        service: Service,
        *,
        queue_chunks: int,
        stall_s: float,
        drain: Drain | None = None,
    ) -> None:
        self.ws = ws
        self.service = service
        self.queue_chunks = queue_chunks
        self.stall_s = stall_s
        self.drain = drain
        self.stream: ServiceStream | None = None
        self.appends = 0
        self.input_ended = False
        self.chunks = 0  # binary messages sent
        self.cancelled = False
        self._end_acked = False
        self._done_sent = False
        self._closed = False  # the close was sent (nothing more goes out)
        self._speaker: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def send(self, event: dict[str, Any] | bytes) -> None:
        async with self._lock:
            if self._closed:
                return
            if isinstance(event, bytes):
                await self.ws.send_bytes(event)
            else:
                await self.ws.send_text(encode_event(event))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        async with self._lock:
            if not self._closed:
                self._closed = True
                await self.ws.close(code=code, reason=reason)

    async def run(self) -> None:
        """Serve the connection (accepted already) until its close or the client's disconnect."""
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        tracked = self.drain.track(self._shutdown) if self.drain is not None else contextlib.nullcontext()
        with tracked, contextlib.suppress(*_GONE):
            try:
                await self._serve()
            finally:
                speaker = self._speaker
                if not self._done_sent:  # the client went away, stopped reading, or an error: stop now
                    self.cancelled = True
                    if self.stream is not None:
                        self.stream.cancel()
                    if speaker is not None:
                        speaker.cancel()
                if speaker is not None:
                    with contextlib.suppress(asyncio.CancelledError, *_GONE):
                        await speaker

    async def _serve(self) -> None:
        if subprotocol(self.ws) is None:
            message = f"offer the WebSocket subprotocol {PROTOCOL} (Sec-WebSocket-Protocol)"
            await self.fail(InvalidRequest(message, field="Sec-WebSocket-Protocol"))
            return
        await self.send(
            {"type": "session.created", "protocol": PROTOCOL, "audio": _audio(NATIVE_SAMPLE_RATE)}
        )
        while not self._closed:
            try:
                msg = await receive_object(self.ws, self.service.metrics)
                await self._handle(msg)
            except VoxcastError as e:
                await self.fail(e)
                return

    async def fail(self, e: BaseException) -> None:
        """Report ``e`` (one ``error`` event), stop the synthesis and close the connection."""
        self.cancelled = True
        if self.stream is not None:
            self.stream.cancel()
        if self._closed:
            return
        err = error_for(e)
        log.info("nari websocket: %s (%s); closing it", err.message, err.code)
        await self.send(error_event(e))
        await self.close(_close_code(e), err.code)

    # -- client messages -------------------------------------------------------------------------
    async def _handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "request.start":
            await self._start(msg)
        elif kind == "input_text.append":
            await self._append(msg)
        elif kind == "input_text.end":
            await self._end(msg)
        elif kind == "response.cancel":
            await self._cancel()
        else:
            raise InvalidRequest(
                f"unknown message type {str(kind)[:64]!r}: the client sends {', '.join(_TYPES)}", field="type"
            )

    def _started(self, kind: str) -> ServiceStream:
        if self.stream is None:
            raise InvalidRequest(f"{kind} before request.start", field="type")
        return self.stream

    async def _start(self, msg: dict[str, Any]) -> None:
        if self.stream is not None:
            raise InvalidRequest("request.start was sent already: one request per connection", field="type")
        fields = {k: v for k, v in msg.items() if k != "type"}
        for name in ("input", "text"):
            if name in fields:
                raise InvalidRequest(f"{name}: the text comes in input_text.append messages", field=name)
        fields.setdefault("response_format", "pcm")
        if fields["response_format"] != "pcm":
            raise InvalidRequest(
                "response_format must be pcm on this socket (16-bit little-endian PCM)",
                field="response_format",
            )
        stream = self.service.open(fields, entry="websocket", refusable=True)  # the request schema
        await asyncio.to_thread(self.service.check_voice, stream.request)  # an unknown voice: refused now
        self.stream = stream
        set_request_id(stream.request_id)
        audio = _audio(stream.request.sample_rate)
        await self.send({"type": "request.configured", "request_id": stream.request_id, "audio": audio})

    async def _append(self, msg: dict[str, Any]) -> None:
        stream = self._started("input_text.append")
        if self.input_ended:
            raise InvalidRequest("input_text.append after input_text.end", field="type")
        self._check_sequence(msg, self.appends)
        text = msg.get("text")
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string", field="text")
        if not is_unicode(text):
            raise InvalidRequest("text contains invalid Unicode (a lone surrogate)", field="text")
        if takes_text(stream) and not self.cancelled:
            stream.push(text)  # refused past a request's length (field text)
        self.appends += 1
        if self._speaker is None and not self.cancelled:
            audio = _audio(stream.request.sample_rate)
            await self.send({"type": "response.started", "request_id": stream.request_id, "audio": audio})
            self._speaker = asyncio.create_task(self._speak(stream))
        await self._ack("input_text.append", self.appends - 1)

    async def _end(self, msg: dict[str, Any]) -> None:
        stream = self._started("input_text.end")
        if self.input_ended:
            raise InvalidRequest("input_text.end was sent already", field="type")
        self._check_sequence(msg, self.appends)
        if self.appends == 0:
            raise InvalidRequest("no text: send input_text.append before input_text.end", field="text")
        self.input_ended = True
        if takes_text(stream):
            stream.close_text()
        await self._ack("input_text.end", self.appends)
        self._end_acked = True
        await self._close_when_done()

    async def _cancel(self) -> None:
        stream = self._started("response.cancel")
        if self._done_sent:  # the response is over: nothing to stop
            await self.close()
            return
        self.cancelled = True
        stream.cancel()  # the engine stops within one frame; the speaker sends nothing more
        if self._speaker is None:  # nothing spoken yet: the response ends here
            await self._done(stream)
            await self.close()

    @staticmethod
    def _check_sequence(msg: dict[str, Any], expected: int) -> None:
        got = msg.get("sequence")
        if isinstance(got, bool) or got != expected:
            raise InvalidRequest(
                f"sequence must be {expected} (appends count from 0; input_text.end carries their number), "
                f"not {str(got)[:32]}",
                field="sequence",
            )

    async def _ack(self, event: str, sequence: int) -> None:
        assert self.stream is not None
        ack = {"type": "input_text.ack", "event": event, "sequence": sequence}
        await self.send({**ack, "request_id": self.stream.request_id})

    async def _done(self, stream: ServiceStream) -> None:
        stop_reason, finish_reason = _stop_reason(stream, self.cancelled)
        result = stream.result if not self.cancelled else None
        await self.send(
            {
                "type": "response.done",
                "request_id": stream.request_id,
                "stop_reason": stop_reason,
                "audio_chunks": self.chunks,
                "finish_reason": finish_reason,
                "timing": result.timing.to_dict() if result is not None else None,
            }
        )
        self._done_sent = True

    async def _close_when_done(self) -> None:
        """Close (1000) once the response is done and the client's input has ended (acknowledged)."""
        if self._done_sent and self._end_acked:
            await self.close()

    # -- speaking --------------------------------------------------------------------------------
    async def _speak(self, stream: ServiceStream) -> None:
        set_request_id(stream.request_id)
        pump: ThreadPump[EncodedChunk] = ThreadPump(
            stream,
            maxsize=self.queue_chunks,
            name=f"voxcast-nari-{stream.request_id[:12]}",
            stall_s=self.stall_s,
            on_stall=lambda: self._stalled(stream),
        ).start()
        try:
            async for chunk in pump:
                if self.cancelled:
                    break
                if chunk.data:
                    await self.send(chunk.data)
                    self.chunks += 1
        except Exception as e:  # the synthesis failed (over capacity, a bad reference, ...): reported
            if not isinstance(e, VoxcastError):
                log.exception("nari websocket: the synthesis failed")
            await self.fail(e)
            return
        finally:
            if not pump.finished:
                stream.cancel()
            pump.close()
        if self._closed:
            return
        await self._done(stream)
        if self.cancelled:
            await self.close()
        else:
            await self._close_when_done()

    def _stalled(self, stream: ServiceStream) -> None:
        """On the pump's thread: the client stopped reading. Stop the synthesis and the connection."""
        stream.cancel()
        task, loop = self._task, self._loop
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    def _shutdown(self, reason: str) -> None:
        """On the drain's thread, at its deadline: stop, say why (``shutdown``), close with 1001."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.fail(WorkerShutdown(reason))))
