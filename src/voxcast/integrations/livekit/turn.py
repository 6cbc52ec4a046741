"""One reply on one WebSocket connection: its text in, its audio and timed words out to LiveKit's
``AudioEmitter``, a refusal past capacity waited out, and the connection left clean for the next."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from livekit.agents import APIConnectionError, APIStatusError, APITimeoutError, tts, utils
from livekit.agents.types import TimedString

from voxcast.integrations.client import error_text, unspaced

__all__ = ["Connection", "Turn", "settle"]

log = logging.getLogger(__name__)

_SETTLE_S = 5.0
"""How long an interrupted connection may take to answer ``clear`` before it is closed instead."""

_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
}
"""The HTTP status of an error event's ``type`` (the rest: 5xx, which LiveKit may retry)."""

_UNAVAILABLE = frozenset({"over_capacity", "engine_unavailable", "shutdown"})
"""Error codes of a server that cannot take the reply now (503)."""


@dataclass(eq=False)
class Connection:
    """A WebSocket to the server's ``/v1/audio/speech/stream`` (pooled: replies take turns on it)."""

    ws: aiohttp.ClientWebSocketResponse
    config: dict[str, Any] | None = None  # the config the server took last (sent again only on change)
    marks: int = 0  # marks sent (their names)

    async def send(self, message: dict[str, Any]) -> None:
        """Raises: APIConnectionError: the connection closed (LiveKit retries before any audio)."""
        try:
            await self.ws.send_str(json.dumps(message))
        except (aiohttp.ClientError, ConnectionError) as e:
            raise APIConnectionError("voxcast: the connection closed") from e

    async def close(self) -> None:
        await self.ws.close()


async def settle(conn: Connection) -> bool:
    """After an interruption: ``clear`` (the server stops within one frame and drops the reply's
    text), then read until its ``cleared`` answer, so the next reply on the connection gets none of
    the cleared one's audio. False: the connection did not answer and is no use."""
    conn.config = None  # a reply cut off mid-config must not be taken for a config the server has
    try:
        async with asyncio.timeout(_SETTLE_S):
            await conn.send({"type": "clear"})
            while True:
                msg = await conn.ws.receive()
                if msg.type is aiohttp.WSMsgType.TEXT and json.loads(msg.data).get("type") == "cleared":
                    return True
                if msg.type is not aiohttp.WSMsgType.BINARY and msg.type is not aiohttp.WSMsgType.TEXT:
                    return False
    except (TimeoutError, APIConnectionError, aiohttp.ClientError, ConnectionError, ValueError) as e:
        log.debug("voxcast: an interrupted connection did not answer clear: %s", e)
        return False


def _api_error(event: dict[str, Any], retryable: bool | None = None) -> APIStatusError:
    """The framework's error for a server ``error`` event: 4xx are never retried, 5xx may be."""
    error = event.get("error") or {}
    code = error.get("code")
    status = 503 if code in _UNAVAILABLE else _STATUS.get(str(error.get("type")), 500)
    return APIStatusError(
        f"voxcast: {error_text(error)}", status_code=status, body=event, retryable=retryable
    )


