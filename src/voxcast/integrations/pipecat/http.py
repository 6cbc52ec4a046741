"""VoxcastTTSService: each sentence is one streamed ``POST /v1/audio/speech`` (raw PCM)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
from pipecat.frames.frames import ErrorFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame

from voxcast.integrations.pipecat.base import VoxcastService, VoxcastTTSSettings, error_text

__all__ = ["VoxcastTTSService"]


class VoxcastTTSService(VoxcastService):
    """Text to speech on a voxcast server, one HTTP request per sentence (see the package docstring)."""

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        sample_rate: int | None = None,
        extra: Mapping[str, Any] | None = None,
        session: aiohttp.ClientSession | None = None,
        settings: VoxcastTTSSettings | None = None,
        capacity_wait_s: float = 3.0,
        **kwargs: Any,
    ) -> None:
        """
        Args:
            base_url: the server (``voxcast serve``), without ``/v1``.
            api_key: its ``VOXCAST_API_KEY``, if it has one.
            sample_rate: output rate; default: the pipeline's ``audio_out_sample_rate``.
            extra: more request fields sent with every sentence (``seed``, ``temperature``, ...).
            session: an aiohttp session to share; default: one of its own.
            settings: voice, language, instructions, speed (updatable while the pipeline runs).
            capacity_wait_s: how long a sentence may wait in all for a server that answers 503
                ``over_capacity`` (it is asked again after each ``Retry-After``); 0: no retry, the
                sentence ends with an ``ErrorFrame`` at once.
        """
        super().__init__(
            base_url=base_url,
            path="/v1/audio/speech",
            api_key=api_key,
            sample_rate=sample_rate,
            extra=extra,
            settings=settings,
            push_stop_frames=True,
            **kwargs,
        )
        self._session = session
        self._own_session = session is None
        self._capacity_wait_s = max(0.0, capacity_wait_s)
        self._bare: str | None = None  # the context of bare text spoken last (ended by what follows)

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
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
        return {**self._request_fields("instructions"), "input": text}

    async def _end_bare_turn(self) -> None:
        """Bare text's context ends once its text frame is queued: when the next text or the end comes."""
        ctx, self._bare = self._bare, None
        if ctx is not None and self.audio_context_available(ctx):
            await self.append_to_audio_context(ctx, TTSStoppedFrame(context_id=ctx))
            await self.remove_audio_context(ctx)

    async def _post(self, text: str) -> aiohttp.ClientResponse:
        """The sentence's response; a 503 ``over_capacity`` (admission control: every running stream
        would stall with one more) is asked again after its ``Retry-After``, for up to
        ``capacity_wait_s`` in all, so a busy moment delays the sentence instead of dropping it."""
        assert self._session is not None, "start() first"
        waited = 0.0
        while True:
            r = await self._session.post(self._url, json=self._body(text), headers=self._headers)
            left = self._capacity_wait_s - waited
            if r.status != 503 or left <= 0:
                return r
            try:
                code = (await r.json())["error"]["code"]
            except (aiohttp.ContentTypeError, KeyError, TypeError, ValueError):
                code = None
            if code != "over_capacity":
                return r  # its body stays readable
            r.release()
            delay = min(left, _retry_after_s(r.headers.get("Retry-After")))
            await asyncio.sleep(delay)
            waited += delay

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """One sentence: stream its audio as the server generates it."""
        assert self._session is not None, "start() first"
        if self._bare != context_id:
            await self._end_bare_turn()
        if self._is_bare(context_id):
            self._bare = context_id
        async with await self._post(text) as r:
            if r.status != 200:
                try:
                    message = error_text((await r.json())["error"])
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


def _retry_after_s(value: str | None) -> float:
    """A ``Retry-After`` of seconds (1 when missing or not a number; HTTP dates are not sent)."""
    try:
        return max(0.05, float(value)) if value is not None else 1.0
    except ValueError:
        return 1.0
