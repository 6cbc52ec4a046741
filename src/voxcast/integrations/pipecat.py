"""A Pipecat TTS service that speaks through a voxcast HTTP server (``pip install "voxcast[pipecat]"``).

::

    from voxcast.integrations.pipecat import VoxcastTTSService

    tts = VoxcastTTSService(base_url="http://127.0.0.1:8000", api_key=None,
                            settings=VoxcastTTSService.Settings(voice="ryan"))
    pipeline = Pipeline([transport.input(), stt, llm, tts, transport.output()])

Each sentence Pipecat hands over is one streamed ``POST /v1/audio/speech`` (raw 16-bit PCM at the
pipeline's output rate, resampled by the server), so audio frames reach the pipeline as the server
generates them. An interruption cancels the running request: the connection is closed and the server
stops generating within one frame. TTFB and usage metrics are reported as Pipecat expects. voxcast's
own request fields (``seed``, ``language``, sampling, ...) go in ``extra``.

:class:`VoxcastWebsocketTTSService` speaks the LLM's tokens as they come instead: Pipecat's ``TOKEN``
text aggregation feeds one reply (a turn) into one utterance of the server's WebSocket
(``/v1/audio/speech/stream``, ``text_mode`` ``words``), so audio starts at the reply's first complete
word rather than its first sentence, and with a seed it is the audio of the whole reply at once. An
interruption sends ``clear``: the server stops within one frame and drops the rest.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pipecat.frames.frames import EndFrame, ErrorFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService, WebsocketTTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.types import NOT_GIVEN, NotGiven

__all__ = ["VoxcastTTSService", "VoxcastTTSSettings", "VoxcastWebsocketTTSService"]

log = logging.getLogger(__name__)

#: Output rates the server produces (it resamples from the model's 24 kHz).
SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)

_LANGUAGES = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "fr": "french",
    "it": "italian",
    "ja": "japanese",
    "ko": "korean",
    "pt": "portuguese",
    "ru": "russian",
}


@dataclass
class VoxcastTTSSettings(TTSSettings):
    """Runtime-updatable settings: ``voice`` (a speaker or a registered voice id), ``language``,
    ``model`` (any name; one model per server), ``instructions`` (voxcast's ``instruct``) and
    ``speed`` (the speaking rate, 0.25-4.0, pitch kept)."""

    instructions: str | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    speed: float | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)


def _settings_store(settings: VoxcastTTSSettings | None) -> VoxcastTTSSettings:
    """The defaults (speaker ``ryan``) updated with the caller's settings."""
    store = VoxcastTTSSettings(model="voxcast", voice="ryan", language=None, instructions=None, speed=None)
    if settings is not None:
        store.apply_update(settings)
    return store


def _language(language: Language) -> str:
    """Pipecat's language codes -> voxcast's names (``en-US`` -> ``english``); others: ``auto``."""
    return _LANGUAGES.get(str(Language(language).value).split("-")[0].lower(), "auto")


def _voice_fields(settings: VoxcastTTSSettings, instruct: str) -> dict[str, Any]:
    """The settings that are set, as request fields (``instructions`` named ``instruct``)."""
    out = {}
    for name in ("voice", "language", "instructions", "speed"):
        value = getattr(settings, name)
        if value is not None and value is not NOT_GIVEN:
            out[instruct if name == "instructions" else name] = value
    return out


def _error_text(error: Mapping[str, Any]) -> str:
    """An OpenAI-style error object, naming its field."""
    return f"{error.get('param') or 'request'}: {error.get('message')}"


def _check_rate(sample_rate: int) -> None:
    if sample_rate not in SAMPLE_RATES:
        raise ValueError(f"voxcast produces {SAMPLE_RATES} Hz, not {sample_rate}")


class VoxcastTTSService(TTSService):
    """Text to speech on a voxcast server (see the module docstring)."""

    Settings = VoxcastTTSSettings
    _settings: VoxcastTTSSettings

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        sample_rate: int | None = None,
        extra: Mapping[str, Any] | None = None,
        session: aiohttp.ClientSession | None = None,
        settings: VoxcastTTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            base_url: the server (``voxcast serve``), without ``/v1``.
            api_key: its ``VOXCAST_API_KEY``, if it has one.
            sample_rate: output rate; default: the pipeline's ``audio_out_sample_rate``.
            extra: more request fields sent with every sentence (``seed``, ``temperature``, ...).
            session: an aiohttp session to share; default: one of its own.
            settings: voice, language, instructions (updatable while the pipeline runs).
        """
        super().__init__(
            sample_rate=sample_rate,
            push_start_frame=True,
            push_stop_frames=True,
            settings=_settings_store(settings),
            **kwargs,
        )
        self._url = base_url.rstrip("/") + "/v1/audio/speech"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._extra = dict(extra or {})
        self._session = session
        self._own_session = session is None

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        return _language(language)

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        _check_rate(self.sample_rate)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))

    async def _close_session(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def stop(self, frame: Any) -> None:
        await super().stop(frame)
        await self._close_session()

    async def cancel(self, frame: Any) -> None:
        await super().cancel(frame)
        await self._close_session()

    def _body(self, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            **self._extra,
            "input": text,
            "response_format": "pcm",
            "sample_rate": self.sample_rate,
        }
        return {**body, **_voice_fields(self._settings, "instructions")}

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """One sentence: stream its audio as the server generates it."""
        assert self._session is not None, "start() first"
        async with self._session.post(self._url, json=self._body(text), headers=self._headers) as r:
            if r.status != 200:
                try:
                    message = _error_text((await r.json())["error"])
                except (aiohttp.ContentTypeError, KeyError, TypeError, ValueError):
                    message = await r.text()
                yield ErrorFrame(error=f"voxcast {r.status}: {message}")
                return
            await self.start_tts_usage_metrics(text)
            rest = b""
            async for data in r.content.iter_any():
                data = rest + data
                cut = len(data) - len(data) % 2  # whole 16-bit samples only
                data, rest = data[:cut], data[cut:]
                if data:
                    await self.stop_ttfb_metrics()
                    yield TTSAudioRawFrame(data, self.sample_rate, 1, context_id=context_id)


class VoxcastWebsocketTTSService(WebsocketTTSService):
    """Text to speech on a voxcast server's WebSocket, token by token (see the module docstring).

    The server speaks utterances in order on one connection; each Pipecat turn is one utterance, so
    the events are matched to turns in the order the turns were opened (``started`` takes the next
    one; ``clear`` drops them all, and what the server sends before its ``cleared`` answer belongs to
    the cleared speech).
    """

    Settings = VoxcastTTSSettings
    _settings: VoxcastTTSSettings

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        sample_rate: int | None = None,
        extra: Mapping[str, Any] | None = None,
        settings: VoxcastTTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            base_url: the server (``voxcast serve``), without ``/v1``; ``http(s)`` becomes ``ws(s)``.
            api_key: its ``VOXCAST_API_KEY``, if it has one.
            sample_rate: output rate; default: the pipeline's ``audio_out_sample_rate``.
            extra: more request fields for every utterance (``seed``, ``temperature``, ...).
            settings: voice, language, instructions (updatable while the pipeline runs; a change
                takes effect at the next turn).
        """
        kwargs.setdefault("text_aggregation_mode", TextAggregationMode.TOKEN)
        super().__init__(
            sample_rate=sample_rate, push_start_frame=True, settings=_settings_store(settings), **kwargs
        )
        url = base_url.rstrip("/") + "/v1/audio/speech/stream"
        self._url = "ws" + url[len("http") :] if url.startswith("http") else url
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._extra = dict(extra or {})
        self._websocket: Any = None
        self._receive_task: Any = None
        self._config_sent: dict[str, Any] | None = None
        self._open_context: str | None = None  # the turn whose utterance is taking text
        self._queued: deque[str] = deque()  # turns opened on the server, not started yet
        self._current: str | None = None  # the turn whose audio is arriving
        self._clears = 0  # "clear" sent, "cleared" not received yet

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        return _language(language)

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        _check_rate(self.sample_rate)
        await self._connect()

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._disconnect()

    async def cancel(self, frame: Any) -> None:
        await super().cancel(frame)
        await self._disconnect()

    # -- connection --------------------------------------------------------------------------------
    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()
        if self._receive_task is not None:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket is not None:
            return
        try:
            self._websocket = await self._websocket_connect(self._url, additional_headers=self._headers)
            self._config_sent, self._open_context, self._current, self._clears = None, None, None, 0
            self._queued.clear()
        except Exception as e:  # reported as Pipecat expects; the base class retries
            self._websocket = None
            await self.push_error(error_msg=f"voxcast: cannot connect to {self._url}: {e}", exception=e)

    async def _disconnect_websocket(self) -> None:
        ws, self._websocket = self._websocket, None
        if ws is not None:
            try:
                await ws.close()
            except Exception as e:
                log.debug("%s: closing the socket: %s", self, e)

    async def _send(self, message: dict[str, Any]) -> None:
        if self._websocket is None:
            await self._connect()
        if self._websocket is None:
            raise ConnectionError(f"voxcast: not connected to {self._url}")
        await self._websocket.send(json.dumps(message))

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            **self._extra,
            "type": "config",
            "text_mode": "words",
            "response_format": "pcm",
            "sample_rate": self.sample_rate,
        }
        return {**config, **_voice_fields(self._settings, "instruct")}

    # -- text --------------------------------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """A token of the turn ``context_id``: into its utterance (opened at the turn's first token)."""
        try:
            if self._open_context != context_id:
                if self._open_context is not None:
                    await self._send({"type": "flush"})
                config = self._config()
                if config != self._config_sent:
                    await self._send(config)
                    self._config_sent = config
                self._open_context = context_id
                self._queued.append(context_id)
                await self.start_ttfb_metrics()
            await self._send({"type": "text", "text": text})
        except Exception as e:
            yield ErrorFrame(error=f"voxcast: {e}")
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: end its utterance (the server speaks it to its end)."""
        if self._open_context is not None and (context_id is None or context_id == self._open_context):
            self._open_context = None
            if self._websocket is not None:
                await self._send({"type": "flush"})

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: the server stops within one frame and drops the queued text."""
        await self.stop_all_metrics()
        if self._websocket is not None:
            self._clears += 1
            self._open_context, self._current = None, None
            self._queued.clear()
            await self._send({"type": "clear"})
        await super().on_audio_context_interrupted(context_id)

    # -- audio -------------------------------------------------------------------------------------
    async def _receive_messages(self) -> None:
        assert self._websocket is not None
        async for message in self._websocket:
            if isinstance(message, bytes):
                if (
                    not self._clears
                    and self._current is not None
                    and self.audio_context_available(self._current)
                ):
                    await self.stop_ttfb_metrics()
                    frame = TTSAudioRawFrame(message, self.sample_rate, 1, context_id=self._current)
                    await self.append_to_audio_context(self._current, frame)
                continue
            await self._event(json.loads(message))

    async def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "cleared":
            self._clears = max(0, self._clears - 1)
            return
        if self._clears:  # the cleared speech's last words
            return
        if kind == "started":
            self._current = self._queued.popleft() if self._queued else None
        elif kind in ("segment_done", "error") and self._current is not None:
            ctx, self._current = self._current, None
            if kind == "error":
                await self.push_error(error_msg=f"voxcast: {_error_text(event.get('error') or {})}")
            if self.audio_context_available(ctx):
                await self.append_to_audio_context(ctx, TTSStoppedFrame(context_id=ctx))
                await self.remove_audio_context(ctx)
        elif kind == "error":  # not about an utterance (a bad config): say so
            await self.push_error(error_msg=f"voxcast: {_error_text(event.get('error') or {})}")
