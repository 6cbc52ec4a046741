"""``/v1/audio/speech/stream``: a WebSocket for agents that produce text as they go.

Client -> server, JSON text messages (``type`` says which):

- ``config``: the request fields every utterance uses until the next ``config`` (``voice``,
  ``response_format`` = ``pcm`` | ``mulaw`` | ``alaw``, ``sample_rate``, ``language``, ``instruct``,
  ``seed``, sampling...; the request schema checks them) plus ``frame_ms`` (e.g. 20: audio is sent in
  frames of exactly that length, as telephony transports expect; the last frame of an utterance is
  padded with silence), ``text_mode`` and ``framing``. Required before the first text. A bad field (an
  unknown voice too) is refused at once, naming it, and the text after it is dropped (no error
  each) until a config is taken.
  ``framing`` ``twilio`` (with the call's ``stream_sid``) sends what a Twilio Media Streams bridge
  forwards to Twilio unchanged: each 20 ms frame of 8 kHz mu-law as ``{"event": "media",
  "streamSid", "media": {"payload": base64}}``, a mark's echo as ``{"event": "mark", "streamSid",
  "mark": {"name"}}`` (Twilio echoes it again once that audio has played) and, on ``clear``,
  ``{"event": "clear", "streamSid"}`` before ``cleared``; voxcast's own events keep their ``type``.
  ``framing`` ``audiosocket`` sends each 20 ms frame of 8 kHz 16-bit PCM as one binary message in
  Asterisk AudioSocket's own framing (kind ``0x10``, a big-endian 16-bit length, 320 bytes of audio),
  so a bridge writes the messages to the call's AudioSocket TCP connection unchanged.
- ``text`` (``{"type": "text", "text": "..."}``): a delta, any size, split anywhere (inside words and
  multi-byte characters too). With ``text_mode`` ``words`` (the default) the deltas up to the next
  ``flush`` are one utterance fed to the model as they arrive (``Service.open``): audio starts once
  the first word is complete, and with a seed it equals the utterance's text sent whole (with
  ``non_streaming_text``, a layout that needs whole text, the utterance goes sentence by sentence).
  With ``sentences`` every complete sentence is its own request, spoken as soon as the text after it
  starts.
- ``flush``: the utterance's text is complete (words), or speak what is buffered now, complete
  sentence or not (sentences).
- ``mark`` (``{"type": "mark", "name": ...}``): echoed back once all audio of the text before it was sent.
- ``clear`` (or ``cancel``): barge-in. The sentence being spoken stops within one frame, queued text
  is dropped, ``{"type": "cleared"}`` answers. The connection stays open for the next utterance.
- ``close``: speak what is left, answer ``{"type": "closed"}`` and close the connection.

Server -> client: binary messages carry the audio (raw bytes in the configured format); JSON events
are ``started`` (an utterance or sentence begins: ``segment``, ``request_id``, ``chars``, None for an
utterance whose text is still arriving), ``chunk`` (``segment``,
``seq``, ``bytes``, ``t_ms``, ``frames``; sent before that chunk's binary frames), ``segment_done``
(``segment``, ``timing``; with ``word_timestamps`` in the config, ``words``: each word's
``word``, ``start_ms``, ``end_ms`` from the segment's first audio byte, ``start_char``, ``end_char``),
``mark``, ``cleared``, ``closed`` and ``error`` (``{"error": {"message",
"type", "param", "code"}}``: the connection goes on; a bad sentence is skipped). When the server
stops, a connection still open at the drain deadline gets an ``error`` of code ``shutdown`` and is
closed with code 1001 (going away).

Past capacity (admission control, ``VOXCAST_ADMISSION``) a **turn** is refused whole or not at all: the
text from one ``flush``, ``mark``, ``clear`` or ``config`` to the next (or to a pause of more than
``VOXCAST_TEXT_WAIT_S``). Its first utterance or sentence
may get an ``error`` of code ``over_capacity`` with ``retry_after_s``; then the rest of that turn's text
is dropped without another error (never the middle of a reply without its start), and the client may
send the turn again after ``retry_after_s``. Once a turn has started speaking, its later utterances and
sentences are never refused.

Segments (utterances or sentences) are spoken one after another with the same voice, settings and
seed. An utterance that gets no text for ``VOXCAST_TEXT_WAIT_S`` is taken as complete; text after
that starts a new one, as does text after the utterance's audio ended on its own (its ``max_frames``,
end of speech, an error).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from voxcast.audio.formats import AudioFormat
from voxcast.engine.request import MAX_TEXT_CHARS, parse_request
from voxcast.errors import InvalidRequest, OverCapacity, VoxcastError
from voxcast.logs import set_request_id
from voxcast.service import EncodedChunk, Service, ServiceStream
from voxcast.serving.drain import Drain, WorkerShutdown
from voxcast.serving.http.sockets import (
    encode_event,
    error_event,
    is_unicode,
    receive_object,
    takes_text,
)
from voxcast.serving.pump import ThreadPump
from voxcast.text.incremental import SentenceBuffer

__all__ = ["SpeechSocket"]

log = logging.getLogger(__name__)

_RAW = {AudioFormat.PCM: (2, b"\x00"), AudioFormat.MULAW: (1, b"\xff"), AudioFormat.ALAW: (1, b"\xd5")}
"""Formats a socket streams: bytes per sample and the silence byte that pads a fixed frame."""

_MAX_BUFFER_CHARS = 20_000
"""Unspoken text one connection may hold, buffered and queued (beyond: an error, not unbounded memory)."""
_MAX_MARKS = 1000
"""Marks one connection may have waiting."""
_MAX_MARK_NAME = 256
"""Longest mark name (characters of its JSON form)."""
_STALL_S = 10.0
"""A client that leaves its audio unread this long (the socket's buffers full) is disconnected."""


_TEXT_MODES = ("words", "sentences")
_FRAMINGS = ("raw", "twilio", "audiosocket")
_AUDIOSOCKET_SLIN = b"\x10"
"""Asterisk AudioSocket's kind byte of 16-bit 8 kHz mono little-endian audio."""
_SOCKET_FIELDS = ("type", "frame_ms", "text_mode", "framing", "stream_sid")
"""Config fields of the socket itself (the rest are request fields)."""


@dataclass
class _Segment:
    """A sentence (its text) or an utterance whose text arrives in pieces (its open ``stream``);
    ``chars``: its text's length (an utterance's grows as it arrives)."""

    text: str
    epoch: int
    config: dict[str, Any]
    framer: _Framer
    turn: int
    stream: ServiceStream | None = None
    chars: int = 0
    taken: bool = False
    admitted: bool = False  # its first audio came: the engine took it


@dataclass
class _Mark:
    name: Any
    epoch: int


class _Framer:
    """Re-cuts a byte stream into frames of exactly ``size`` bytes (``size`` 0: passes it through),
    and wraps each frame and mark as its framing sends them: raw (binary messages, voxcast's
    ``mark`` event) or Twilio Media Streams (``stream_sid`` set: JSON ``media`` and ``mark`` events
    a bridge forwards to Twilio unchanged)."""

    def __init__(
        self, size: int, silence: bytes, stream_sid: str | None = None, audiosocket: bool = False
    ) -> None:
        self.size, self.silence, self.rest = size, silence, b""
        self.stream_sid = stream_sid
        self.audiosocket = audiosocket

    def message(self, frame: bytes) -> dict[str, Any] | bytes:
        """What one frame is sent as."""
        if self.audiosocket:  # kind, big-endian length, payload: what AudioSocket's TCP stream carries
            return _AUDIOSOCKET_SLIN + len(frame).to_bytes(2, "big") + frame
        if self.stream_sid is None:
            return frame
        payload = base64.b64encode(frame).decode("ascii")
        return {"event": "media", "streamSid": self.stream_sid, "media": {"payload": payload}}

    def mark(self, name: Any) -> dict[str, Any]:
        """The echo of a client's mark, after the audio before it."""
        if self.stream_sid is None:
            return {"type": "mark", "name": name}
        return {"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}}

    def feed(self, data: bytes) -> list[bytes]:
        if not self.size:
            return [data] if data else []
        data = self.rest + data
        n = len(data) // self.size * self.size
        self.rest = data[n:]
        return [data[i : i + self.size] for i in range(0, n, self.size)]

    def finish(self) -> list[bytes]:
        """The partial frame left, padded with silence (nothing when none is left)."""
        if not self.rest:
            return []
        out, self.rest = self.rest + self.silence * (self.size - len(self.rest)), b""
        return [out]

    def drop(self) -> None:
        self.rest = b""


def _full(seg: _Segment, more: int) -> bool:
    """Whether the utterance ``seg`` takes no more text: its stream takes none
    (:func:`~voxcast.serving.http.sockets.takes_text`), or ``more`` characters would make it longer
    than a request may be."""
    stream = seg.stream
    if stream is None:
        return False
    return not takes_text(stream) or seg.chars + more > MAX_TEXT_CHARS


class SpeechSocket:
    """One connection: a receiver (client messages) and a speaker (sentences in order) task."""

    def __init__(
        self, ws: WebSocket, service: Service, *, queue_chunks: int, drain: Drain | None = None
    ) -> None:
        self.ws = ws
        self.drain = drain
        self.service = service
        self.queue_chunks = queue_chunks
        self.config: dict[str, Any] | None = None
        #: The last config was refused (its error said why): text is dropped until one is taken.
        self.config_refused = False
        self.text_mode = "words"
        self.open: _Segment | None = None  # the utterance taking text (text_mode "words")
        self.framer = _Framer(0, b"")
        self.buffer = SentenceBuffer()
        self.epoch = 0
        self.turn = 0  # the turn taking text: a flush, mark, clear or config ends it
        self.admitted_turn = -1  # the last turn with a segment admitted: the rest of it is not refusable
        self.refused_turn = -1  # the last turn refused: the rest of its text is dropped
        self.last_text_t: float | None = None  # loop time of the last text (a long pause ends a turn)
        self.segments = 0
        self.queue: asyncio.Queue[_Segment | _Mark | None] = asyncio.Queue()
        self.queued_chars = 0
        #: A delta past ``_MAX_BUFFER_CHARS`` was refused (one error): deltas are dropped until a flush or clear.
        self.over_limit = False
        self.marks = 0
        self.current: ServiceStream | None = None
        self._out = self.framer  # the framer of the audio being sent (a config changes it in order)
        self._send_lock = asyncio.Lock()
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def send(self, event: dict[str, Any] | bytes) -> None:
        async with self._send_lock:
            if isinstance(event, bytes):
                await self.ws.send_bytes(event)
            else:
                await self.ws.send_text(encode_event(event))

    async def run(self) -> None:
        """Serve the connection until ``close`` (after the audio), a disconnect or a stall."""
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        speaker = asyncio.create_task(self._speak())
        closed = False
        tracked = self.drain.track(self._shutdown) if self.drain is not None else contextlib.nullcontext()
        with tracked:  # until the last audio went out: a draining server waits for it
            try:
                with contextlib.suppress(WebSocketDisconnect):
                    closed = await self._receive()
            finally:
                if not closed:  # the client went away (or stopped reading): stop speaking now
                    self.epoch += 1
                    self._stop_current()
                    speaker.cancel()
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, RuntimeError, OSError):
                await speaker

    # -- client messages -------------------------------------------------------------------------
    async def _receive(self) -> bool:
        """Handle client messages until ``close`` (True) or a disconnect (WebSocketDisconnect)."""
        while True:
            try:
                if await self._handle(await receive_object(self.ws, self.service.metrics)):
                    return True
            except VoxcastError as e:
                await self.send(error_event(e))

    async def _handle(self, msg: dict[str, Any]) -> bool:
        """Act on one message; True after ``close``."""
        kind = msg.get("type")
        if kind == "config":
            if self.refused_turn == self.turn:
                self.buffer.clear()  # a refused turn's partial sentence is not spoken with the next
            self.config_refused = True  # until it is taken
            await self._configure(msg)
            self.config_refused = False
        elif kind == "text":
            text = msg.get("text")
            if not isinstance(text, str):
                raise InvalidRequest("text must be a string", field="text")
            if not is_unicode(text):
                raise InvalidRequest("text contains invalid Unicode (a lone surrogate)", field="text")
            if self.config_refused:
                return False  # not spoken in settings nobody asked for, nor an error per token
            if self.config is None:
                raise InvalidRequest("send a config message before text", field="type")
            if self.over_limit:
                return False  # one error said so; a flood of deltas gets no error (nor log line) each
            if len(self.buffer) + self.queued_chars + len(text) > _MAX_BUFFER_CHARS:
                self.over_limit = True
                raise InvalidRequest(
                    f"more than {_MAX_BUFFER_CHARS} characters unspoken; wait for the audio", field="text"
                )
            now = asyncio.get_running_loop().time()
            if self.last_text_t is not None and now - self.last_text_t > self._text_wait_s:
                self.turn += 1  # as long a pause as ends an utterance ends its turn
            self.last_text_t = now
            if self.refused_turn == self.turn:
                return False  # the turn was refused: none of its text is spoken (one error said so)
            if self.text_mode == "words":
                await self._push_words(text)
            else:
                await self._queue_sentences(final=False, delta=text)
        elif kind == "flush":
            self.over_limit = False  # the limit applies afresh
            await self._queue_sentences(final=True)
        elif kind == "mark":  # the text before it is spoken first, whole sentence or not
            name = msg.get("name")
            if len(json.dumps(name)) > _MAX_MARK_NAME:
                raise InvalidRequest(f"a mark name is at most {_MAX_MARK_NAME} characters", field="name")
            if self.marks >= _MAX_MARKS:
                raise InvalidRequest(f"more than {_MAX_MARKS} marks waiting", field="type")
            await self._queue_sentences(final=True)
            self.marks += 1
            await self.queue.put(_Mark(name, self.epoch))
        elif kind in ("clear", "cancel"):
            self.epoch += 1
            self.over_limit = False
            self.buffer.clear()
            if self.open is not None and self.open.stream is not None:
                self.open.stream.cancel()
            self.open = None
            while not self.queue.empty():
                self._took(self.queue.get_nowait())
            self._stop_current()
            self._out.drop()
            if self._out.stream_sid is not None:  # forwarded to Twilio: it drops the audio it holds
                await self.send({"event": "clear", "streamSid": self._out.stream_sid})
            await self.send({"type": "cleared"})
        elif kind == "close":
            await self._queue_sentences(final=True)
            await self.queue.put(None)
            return True
        else:
            raise InvalidRequest(
                "type must be config, text, flush, mark, clear, cancel or close", field="type"
            )
        if kind != "text":  # after what the message queued: the next text starts a new turn
            self.turn += 1
        return False

    async def _configure(self, msg: dict[str, Any]) -> None:
        fields = {k: v for k, v in msg.items() if k not in _SOCKET_FIELDS}
        framing = msg.get("framing", "raw")
        if framing not in _FRAMINGS:
            raise InvalidRequest("framing must be raw, twilio or audiosocket", field="framing")
        stream_sid = None
        if framing == "twilio":  # Twilio Media Streams: 8 kHz mu-law in 20 ms frames, JSON events
            stream_sid = msg.get("stream_sid")
            if not isinstance(stream_sid, str) or not 0 < len(stream_sid) <= 128:
                raise InvalidRequest(
                    "framing twilio needs the call's stream_sid (a string)", field="stream_sid"
                )
            if not is_unicode(stream_sid):
                raise InvalidRequest(
                    "stream_sid contains invalid Unicode (a lone surrogate)", field="stream_sid"
                )
            fields.setdefault("response_format", "mulaw")
            msg = {"frame_ms": 20, **msg}
            if fields["response_format"] != "mulaw" or fields.get("sample_rate", 8000) != 8000:
                raise InvalidRequest(
                    "framing twilio sends 8 kHz mu-law: response_format mulaw, sample_rate 8000",
                    field="response_format" if fields["response_format"] != "mulaw" else "sample_rate",
                )
        if framing == "audiosocket":  # Asterisk AudioSocket: 8 kHz 16-bit PCM, each frame with its header
            fields = {"response_format": "pcm", "sample_rate": 8000, **fields}
            msg = {"frame_ms": 20, **msg}
            if fields["response_format"] != "pcm" or fields["sample_rate"] != 8000:
                raise InvalidRequest(
                    "framing audiosocket sends 8 kHz 16-bit PCM: response_format pcm, sample_rate 8000",
                    field="response_format" if fields["response_format"] != "pcm" else "sample_rate",
                )
            if msg["frame_ms"] == 0:
                raise InvalidRequest("framing audiosocket needs frame_ms (20 is usual)", field="frame_ms")
        fields.setdefault("response_format", "pcm")
        fmt = str(fields["response_format"])
        if fmt not in {f.value for f in _RAW}:
            raise InvalidRequest(
                "response_format must be pcm, mulaw or alaw on a socket", field="response_format"
            )
        frame_ms = msg.get("frame_ms", 0)
        if isinstance(frame_ms, bool) or not isinstance(frame_ms, int) or not 0 <= frame_ms <= 1000:
            raise InvalidRequest("frame_ms must be an integer from 0 (off) to 1000", field="frame_ms")
        text_mode = msg.get("text_mode", "words")
        if text_mode not in _TEXT_MODES:
            raise InvalidRequest("text_mode must be words or sentences", field="text_mode")
        # the request schema checks every other field now, with a placeholder text
        parsed = parse_request({**fields, "text": "x"})
        # an unknown voice is refused now, not at the first text (a voice id may be read from storage)
        await asyncio.to_thread(self.service.check_voice, parsed)
        width, silence = _RAW[AudioFormat(fmt)]
        size = parsed.sample_rate * frame_ms // 1000 * width
        self._close_utterance()  # an utterance under way keeps its settings and ends here
        self.framer = _Framer(size, silence, stream_sid, audiosocket=framing == "audiosocket")
        self.config = fields
        self.text_mode = text_mode

    async def _push_words(self, text: str) -> None:
        """Feed a delta to the utterance under way, opening one (queued in order) when none is."""
        if len(text) > MAX_TEXT_CHARS:  # more than any utterance takes: refused before one opens
            raise InvalidRequest(
                f"a text message has at most {MAX_TEXT_CHARS} characters (got {len(text)})", field="text"
            )
        seg = self.open
        if seg is not None and _full(seg, len(text)):
            self._close_utterance()  # a new one
            seg = None
        if seg is None or seg.epoch != self.epoch:
            assert self.config is not None
            stream = self.service.open(self.config, entry="websocket")  # refusable: set as it starts
            seg = self.open = _Segment("", self.epoch, dict(self.config), self.framer, self.turn, stream)
            await self.queue.put(seg)
        assert seg.stream is not None
        seg.stream.push(text)
        seg.chars += len(text)
        if not seg.taken:
            self.queued_chars += len(text)

    def _close_utterance(self) -> None:
        """The utterance under way has all its text (flush, mark, close, a new config)."""
        seg, self.open = self.open, None
        if seg is not None and seg.stream is not None:
            seg.stream.close_text()

    async def _queue_sentences(self, final: bool, delta: str = "") -> None:
        if final:
            self._close_utterance()
        pieces = self.buffer.flush() if final else self.buffer.push(delta)
        assert self.config is not None or not pieces
        for piece in pieces:
            self.queued_chars += len(piece)
            await self.queue.put(
                _Segment(piece, self.epoch, dict(self.config or {}), self.framer, self.turn, chars=len(piece))
            )

    def _took(self, item: _Segment | _Mark | None) -> None:
        """An item left the queue: what it held no longer counts against the limits."""
        if isinstance(item, _Segment):
            self.queued_chars -= item.chars
            item.taken = True
        elif isinstance(item, _Mark):
            self.marks -= 1

    def _stop_current(self) -> None:
        if self.current is not None:
            self.current.cancel()

    # -- speaking --------------------------------------------------------------------------------
    async def _flush_frames(self) -> None:
        """The partial frame left of the audio sent so far, padded (fixed framing only)."""
        for frame in self._out.finish():
            await self.send(self._out.message(frame))

    async def _speak(self) -> None:
        while True:
            item = await self.queue.get()
            self._took(item)
            if item is None:
                await self._flush_frames()
                await self.send({"type": "closed", "segments": self.segments})
                await self.ws.close()
                return
            if item.epoch != self.epoch:
                continue  # cleared while queued
            if isinstance(item, _Mark):
                await self._flush_frames()  # all audio before the mark, its last frame included
                await self.send(self._out.mark(item.name))
                continue
            if item.framer is not self._out:  # a new config: the old framing ends first
                await self._flush_frames()
                self._out = item.framer
            try:
                await self._segment(item)
            except (asyncio.CancelledError, WebSocketDisconnect):
                raise
            except Exception as e:  # reported; the connection goes on
                log.exception("websocket sentence failed")
                await self.send({**error_event(e), "segment": self.segments - 1})
            if self.queue.empty() and item.epoch == self.epoch:
                await self._flush_frames()  # idle: the utterance's last frame goes out now

    def _shutdown(self, reason: str) -> None:
        """On the drain's thread, at its deadline: stop speaking, say why, close with 1001."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._close_for_shutdown(reason)))

    async def _close_for_shutdown(self, reason: str) -> None:
        self.epoch += 1
        self._stop_current()
        log.warning("websocket: %s; closing it", reason)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self.send(error_event(WorkerShutdown(reason)))
            await self.ws.close(code=1001, reason="server shutting down")

    def _stalled(self, stream: ServiceStream) -> None:
        """On the pump's thread: the client stopped reading. Stop the sentence and the connection."""
        stream.cancel()
        task, loop = self._task, self._loop
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    @property
    def _text_wait_s(self) -> float:
        return float(self.service.engine.config.text_wait_s)

    def _failed(self, item: _Segment, e: VoxcastError) -> None:
        """A segment failed; refused before any audio, its turn is refused: the rest is dropped."""
        if isinstance(e, OverCapacity) and not item.admitted:
            self.refused_turn = max(self.refused_turn, item.turn)

    async def _segment(self, item: _Segment) -> None:
        if item.turn == self.refused_turn:  # a later utterance or sentence of a refused turn
            if item.stream is not None:
                item.stream.cancel()
            return  # dropped with it (its error was sent)
        segment = self.segments
        self.segments += 1
        stream = item.stream
        if stream is not None:  # opened as its text began; refusable or not is decided now, as it starts
            stream.refusable = item.turn != self.admitted_turn
        else:
            try:
                stream = self.service.synthesize(
                    {**item.config, "text": item.text},
                    entry="websocket",
                    refusable=item.turn != self.admitted_turn,  # a turn under way is never refused
                )
            except VoxcastError as e:
                self._failed(item, e)
                await self.send({**error_event(e), "segment": segment})
                return
        self.current = stream
        set_request_id(stream.request_id)  # the speaker task's lines name the sentence being spoken
        pump: ThreadPump[EncodedChunk] = ThreadPump(
            stream,
            maxsize=self.queue_chunks,
            name=f"voxcast-ws-{stream.request_id[:12]}",
            stall_s=_STALL_S,
            on_stall=lambda: self._stalled(stream),
        ).start()
        try:
            await self.send(
                {
                    "type": "started",
                    "segment": segment,
                    "request_id": stream.request_id,
                    "chars": len(item.text) if item.stream is None else None,
                }
            )
            async for chunk in pump:
                if not item.admitted:
                    item.admitted = True
                    self.admitted_turn = max(self.admitted_turn, item.turn)
                if item.epoch != self.epoch:
                    break
                frames = self._out.feed(chunk.data)
                await self.send(
                    {
                        "type": "chunk",
                        "segment": segment,
                        "seq": chunk.seq,
                        "bytes": len(chunk.data),
                        "t_ms": round(chunk.t_ms, 1),
                        "frames": chunk.frames,
                    }
                )
                for frame in frames:
                    if item.epoch != self.epoch:  # nothing of a cleared sentence after "cleared"
                        break
                    await self.send(self._out.message(frame))
        except VoxcastError as e:
            self._failed(item, e)
            await self.send({**error_event(e), "segment": segment})
            return
        finally:
            if not pump.finished:
                stream.cancel()
            pump.close()
            self.current = None
        if item.epoch == self.epoch:
            result = stream.result
            timing = result.timing.to_dict() if result is not None else None
            done: dict[str, Any] = {"type": "segment_done", "segment": segment, "timing": timing}
            if result is not None and result.words is not None:
                done["words"] = result.words  # ms from this segment's first audio
            await self.send(done)
