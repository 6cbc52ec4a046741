"""``TTS`` (LiveKit Agents' TTS over a voxcast server's WebSocket, its connections pooled) and its
``SynthesizeStream`` (a reply pushed as an LLM writes it) and ``ChunkedStream`` (a whole text)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectionError,
    APIConnectOptions,
    APIStatusError,
    NotGivenOr,
    tts,
    utils,
)

from voxcast.integrations.client import SAMPLE_RATES, language_name, socket_url
from voxcast.integrations.livekit.turn import Connection, Turn, settle

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream"]


@dataclass(frozen=True)
class _Options:
    """What every reply is asked with (a stream takes a copy when it starts)."""

    voice: str | None
    language: str | None
    instructions: str | None
    speed: float | None
    sample_rate: int
    word_timestamps: bool
    capacity_wait_s: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        """The socket's ``config``: the streaming-text layout (the audio of the whole text; ``extra``
        may say otherwise), ``extra``, raw 16-bit PCM at the output rate, the options that are set."""
        out: dict[str, Any] = {"type": "config", "text_mode": "words", "non_streaming_text": False}
        out.update(self.extra)
        out.update(response_format="pcm", sample_rate=self.sample_rate)
        named = {"voice": self.voice, "instruct": self.instructions, "speed": self.speed}
        named["language"] = language_name(self.language) if self.language else None
        out.update({k: v for k, v in named.items() if v is not None})
        if self.word_timestamps:
            out["word_timestamps"] = True
        return out


class TTS(tts.TTS):
    """Text to speech on a voxcast server (``voxcast serve``), streamed as an LLM writes.

    :meth:`stream` feeds a reply's text into one utterance on the server's WebSocket as it is
    pushed, so audio starts at its first complete word; :meth:`synthesize` speaks a whole text the
    same way (with a seed in ``extra``: the same bytes). Both give 16-bit mono PCM at
    ``sample_rate`` (resampled by the server) and, with ``word_timestamps``, each word's start and
    end (LiveKit's aligned transcript). Closing a stream mid-reply (an interruption) stops the
    server within one frame. Connections are pooled: a reply reuses an idle one (config sent only
    when it changed), one that failed is closed, and a refused or dropped reply is retried as
    LiveKit's ``APIConnectOptions`` say (before any of its audio).
    """

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        voice: str | None = None,
        language: str | None = None,
        instructions: str | None = None,
        speed: float | None = None,
        sample_rate: int = 24000,
        extra: Mapping[str, Any] | None = None,
        word_timestamps: bool = True,
        capacity_wait_s: float = 3.0,
        http_session: aiohttp.ClientSession | None = None,
    ) -> None:
        """
        Args:
            base_url: the server, without ``/v1``; ``http(s)`` becomes ``ws(s)``.
            api_key: its ``VOXCAST_API_KEY``, if it has one.
            voice: a speaker or a registered voice id; default: the server's (``VOXCAST_DEFAULT_VOICE``).
            language: a code (``en``, ``en-US``) or voxcast's name (``english``); default: the model's.
            instructions: how to speak (voxcast's ``instruct``; models that take it).
            speed: the speaking rate, 0.25-4.0 (pitch kept).
            sample_rate: output rate, one of :data:`voxcast.integrations.client.SAMPLE_RATES`.
            extra: more request fields for every reply (``seed``, ``temperature``, ...).
            word_timestamps: ask for each utterance's word times (LiveKit's aligned transcript).
            capacity_wait_s: how long a reply the server refused past capacity may wait in all
                before it is sent again (after each ``retry_after_s``); 0: fail at once.
            http_session: the aiohttp session to connect with; default: LiveKit's job session.

        Raises:
            ValueError: a ``sample_rate`` the server does not produce.
        """
        if sample_rate not in SAMPLE_RATES:
            raise ValueError(f"sample_rate: voxcast produces {SAMPLE_RATES} Hz, not {sample_rate}")
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=word_timestamps),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._opts = _Options(
            voice=voice,
            language=language,
            instructions=instructions,
            speed=speed,
            sample_rate=sample_rate,
            word_timestamps=word_timestamps,
            capacity_wait_s=max(0.0, capacity_wait_s),
            extra=dict(extra or {}),
        )
        self._url = socket_url(base_url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = http_session
        self._pool = utils.ConnectionPool[Connection](connect_cb=self._connect, close_cb=self._close)
        self._settling: set[asyncio.Task[None]] = set()

    @property
    def model(self) -> str:
        return "voxcast"

    @property
    def provider(self) -> str:
        return "voxcast"

    def update_options(
        self,
        *,
        voice: NotGivenOr[str | None] = NOT_GIVEN,
        language: NotGivenOr[str | None] = NOT_GIVEN,
        instructions: NotGivenOr[str | None] = NOT_GIVEN,
        speed: NotGivenOr[float | None] = NOT_GIVEN,
    ) -> None:
        """Change the options given (None: back to the server's default); from the next reply."""
        given: dict[str, Any] = {"voice": voice, "language": language, "instructions": instructions}
        given["speed"] = speed
        self._opts = dataclasses.replace(self._opts, **{k: v for k, v in given.items() if utils.is_given(v)})

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> tts.SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    def prewarm(self) -> None:
        """Open a connection now, so the first reply does not wait for one."""
        self._pool.prewarm()

    async def aclose(self) -> None:
        for task in list(self._settling):
            await utils.aio.cancel_and_wait(task)
        await self._pool.aclose()

    # -- connections -------------------------------------------------------------------------------
    async def _connect(self, timeout: float) -> Connection:
        session = self._session or utils.http_context.http_session()
        try:
            ws = await asyncio.wait_for(session.ws_connect(self._url, headers=self._headers), timeout)
        except aiohttp.WSServerHandshakeError as e:  # a wrong key: 403 before the socket opens
            raise APIStatusError(f"voxcast: {self._url} refused the connection", status_code=e.status) from e
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise APIConnectionError(f"voxcast: cannot connect to {self._url}") from e
        return Connection(ws)

    async def _close(self, conn: Connection) -> None:
        await conn.close()

    @contextlib.asynccontextmanager
    async def _connection(self, timeout: float) -> AsyncIterator[Connection]:
        """A connection for one reply: back to the pool after it; after an interruption once the
        server has cleared it; closed after an error."""
        conn = await self._pool.get(timeout=timeout)
        while conn.ws.closed:  # the server closed it while idle
            self._pool.remove(conn)
            conn = await self._pool.get(timeout=timeout)
        try:
            yield conn
        except asyncio.CancelledError:
            task = asyncio.create_task(self._settle(conn), name="voxcast-settle")
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
            raise
        except BaseException:
            self._pool.remove(conn)
            await conn.close()
            raise
        else:
            self._pool.put(conn)

    async def _settle(self, conn: Connection) -> None:
        clean = False
        try:
            clean = await settle(conn)
        finally:  # cancelled (the TTS is closing) or not answered: of no use to the next reply
            (self._pool.put if clean else self._pool.remove)(conn)
        if not clean:
            await conn.close()

    def _turn(self, conn: Connection, opts: _Options, emitter: tts.AudioEmitter, **kw: Any) -> Turn:
        return Turn(conn, opts.config(), emitter, opts.sample_rate, opts.capacity_wait_s, **kw)


class ChunkedStream(tts.ChunkedStream):
    """A whole text, spoken as one reply on the socket (the same audio as a stream of it)."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts
        self._opts = tts._opts

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._opts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
        )
        if not self._input_text.strip():
            return
        async with self._tts._connection(self._conn_options.timeout) as conn:
            turn = self._tts._turn(
                conn, self._opts, output_emitter, timeout_s=self._conn_options.timeout, streaming=False
            )
            await turn.push(self._input_text)
            await turn.end()
            await turn.receive()


class SynthesizeStream(tts.SynthesizeStream):
    """A reply whose text is pushed as an LLM writes it (``push_text``), ended by ``flush`` or
    ``end_input``: one utterance on the server, fed piece by piece; its audio is one segment.
    ``aclose`` mid-reply is an interruption: the server stops within one frame."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self._opts = tts._opts  # options changed later apply from the next reply

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        output_emitter.initialize(
            request_id=utils.shortuuid(),
            sample_rate=self._opts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        async with self._tts._connection(self._conn_options.timeout) as conn:
            turn = self._tts._turn(conn, self._opts, output_emitter, timeout_s=self._conn_options.timeout)
            tasks = [asyncio.create_task(self._forward(turn)), asyncio.create_task(turn.receive())]
            try:
                await asyncio.gather(*tasks)
            finally:
                await utils.aio.cancel_and_wait(*tasks)

    async def _forward(self, turn: Turn) -> None:
        """The pushed text into the turn until its first flush or the input's end (LiveKit speaks
        one reply a stream: it drops text pushed after a flush)."""
        lead = ""  # whitespace before the first word: no reply yet (one of only spaces is none)
        async for data in self._input_ch:
            if isinstance(data, self._FlushSentinel):
                if turn.texts:
                    break
                continue
            if not turn.texts and not (lead + data).strip():
                lead += data
                continue
            self._mark_started()
            await turn.push(lead + data)
            lead = ""
        await turn.end()