@dataclass(eq=False)
class Turn:
    """One reply (one ``mark``-ended turn on the server): text pushed as it comes, audio and words
    out until the mark's echo, which follows the reply's last audio.

    Past capacity the server refuses the turn whole before any of its audio (``over_capacity``,
    ``retry_after_s``) and drops the rest of its text. The turn then clears the connection, holds
    the text that keeps coming, and after ``retry_after_s`` sends all of it again, for up to
    ``capacity_wait_s`` in all; beyond, or once audio came, the refusal is a 503 that LiveKit does
    not retry (a ``FallbackAdapter`` can move on).
    """

    conn: Connection
    config: dict[str, Any]
    emitter: tts.AudioEmitter
    sample_rate: int
    capacity_wait_s: float
    timeout_s: float  # the longest quiet spell once the text is complete
    streaming: bool = True  # the emitter takes segments (SynthesizeStream), or is one (ChunkedStream)
    texts: list[str] = field(default_factory=list)  # as sent: all sent again after a refusal
    complete: bool = False  # all the reply's text is in
    heard: int = 0  # bytes of audio received
    mark: str | None = None  # the mark whose echo ends it
    _held: float | None = None  # refused: wait this long once the server has cleared, then send again
    _waited_s: float = 0.0
    _clearing: bool = False  # "clear" sent, "cleared" not yet received
    _at_s: float | None = None  # when the utterance under way starts, in s of the reply's audio
    _request_id: str | None = None  # the server's id of the utterance under way (for the log)
    _begun: asyncio.Event = field(default_factory=asyncio.Event)  # text sent, or none will be
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # keeps the messages in order

    async def push(self, text: str) -> None:
        """A piece of the reply, any size, split anywhere."""
        async with self._lock:
            if not self.texts:
                if self.streaming:
                    self.emitter.start_segment(segment_id=utils.shortuuid())
                if self.conn.config != self.config:
                    await self.conn.send(self.config)
                    self.conn.config = self.config
            self.texts.append(text)
            if self._held is None:
                await self.conn.send({"type": "text", "text": text})
            self._begun.set()

    async def end(self) -> None:
        """All the reply's text is in: a mark ends the turn on the server (idempotent)."""
        async with self._lock:
            if self.complete:
                return
            self.complete = True
            if self.texts and self._held is None:
                await self._send_mark()
            self._begun.set()

    async def _send_mark(self) -> None:
        self.conn.marks += 1
        self.mark = f"voxcast-livekit-{self.conn.marks}"
        await self.conn.send({"type": "mark", "name": self.mark})

    async def receive(self) -> None:
        """Audio into the emitter until the turn's mark comes back (at once for a reply with no text).

        Raises:
            APIConnectionError: the connection closed mid-reply (LiveKit retries it before any audio).
            APITimeoutError: nothing for ``timeout_s`` once the text was complete.
            APIStatusError: the server refused the reply (its error, with the field at fault).
        """
        await self._begun.wait()
        if not self.texts:
            return
        while True:
            msg = await self._next()
            if msg.type is aiohttp.WSMsgType.BINARY:
                if not self._clearing:
                    self.heard += len(msg.data)
                    self.emitter.push(msg.data)
            elif msg.type is aiohttp.WSMsgType.TEXT:
                if await self._event(json.loads(msg.data)):
                    break
            else:
                raise APIConnectionError(f"voxcast: the connection closed mid-reply ({msg.type.name})")
        if self.streaming:
            self.emitter.end_segment()

    async def _next(self) -> aiohttp.WSMessage:
        try:  # an LLM may pause for as long as it likes; a server with the whole text may not
            return await self.conn.ws.receive(timeout=self.timeout_s if self.complete else None)
        except TimeoutError as e:
            raise APITimeoutError(f"voxcast: no answer for {self.timeout_s} s") from e

    async def _event(self, event: dict[str, Any]) -> bool:
        """Act on a server event; True at the turn's mark."""
        kind = event.get("type")
        if kind == "cleared":
            self._clearing = False
            await self._send_again()
        elif self._clearing:  # the refused turn's last words
            return False
        elif kind == "started":  # its words count from the reply's first audio
            self._at_s = self.heard / (2 * self.sample_rate)
            self._request_id = event.get("request_id")
        elif kind == "segment_done":
            self._words(event.get("words"))
        elif kind == "mark":
            return event.get("name") == self.mark
        elif kind == "error":
            await self._error(event)
        return False

    def _words(self, words: Any) -> None:
        """An utterance's words, timed from the reply's first audio (its start plus each word's
        ``start_ms``), as text that joins back into the reply (CJK words without spaces)."""
        at, self._at_s = self._at_s, None
        if not words or at is None:
            return
        self.emitter.push_timed_transcript(
            [
                TimedString(
                    w["word"] if unspaced(w["word"]) else w["word"] + " ",
                    start_time=at + w["start_ms"] / 1000.0,
                    end_time=at + w["end_ms"] / 1000.0,
                )
                for w in words
            ]
        )

    async def _error(self, event: dict[str, Any]) -> None:
        error = event.get("error") or {}
        after = event.get("retry_after_s")
        delay = float(after) if isinstance(after, int | float) and not isinstance(after, bool) else 1.0
        if error.get("code") != "over_capacity":
            raise _api_error(event)
        if self.heard or self._waited_s + delay > self.capacity_wait_s:
            raise _api_error(event, retryable=False)  # waited long enough: another TTS, or an error
        log.info("voxcast %s: over capacity; the reply is sent again in %.1f s", self._request_id, delay)
        async with self._lock:
            self._held = delay
            self._clearing = True
            await self.conn.send({"type": "clear"})  # drops what the server still holds of the turn

    async def _send_again(self) -> None:
        """The server cleared the refused turn: after the wait, all its text so far as a new turn."""
        delay = self._held
        if delay is None:
            return
        await asyncio.sleep(delay)
        self._waited_s += delay
        async with self._lock:
            self._held = None
            await self.conn.send({"type": "text", "text": "".join(self.texts)})
            if self.complete:
                await self._send_mark()
