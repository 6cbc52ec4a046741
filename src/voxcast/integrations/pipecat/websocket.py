"""VoxcastWebsocketTTSService: an LLM reply's tokens into one utterance of the server's WebSocket."""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from pipecat.frames.frames import EndFrame, ErrorFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService

from voxcast.integrations.pipecat.base import VoxcastService, VoxcastTTSSettings, error_text

__all__ = ["VoxcastWebsocketTTSService"]

log = logging.getLogger(__name__)


class VoxcastWebsocketTTSService(VoxcastService, WebsocketTTSService):
    """Text to speech on a voxcast server's WebSocket, token by token (see the package docstring).

    The server speaks utterances in order on one connection; each Pipecat turn is one utterance, so
    the events are matched to turns in the order the turns were opened (``started`` takes the next
    one; ``clear`` drops them all, and what the server sends before its ``cleared`` answer belongs to
    the cleared speech).
    """

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
            settings: voice, language, instructions, speed (updatable while the pipeline runs; a
                change takes effect at the next turn).
        """
        kwargs.setdefault("text_aggregation_mode", TextAggregationMode.TOKEN)
        super().__init__(
            base_url=base_url,
            path="/v1/audio/speech/stream",
            api_key=api_key,
            sample_rate=sample_rate,
            extra=extra,
            settings=settings,
            **kwargs,
        )
        if self._url.startswith("http"):
            self._url = "ws" + self._url[len("http") :]
        self._websocket: Any = None
        self._receive_task: Any = None
        self._config_sent: dict[str, Any] | None = None
        self._open_context: str | None = None  # the turn whose utterance is taking text
        self._queued: deque[str] = deque()  # turns opened on the server, not started yet
        self._current: str | None = None  # the turn whose audio is arriving
        self._clears = 0  # "clear" sent, "cleared" not received yet

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
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
        return {**self._request_fields("instruct"), "type": "config", "text_mode": "words"}

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
                await self.push_error(error_msg=f"voxcast: {error_text(event.get('error') or {})}")
            if self.audio_context_available(ctx):
                await self.append_to_audio_context(ctx, TTSStoppedFrame(context_id=ctx))
                await self.remove_audio_context(ctx)
        elif kind == "error":  # not about an utterance (a bad config): say so
            await self.push_error(error_msg=f"voxcast: {error_text(event.get('error') or {})}")
