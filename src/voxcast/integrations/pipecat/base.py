"""What both Pipecat services share: settings, constructor, request fields, language names, errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipecat.frames.frames import EndFrame, Frame, LLMFullResponseEndFrame, StartFrame
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.types import NOT_GIVEN, NotGiven

from voxcast.integrations.client import SAMPLE_RATES, error_text, language_name

__all__ = ["SAMPLE_RATES", "VoxcastService", "VoxcastTTSSettings", "error_text"]


@dataclass
class VoxcastTTSSettings(TTSSettings):
    """Runtime-updatable settings: ``voice`` (a speaker or a registered voice id), ``language``,
    ``model`` (any name; one model per server), ``instructions`` (voxcast's ``instruct``) and
    ``speed`` (the speaking rate, 0.25-4.0, pitch kept)."""

    instructions: str | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)
    speed: float | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)


def _settings_store(settings: VoxcastTTSSettings | None) -> VoxcastTTSSettings:
    """The defaults (no voice: the server speaks its default voice, ``VOXCAST_DEFAULT_VOICE``)
    updated with the caller's settings."""
    store = VoxcastTTSSettings(model="voxcast", voice=None, language=None, instructions=None, speed=None)
    if settings is not None:
        store.apply_update(settings)
    return store


@dataclass
class _TextEnd(LLMFullResponseEndFrame):
    """The end of the text before an ``EndFrame`` (handled as a reply's end, never pushed on)."""


class VoxcastService(TTSService):
    """The constructor, settings and request fields of both services (a base, not used alone)."""

    Settings = VoxcastTTSSettings
    _settings: VoxcastTTSSettings

    def __init__(
        self,
        *,
        base_url: str,
        path: str,
        api_key: str | None,
        sample_rate: int | None,
        extra: Mapping[str, Any] | None,
        settings: VoxcastTTSSettings | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            sample_rate=sample_rate, push_start_frame=True, settings=_settings_store(settings), **kwargs
        )
        self._url = base_url.rstrip("/") + path
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._extra = dict(extra or {})

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """Pipecat's language codes -> voxcast's names (``en-US`` -> ``english``); others: ``auto``."""
        return language_name(str(Language(language).value))

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        if self.sample_rate not in SAMPLE_RATES:
            raise ValueError(f"sample_rate: voxcast produces {SAMPLE_RATES} Hz, not {self.sample_rate}")

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """An ``EndFrame`` first speaks the text still buffered, as the end of a reply would: Pipecat
        itself calls :meth:`stop` (which ends playback and closes the connection) before it flushes
        that text, so the last sentence would be lost and the ``EndFrame`` held back."""
        if isinstance(frame, EndFrame) and direction == FrameDirection.DOWNSTREAM:
            await super().process_frame(_TextEnd(), direction)
            await self._end_bare_turn()
        await super().process_frame(frame, direction)

    async def push_frame(self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        if not isinstance(frame, _TextEnd):
            await super().push_frame(frame, direction)

    def _is_bare(self, context_id: str) -> bool:
        """Whether ``context_id`` is text outside any turn (a ``TextFrame`` with no LLM reply around
        it): Pipecat gives each such sentence (token in ``TOKEN`` mode) a context of its own and
        never completes it, so the service ends it."""
        return context_id != self._turn_context_id

    async def _end_bare_turn(self) -> None:
        """End the context of the bare text spoken last (the HTTP service; the WebSocket service
        ends such a context at its mark's echo)."""

    def _request_fields(self, instruct: str) -> dict[str, Any]:
        """The streaming-text layout (both services: the same audio for the same text and seed;
        ``extra`` may say otherwise), ``extra``, raw PCM at the pipeline's rate, and the settings
        that are set (``instructions`` named ``instruct``)."""
        out: dict[str, Any] = {"non_streaming_text": False, **self._extra}
        out.update(response_format="pcm", sample_rate=self.sample_rate)
        for name in ("voice", "language", "instructions", "speed"):
            value = getattr(self._settings, name)
            if value is not None and value is not NOT_GIVEN:
                out[instruct if name == "instructions" else name] = value
        return out
