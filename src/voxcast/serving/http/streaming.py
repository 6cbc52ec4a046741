"""One speech request's response: the service stream pumped off the event loop onto the socket.

The service stream is iterated on its own thread (:class:`~voxcast.serving.pump.ThreadPump`); the
route waits for the first chunk before it answers, so an error found by then (an unknown voice, a
bad reference) is a 4xx JSON error, and the first bytes leave as soon as the first chunk exists.
Then:

- ``stream_format=audio``: the body is the audio bytes, chunked as they come. An error after the
  first bytes aborts the connection (the client sees an incomplete body, never a silent cut).
- ``stream_format=sse``: ``speech.audio.delta`` events with base64 audio, then one
  ``speech.audio.done`` event with ``usage`` and voxcast's ``timing`` (or an ``error`` event).

A client that disconnects cancels its generation (the engine stops within one frame); one that stops
reading while its buffer is full for ``stall_s`` has its stream cancelled and counted.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from voxcast.audio.formats import stream_content_type
from voxcast.service import EncodedChunk, ServiceStream
from voxcast.serving.drain import SHUTDOWN, Drain, WorkerShutdown
from voxcast.serving.http.errors import error_body, error_for
from voxcast.serving.http.limits import ABORT_EXTENSION
from voxcast.serving.pump import ThreadPump

__all__ = ["Counters", "open_speech"]

log = logging.getLogger(__name__)


@dataclass
class Counters:
    """What the server counts (reported by ``/health``; ``/metrics`` comes with the operations work)."""

    requests: int = 0
    completed: int = 0
    errors: int = 0
    disconnected: int = 0
    stalled: int = 0
    by_code: dict[str, int] = field(default_factory=dict)
    #: Requests and WebSocket handshakes refused before a route ran, by reason (``api_key``, ``host``,
    #: ``origin``); not in ``requests`` (which counts speech requests).
    refused: dict[str, int] = field(default_factory=dict)

    def error(self, code: str) -> None:
        self.errors += 1
        self.by_code[code] = self.by_code.get(code, 0) + 1


class _Response(StreamingResponse):
    """A streaming response that runs ``on_close`` and closes its body however it ends (sent, failed,
    disconnected or aborted), and that :meth:`abort` ends from any thread (a client that stopped
    reading: the send it waits in never returns by itself).

    An aborted response is cut while its body waits at a ``yield``; the body generator is closed here
    (not left to the garbage collector), so the ``finally`` blocks in it run at once.
    """

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], None], **kw: Any) -> None:
        super().__init__(body, **kw)
        self._on_close = on_close
        self._abort: Callable[[], None] | None = None
        self._aborted = False

    def abort(self) -> None:
        self._aborted = True
        if self._abort is not None:
            self._abort()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task, loop = asyncio.current_task(), asyncio.get_running_loop()
        reset = scope.get("extensions", {}).get(ABORT_EXTENSION)
        if reset is not None:  # voxcast serve: reset the connection; the pending send then returns

            def abort() -> None:
                loop.call_soon_threadsafe(reset)

            self._abort = abort
        elif task is not None:  # another server: cancel the task waiting in its send

            def cancel() -> None:
                loop.call_soon_threadsafe(task.cancel)

            self._abort = cancel
        try:
            if self._aborted:
                raise ConnectionAbortedError("the client stopped reading")
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            if not self._aborted:
                raise
            # our own abort (counted and logged by the stall): uvicorn closes the connection
        finally:
            self._on_close()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()


def _usage(stream: ServiceStream) -> dict[str, Any]:
    """OpenAI's ``usage`` object: input tokens are the text's characters, output tokens 80 ms frames."""
    frames = stream.result.timing.frames if stream.result is not None else 0
    chars = len(stream.request.text)
    return {"input_tokens": chars, "output_tokens": frames, "total_tokens": chars + frames}


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def _delta(chunk: EncodedChunk) -> bytes:
    return _sse({"type": "speech.audio.delta", "audio": base64.b64encode(chunk.data).decode("ascii")})


async def open_speech(
    stream: ServiceStream,
    stream_format: str,
    counters: Counters,
    *,
    queue_chunks: int,
    stall_s: float,
    drain: Drain | None = None,
) -> StreamingResponse:
    """Start ``stream``, wait for its first chunk and return the response that streams the rest.

    A response still streaming at ``drain``'s deadline (the server is stopping) ends with an SSE
    ``error`` event of code ``shutdown``, or, for raw audio, by closing the connection before the
    body's end (a chunked body without its last chunk: never a silently short file).

    Raises:
        whatever the stream raised before its first chunk (the route turns it into a JSON error).
    """

    responses: list[_Response] = []

    def stalled() -> None:  # on the pump's thread
        stream.cancel()
        counters.stalled += 1
        for response in responses:
            response.abort()  # the uvicorn protocol then closes the connection

    pump: ThreadPump[EncodedChunk] = ThreadPump(
        stream,
        maxsize=queue_chunks,
        name=f"voxcast-http-{stream.request_id[:12]}",
        stall_s=stall_s,
        on_stall=stalled,
    ).start()
    try:
        first: EncodedChunk | None = await pump.__anext__()
    except StopAsyncIteration:
        first = None  # no audio at all (e.g. a text that ends at once): an empty body
    except BaseException:
        stream.cancel()
        pump.close()
        raise

    req = stream.request
    headers = {
        "X-Request-Id": stream.request_id,
        "X-Accel-Buffering": "no",
        "Cache-Control": "no-cache",
        "X-Voxcast-TTFA-Ms": f"{first.t_ms:.1f}" if first is not None else "",
    }
    parts = _Body(stream, pump, first, counters, drain)
    # Registered with the drain until the response ends, however it ends: a stalled client's response
    # is cut while its body waits to send, and must not stay registered (SIGTERM would then wait for
    # the whole drain deadline on an idle server).
    registration = contextlib.ExitStack()
    registration.enter_context(parts.tracked())

    def on_close() -> None:
        registration.close()
        if not pump.finished and not pump.stalled:  # the client went away before the end
            counters.disconnected += 1
            log.info("request %s: client gone; generation cancelled", stream.request_id)
            stream.cancel()
        pump.close()

    if stream_format == "sse":
        body, media = _sse_body(parts), "text/event-stream"
    else:
        body = _audio_body(parts)
        media = stream_content_type(req.response_format, req.sample_rate)
    response = _Response(body, on_close, media_type=media, headers=headers)
    responses.append(response)
    if pump.stalled:  # it stalled before the response existed
        response.abort()
    return response


@dataclass
class _Body:
    """What one response body streams: the service stream, the pump it comes through, the chunk the
    route already waited for, the server's counters, and the drain that may cut it (``shutdown``: the
    reason, once the drain deadline did)."""

    stream: ServiceStream
    pump: ThreadPump[EncodedChunk]
    first: EncodedChunk | None
    counters: Counters
    drain: Drain | None
    shutdown: str | None = None

    def tracked(self) -> contextlib.AbstractContextManager[Any]:
        """Registration with the drain while the response exists."""
        return self.drain.track(self._stop) if self.drain is not None else contextlib.nullcontext()

    def _stop(self, reason: str) -> None:  # the drain's thread
        self.shutdown = reason
        self.stream.cancel()

    def finished(self) -> None:
        """Count a stream that ran to its end (the service logs its line, voxcast.request_log)."""
        if self.pump.stalled:  # counted and logged; the response ends as an abort (never completed)
            raise asyncio.CancelledError
        self.counters.completed += 1


async def _audio_body(b: _Body) -> AsyncIterator[bytes]:
    if b.first is not None:
        yield b.first.data
    try:
        async for chunk in b.pump:
            yield chunk.data
    except Exception as e:
        b.counters.error(error_for(e).code)
        log.exception("request %s failed after its first audio; connection aborted", b.stream.request_id)
        raise
    if b.shutdown is not None:
        b.counters.error(SHUTDOWN)
        log.warning(
            "request %s: %s; connection closed before the body's end", b.stream.request_id, b.shutdown
        )
        raise asyncio.CancelledError  # uvicorn closes the connection without the body's last chunk
    b.finished()


async def _sse_body(b: _Body) -> AsyncIterator[bytes]:
    stream = b.stream
    if b.first is not None:
        yield _delta(b.first)
    try:
        async for chunk in b.pump:
            yield _delta(chunk)
        if b.shutdown is not None:
            raise WorkerShutdown(b.shutdown)
    except Exception as e:
        err = error_for(e)
        b.counters.error(err.code)
        if isinstance(e, WorkerShutdown):
            log.warning("request %s: %s", stream.request_id, e.message)
        else:
            log.exception("request %s failed after its first audio", stream.request_id)
        yield _sse({"type": "error", **error_body(err.status, err.message, err.code, err.field)})
        return
    b.finished()
    done: dict[str, Any] = {
        "type": "speech.audio.done",
        "usage": _usage(stream),
        "request_id": stream.request_id,
    }
    if stream.result is not None:
        result = stream.result.to_dict()
        done["timing"] = result.pop("timing")
        done["result"] = result
    yield _sse(done)
