"""VoxcastWebsocketTTSService: an LLM reply's tokens into one utterance of the server's WebSocket."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipecat.frames.frames import ErrorFrame, Frame, StartFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService

from voxcast.integrations.client import unspaced as is_unspaced
from voxcast.integrations.pipecat.base import VoxcastService, VoxcastTTSSettings, error_text

__all__ = ["VoxcastWebsocketTTSService"]

log = logging.getLogger(__name__)

_KEEPALIVE_S = 1.0
"""How often the contexts of turns still due are kept open (Pipecat ends a quiet one after 3 s)."""


@dataclass
class _Run:
    """Text of one turn sent without another turn's between, ended by a mark (``mark``, once sent).

    On the server it is one utterance, or more when the server ended one early (a text timeout, or
    its frame limit: ``server_ended``, the next token then starts a new run); the audio between the
    previous run's mark and this one's is this run's.
    """

    context_id: str
    mark: str | None = None
    final: bool = False  # the turn's text ends with this run
    server_ended: bool = False
    texts: list[str] = field(default_factory=list)  # its text as sent: sent again after a refusal
    audio: bool = False  # audio of it came
    waiting: bool = False  # refused past capacity: its text is held until it is sent again
    waited_s: float = 0.0


class VoxcastWebsocketTTSService(VoxcastService, WebsocketTTSService):
    """Text to speech on a voxcast server's WebSocket, token by token (see the package docstring).

    A turn's tokens go into one utterance on the server, ended by a ``mark`` (which also closes the
    utterance) rather than ``flush``: the server echoes a mark after all audio of the text before it,
    so the audio between two echoes is one turn's, however many utterances the server made of it
    (after ``VOXCAST_TEXT_WAIT_S`` without text it ends one and opens the next itself), and the
    turn's ``TTSStoppedFrame`` follows its last audio. ``clear`` drops every turn under way; what
    the server sends before its ``cleared`` answer belongs to the cleared speech.

    Past capacity the server refuses a turn whole (an ``error`` of code ``over_capacity`` before any of
    its audio, the rest of its text dropped up to the next ``flush`` or ``mark``). The service then
    ends the refused turn on the server (``flush``), holds the turn's later tokens, and after
    ``retry_after_s`` sends the turn's text again, for up to ``capacity_wait_s`` in all: a busy moment
    delays the reply instead of dropping it. Only a turn with no other turn queued behind it is sent
    again (so turns are never spoken out of order); otherwise, or past ``capacity_wait_s``, the error
    becomes an ``ErrorFrame``.
    """

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        sample_rate: int | None = None,
        extra: Mapping[str, Any] | None = None,
        settings: VoxcastTTSSettings | None = None,
        capacity_wait_s: float = 3.0,
        word_timestamps: bool = True,
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
            capacity_wait_s: how long a turn the server refused past capacity may wait in all before
                it is sent again (after each ``retry_after_s``); 0: no retry, an ``ErrorFrame``.
            word_timestamps: ask the server for each utterance's word timestamps and push a
                ``TTSTextFrame`` per word as it plays, so an interrupted reply's context keeps only
                the words heard (off: the text of each sentence after its audio, Pipecat's default).
        """
        kwargs.setdefault("text_aggregation_mode", TextAggregationMode.TOKEN)
        kwargs.setdefault("push_text_frames", not word_timestamps)
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
        self._keepalive: Any = None
        self._config_sent: dict[str, Any] | None = None
        self._runs: deque[_Run] = deque()  # runs whose mark the server has not echoed yet, in order
        self._open: _Run | None = None  # the run taking text (the last of them, its mark not sent)
        self._marks = 0  # marks sent on this connection (their names)
        self._clears = 0  # "clear" sent, "cleared" not received yet
        self._capacity_wait_s = max(0.0, capacity_wait_s)
        self._stale_marks: set[str] = set()  # marks of refused runs sent again: their echoes mean nothing
        self._retry: asyncio.Task[None] | None = None  # sends a refused run again
        self._word_timestamps = word_timestamps
        self._heard: dict[str, int] = {}  # context -> audio bytes received (word times count from its first)
        self._segment_at: tuple[str, float] | None = None  # the segment under way: its context, its start (s)

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self._connect()

    # -- connection --------------------------------------------------------------------------------
    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket is not None and self._receive_task is None:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))
        if self._keepalive is None:
            self._keepalive = self.create_task(self._keep_turns_open(), name="turns")

    async def _disconnect(self) -> None:
        await super()._disconnect()
        for task in (self._receive_task, self._keepalive, self._retry):
            if task is not None:
                await self.cancel_task(task)
        self._receive_task = self._keepalive = self._retry = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket is not None:
            return
        try:
            self._websocket = await self._websocket_connect(self._url, additional_headers=self._headers)
            self._config_sent, self._open, self._clears = None, None, 0
            self._runs.clear()
            self._stale_marks.clear()
            self._heard.clear()
            self._segment_at = None
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
            raise ConnectionError(f"not connected to {self._url}")
        await self._websocket.send(json.dumps(message))

    def _config(self) -> dict[str, Any]:
        config = {**self._request_fields("instruct"), "type": "config", "text_mode": "words"}
        if self._word_timestamps:
            config["word_timestamps"] = True
        return config

    async def _keep_turns_open(self) -> None:
        """Pipecat ends a context that gets nothing for ``stop_frame_timeout_s`` (3 s), and a later
        token would open it again (a second TTSStartedFrame): a turn whose text or audio is still
        due (an LLM pausing mid-reply, a busy server) is kept open until its mark comes back."""
        while True:
            await asyncio.sleep(_KEEPALIVE_S)
            for ctx in {run.context_id for run in self._runs}:
                self._refresh_audio_context(ctx)

    # -- text --------------------------------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """A token of the turn ``context_id``: into the turn's open run (one utterance on the server)."""
        try:
            run = self._open
            if run is None or run.context_id != context_id or run.server_ended:
                if run is not None:  # another turn's text comes between (a TTSSpeakFrame): end the run
                    await self._end_run(final=False)
                waiting = next((r for r in self._runs if r.waiting), None)
                if waiting is not None:  # sent again later it would follow this turn: dropped now
                    await self._give_up(waiting, "another turn started while it waited")
                config = self._config()
                if config != self._config_sent:
                    await self._send(config)
                    self._config_sent = config
                self._open = _Run(context_id)
                self._runs.append(self._open)
            open_run = self._open
            assert open_run is not None
            open_run.texts.append(text)
            if not open_run.waiting:  # a refused run's text waits to be sent again with the rest
                await self._send({"type": "text", "text": text})
            if self._is_bare(context_id):  # text outside any turn: all of its context is here
                await self._end_run(final=True)
                await self._close_bare_text(context_id)
        except Exception as e:
            yield ErrorFrame(error=f"voxcast: {e}")
            return
        yield None

    async def _close_bare_text(self, context_id: str) -> None:
        """Tell Pipecat that bare text's context has all its text, so its words reach the context.

        In ``TOKEN`` mode Pipecat regroups a context's tokens into sentences and announces one (the
        slot its word timestamps are matched to; without them, its ``TTSTextFrame``) only when the
        next sentence starts or the context's text is finalized, which it does at a reply's end and
        after a ``TTSSpeakFrame`` but never for a bare ``TextFrame``'s context: its last sentence's
        words were dropped ("not recognised by any slot"). This finalizes it as Pipecat does a
        ``TTSSpeakFrame``'s (``TTSService._handle_tts_speak``); a no-op in ``SENTENCE`` mode."""
        frames = await self._aggregated_frame_sequencer.finalize(context_id)
        await self._push_sequencer_frames(frames, context_id)

    async def _end_run(self, final: bool) -> None:
        """End the open run with a mark: it closes the utterance on the server, and its echo comes
        after the run's last audio; ``final``: the turn's text ends here."""
        run, self._open = self._open, None
        assert run is not None
        run.final = final
        if not run.waiting:  # a refused run's mark goes after its text, when it is sent again
            await self._send_mark(run)
        else:
            run.mark = ""  # ended: marked once sent again

    async def _send_mark(self, run: _Run) -> None:
        self._marks += 1
        run.mark = f"voxcast-pipecat-{self._marks}"
        await self._send({"type": "mark", "name": run.mark})

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: end its run, or say so after its last run (its text was
        interrupted by another turn's, a TTSSpeakFrame's)."""
        ctx = context_id or (self._open.context_id if self._open is not None else None)
        if self._open is not None and self._open.context_id == ctx:
            await self._end_run(final=True)
        elif any(run.context_id == ctx and not run.final for run in self._runs):
            assert ctx is not None
            self._open = _Run(ctx)
            self._runs.append(self._open)
            await self._end_run(final=True)

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: the server stops within one frame and drops the queued text (once for all)."""
        await self.stop_all_metrics()
        if self._runs and self._websocket is not None:
            self._clears += 1
            self._open = None
            self._runs.clear()
            self._heard.clear()
            self._segment_at = None
            await self._send({"type": "clear"})
        await super().on_audio_context_interrupted(context_id)

    # -- audio -------------------------------------------------------------------------------------
    async def _receive_messages(self) -> None:
        assert self._websocket is not None
        async for message in self._websocket:
            if isinstance(message, bytes):
                if self._runs and not self._clears:
                    self._runs[0].audio = True
                ctx = self._runs[0].context_id if self._runs and not self._clears else None
                if ctx is not None:
                    self._heard[ctx] = self._heard.get(ctx, 0) + len(message)
                if ctx is not None and self.audio_context_available(ctx):
                    await self.append_to_audio_context(
                        ctx, TTSAudioRawFrame(message, self.sample_rate, 1, context_id=ctx)
                    )
                continue
            await self._event(json.loads(message))

    async def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "cleared":
            self._clears = max(0, self._clears - 1)
        elif self._clears:  # the cleared speech's last words
            return
        elif kind == "mark":
            name = event.get("name")
            if name in self._stale_marks:
                self._stale_marks.discard(name)
            else:
                await self._run_spoken(name)
        elif kind == "started":
            ctx = (
                self._runs[0].context_id if self._runs else None
            )  # its words count from the turn's first audio
            self._segment_at = (
                None if ctx is None else (ctx, self._heard.get(ctx, 0) / (2 * self.sample_rate))
            )
        elif kind == "segment_done":
            self._segment_done(event.get("timing") or {})
            await self._words(event.get("words"))
        elif kind == "error":
            error = event.get("error") or {}
            if error.get("code") == "over_capacity" and await self._refused(event.get("retry_after_s")):
                return
            await self.push_error(error_msg=f"voxcast: {error_text(error)}")

    async def _refused(self, retry_after_s: Any) -> bool:
        """The server refused the oldest run's turn past capacity: send it again after
        ``retry_after_s`` when it may still wait and no other turn is queued behind it (True)."""
        run = self._runs[0] if len(self._runs) == 1 else None
        delay = float(retry_after_s) if isinstance(retry_after_s, int | float) else 1.0
        if run is None or run.audio or run.waiting or run.waited_s + delay > self._capacity_wait_s:
            return False
        run.waiting = True
        if run.mark:  # its turn already ended on the server: that mark's echo means nothing now
            self._stale_marks.add(run.mark)
            run.mark = ""
        elif run.mark is None:
            await self._send({"type": "flush"})  # end the refused turn there: the rest is held here
        self._retry = self.create_task(self._send_again(run, delay), name="voxcast-capacity-retry")
        return True

    async def _give_up(self, run: _Run, why: str) -> None:
        """A refused run is not sent again: an ErrorFrame, and its turn ends without audio."""
        if self._retry is not None:
            await self.cancel_task(self._retry)
            self._retry = None
        if run in self._runs:
            self._runs.remove(run)
        if self._open is run:
            self._open = None
        if not any(r.context_id == run.context_id for r in self._runs):
            self._heard.pop(run.context_id, None)
        await self.push_error(error_msg=f"voxcast: over capacity; the turn was dropped ({why})")
        if self.audio_context_available(run.context_id):
            await self.append_to_audio_context(run.context_id, TTSStoppedFrame(context_id=run.context_id))
            await self.remove_audio_context(run.context_id)

    async def _send_again(self, run: _Run, delay: float) -> None:
        """After ``delay``: the refused run's text so far as one new turn (and its mark if it ended)."""
        await asyncio.sleep(delay)
        self._retry = None
        run.waited_s += delay
        if run not in self._runs or self._websocket is None:  # interrupted, or the service stopped
            return
        run.waiting = False
        try:
            await self._send({"type": "text", "text": "".join(run.texts)})
            if run.mark == "":
                await self._send_mark(run)
        except Exception as e:
            await self.push_error(error_msg=f"voxcast: sending a refused turn again: {e}", exception=e)

    def _segment_done(self, timing: dict[str, Any]) -> None:
        """An utterance of the run still taking text ended: after a text timeout the server opens
        the next one itself; otherwise (its frame limit, the model's end) the next token opens one."""
        run = self._runs[0] if self._runs else None
        if run is not None and run is self._open and not (timing.get("extra") or {}).get("text_timeout"):
            run.server_ended = True

    async def _words(self, words: Any) -> None:
        """A segment's words, timed from its context's first audio (the segment's start plus each
        word's ``start_ms``): Pipecat pushes a ``TTSTextFrame`` for each as it plays."""
        at, self._segment_at = self._segment_at, None
        if not words or at is None:
            return
        ctx, offset_s = at
        for w in words:  # CJK words are joined without a space in the context, the others with one
            unspaced = True if is_unspaced(w["word"]) else None
            t = offset_s + w["start_ms"] / 1000.0
            await self.add_word_timestamps([(w["word"], t)], ctx, includes_inter_frame_spaces=unspaced)

    async def _run_spoken(self, name: Any) -> None:
        """A run's mark came back: all its audio is out; the turn ends with its final run."""
        while self._runs and self._runs[0].mark:  # sent ("" : to be sent again with a refused run)
            run = self._runs.popleft()
            if run.final:
                self._heard.pop(run.context_id, None)
            if run.final and self.audio_context_available(run.context_id):
                await self.append_to_audio_context(run.context_id, TTSStoppedFrame(context_id=run.context_id))
                await self.remove_audio_context(run.context_id)
            if run.mark == name:
                return
