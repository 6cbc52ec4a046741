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
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pipecat.frames.frames import ErrorFrame, Frame, StartFrame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.types import NOT_GIVEN, NotGiven

__all__ = ["VoxcastTTSService", "VoxcastTTSSettings"]

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
    ``model`` (any name; one model per server) and ``instructions`` (voxcast's ``instruct``)."""

    instructions: str | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)


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
        store = VoxcastTTSSettings(model="voxcast", voice="ryan", language=None, instructions=None)
        if settings is not None:
            store.apply_update(settings)
        super().__init__(
            sample_rate=sample_rate, push_start_frame=True, push_stop_frames=True, settings=store, **kwargs
        )
        self._url = base_url.rstrip("/") + "/v1/audio/speech"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._extra = dict(extra or {})
        self._session = session
        self._own_session = session is None

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """Pipecat's language codes -> voxcast's names (``en-US`` -> ``english``); others: ``auto``."""
        return _LANGUAGES.get(str(Language(language).value).split("-")[0].lower(), "auto")

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        if self.sample_rate not in SAMPLE_RATES:
            raise ValueError(f"voxcast produces {SAMPLE_RATES} Hz, not {self.sample_rate}")
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
        for name, key in (("voice", "voice"), ("language", "language"), ("instructions", "instructions")):
            value = getattr(self._settings, name)
            if value is not None and value is not NOT_GIVEN:
                body[key] = value
        return body

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """One sentence: stream its audio as the server generates it."""
        assert self._session is not None, "start() first"
        async with self._session.post(self._url, json=self._body(text), headers=self._headers) as r:
            if r.status != 200:
                try:
                    detail = (await r.json())["error"]
                    message = f"{detail.get('param') or 'request'}: {detail.get('message')}"
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
