"""VoxcastTTSService inside a real Pipecat pipeline (PipelineWorker + WorkerRunner) against a running
voxcast HTTP server on a free loopback port (tiny CustomVoice model)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pipecat", reason="the pipecat extra is not installed")

from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.utils.string import TextPartForConcatenation, concatenate_aggregated_text
from pipecat.workers.runner import WorkerRunner

from tests.fixtures.http_server import Recorder, ended, running
from tests.fixtures.models import build_cached
from tests.toy_family import family as toy_family
from tests.toy_family.model import FRAMES_PER_WORD, sine
from voxcast.audio.word_times import estimate_word_times
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.errors import OverCapacity
from voxcast.integrations.pipecat import VoxcastTTSService, VoxcastWebsocketTTSService
from voxcast.models import registry
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.storage.local import LocalBlobStore

Factory = Callable[[str], Path]
KEY = "sk-pipecat"


class Sink(FrameProcessor):
    """Records the frames that pass in ``direction``; ``audio`` is set at the first audio frame."""

    def __init__(self, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        super().__init__()
        self.direction = direction
        self.frames: list[Frame] = []
        self.audio = asyncio.Event()
        #: The pipeline's upstream sink, where the service's errors go (set by :func:`_run`).
        self.upstream: Sink | None = None

    def errors(self) -> list[str]:
        """The errors the service reported (upstream) or passed on (downstream)."""
        frames = self.frames + (self.upstream.frames if self.upstream is not None else [])
        return [f.error for f in frames if isinstance(f, ErrorFrame)]

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self.direction:
            self.frames.append(frame)
            if isinstance(frame, TTSAudioRawFrame):
                self.audio.set()
        await self.push_frame(frame, direction)


@pytest.fixture(scope="module")
def service(tiny_service: Service) -> Service:
    return tiny_service


@pytest.fixture(scope="module")
def base_url(service: Service) -> Iterator[str]:
    with running(create_app(ServiceHolder(service), HttpConfig(api_key=KEY))) as url:
        yield url


async def _run(
    tts: VoxcastTTSService | VoxcastWebsocketTTSService,
    script: Callable[[PipelineWorker, Sink], Any],
    rate: int,
    upstream: Sink | None = None,
    downstream: FrameProcessor | None = None,
) -> Sink:
    sink = Sink()
    sink.upstream = upstream or Sink(FrameDirection.UPSTREAM)
    worker = PipelineWorker(
        Pipeline([sink.upstream, tts, sink, *([downstream] if downstream is not None else [])]),
        params=PipelineParams(audio_out_sample_rate=rate),
        cancel_on_idle_timeout=False,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: Any, frame: Any) -> None:
        started.set()

    async def drive() -> None:
        await asyncio.wait_for(started.wait(), 30)
        await script(worker, sink)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.ensure_future(runner.run())
    try:  # generous bounds: they only turn a hang into a failure
        await asyncio.wait_for(drive(), 120)
        await asyncio.wait_for(asyncio.shield(run), 60)  # the EndFrame went through: it ends
    except TimeoutError:
        await runner.cancel()
        await asyncio.wait_for(run, 30)
        raise AssertionError("the pipeline did not end") from None
    return sink


@pytest.mark.parametrize("speed", [None, 1.25])
def test_a_sentence_is_spoken_through_the_pipeline(
    base_url: str, service: Service, speed: float | None
) -> None:
    text = "Hello there, how are you today?"
    extra = {"seed": 4, "max_frames": 8, "cache": False}
    rate = {} if speed is None else {"speed": speed}
    tts = VoxcastTTSService(
        base_url=base_url, api_key=KEY, extra=extra, settings=VoxcastTTSService.Settings(voice="ryan", **rate)
    )

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        await worker.queue_frame(TTSSpeakFrame(text))
        await asyncio.wait_for(_stopped(sink), 60)

    sink = asyncio.run(_run(tts, script, 16000))
    kinds = [
        type(f) for f in sink.frames if isinstance(f, TTSStartedFrame | TTSAudioRawFrame | TTSStoppedFrame)
    ]
    assert kinds[0] is TTSStartedFrame and kinds[-1] is TTSStoppedFrame and TTSAudioRawFrame in kinds
    audio = [f for f in sink.frames if isinstance(f, TTSAudioRawFrame)]
    assert all(f.sample_rate == 16000 and f.num_channels == 1 for f in audio)
    direct = b"".join(
        c.data
        for c in service.synthesize(
            {
                "text": text,
                "voice": "ryan",
                "response_format": "pcm",
                "sample_rate": 16000,
                "non_streaming_text": False,
                **extra,
                **rate,
            }
        )
    )
    assert b"".join(f.audio for f in audio) == direct
    assert len(direct) == 2 * round(8 * 1280 / (speed or 1.0))  # 8 frames at 16 kHz, 1 / speed as long
    assert not sink.errors()


def test_without_a_voice_the_server_chooses(base_url: str, service: Service) -> None:
    """A service given no voice sends none: the server speaks its default voice (here ``vivian``,
    as ``VOXCAST_DEFAULT_VOICE`` would set it), not a speaker the plugin picked."""
    text = "Hello there, how are you today?"
    extra = {"seed": 4, "max_frames": 8, "cache": False}
    config = service.config
    service.config = dataclasses.replace(config, default_voice="vivian")
    try:
        tts = VoxcastTTSService(base_url=base_url, api_key=KEY, extra=extra)

        async def script(worker: PipelineWorker, sink: Sink) -> None:
            await worker.queue_frame(TTSSpeakFrame(text))
            await asyncio.wait_for(_stopped(sink), 60)

        sink = asyncio.run(_run(tts, script, 16000))
    finally:
        service.config = config
    spoken = b"".join(f.audio for f in sink.frames if isinstance(f, TTSAudioRawFrame))
    request = {"text": text, "response_format": "pcm", "sample_rate": 16000, "non_streaming_text": False}
    assert spoken == b"".join(c.data for c in service.synthesize({**request, **extra, "voice": "vivian"}))
    assert spoken != b"".join(c.data for c in service.synthesize({**request, **extra, "voice": "ryan"}))


@pytest.mark.parametrize("capacity_wait_s", [3.0, 0.0])
def test_an_over_capacity_answer_is_asked_again_after_retry_after(
    base_url: str, service: Service, monkeypatch: pytest.MonkeyPatch, capacity_wait_s: float
) -> None:
    """The server refuses the sentence once (503 ``over_capacity``, ``Retry-After: 1``): the
    service asks again after it and speaks the sentence whole; with ``capacity_wait_s=0`` it gives
    up at once with an ErrorFrame that says why."""
    text = "Hello there, how are you today?"
    extra = {"seed": 4, "max_frames": 8, "cache": False}
    calls: list[int] = []
    synthesize = service.synthesize

    def busy_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OverCapacity("over capacity: test", retry_after_s=1)
        return synthesize(*args, **kwargs)

    monkeypatch.setattr(service, "synthesize", busy_once)
    tts = VoxcastTTSService(
        base_url=base_url,
        api_key=KEY,
        extra=extra,
        settings=VoxcastTTSService.Settings(voice="ryan"),
        capacity_wait_s=capacity_wait_s,
    )

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        await worker.queue_frame(TTSSpeakFrame(text))
        while not any(isinstance(f, TTSStoppedFrame) for f in sink.frames):
            await asyncio.sleep(0.02)

    sink = asyncio.run(_run(tts, script, 16000))
    monkeypatch.undo()
    spoken = b"".join(f.audio for f in sink.frames if isinstance(f, TTSAudioRawFrame))
    errors = sink.errors()
    if capacity_wait_s == 0:
        assert len(calls) == 1 and not spoken
        assert errors[0] == "voxcast 503: over capacity: test"  # (Pipecat adds "...completed with no audio")
        return
    request = {"text": text, "voice": "ryan", "response_format": "pcm", "sample_rate": 16000, **extra}
    assert spoken == b"".join(c.data for c in service.synthesize({**request, "non_streaming_text": False}))
    assert len(calls) == 2 and not errors


def test_speed_changes_while_the_pipeline_runs(base_url: str, service: Service) -> None:
    """A caller asks the agent to slow down: a settings update applies from the next sentence."""
    text = "Hello there, how are you today?"
    extra = {"seed": 4, "max_frames": 8, "cache": False}
    tts = VoxcastTTSService(base_url=base_url, api_key=KEY, extra=extra)
    spoken: list[bytes] = []

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        for update in (None, VoxcastTTSService.Settings(speed=0.5)):
            if update is not None:
                await worker.queue_frame(TTSUpdateSettingsFrame(delta=update))
            start = len(sink.frames)
            await worker.queue_frame(TTSSpeakFrame(text))
            while not any(isinstance(f, TTSStoppedFrame) for f in sink.frames[start:]):
                await asyncio.sleep(0.02)
            spoken.append(b"".join(f.audio for f in sink.frames[start:] if isinstance(f, TTSAudioRawFrame)))

    asyncio.run(_run(tts, script, 16000))
    assert [len(a) for a in spoken] == [2 * 8 * 1280, 2 * 2 * 8 * 1280]  # twice as long at half speed
    request = {"text": text, "voice": "ryan", "response_format": "pcm", "sample_rate": 16000, **extra}
    request["non_streaming_text"] = False  # both services' layout
    assert spoken[1] == b"".join(c.data for c in service.synthesize({**request, "speed": 0.5}))


async def _stopped(sink: Sink) -> None:
    while not any(isinstance(f, TTSStoppedFrame) for f in sink.frames):
        await asyncio.sleep(0.02)


def test_an_interruption_cancels_generation_on_the_server(base_url: str, service: Service) -> None:
    opened = Recorder(service)
    try:
        tts = VoxcastTTSService(
            base_url=base_url,
            api_key=KEY,
            extra={"max_frames": 3000},
            settings=VoxcastTTSService.Settings(voice="ryan"),
        )

        async def script(worker: PipelineWorker, sink: Sink) -> None:
            await worker.queue_frame(TTSSpeakFrame("A long answer that the caller talks over."))
            await asyncio.wait_for(sink.audio.wait(), 60)
            await worker.queue_frame(InterruptionFrame())

        asyncio.run(_run(tts, script, 24000))
    finally:
        opened.restore()
    assert len(opened.streams) == 1
    result = ended(opened.streams[0])
    assert result.timing.finish_reason == "cancelled" and result.timing.frames < 3000


@pytest.mark.parametrize(
    ("fields", "param"), [({"settings": VoxcastTTSService.Settings(voice="nobody")}, "voice"),
                          ({"extra": {"seed": "x"}}, "seed")],
)  # fmt: skip
def test_a_server_error_becomes_an_error_frame(base_url: str, fields: dict[str, Any], param: str) -> None:
    """It names the field at fault, once (the server's message may start with it already)."""
    tts = VoxcastTTSService(base_url=base_url, api_key=KEY, **fields)
    upstream = Sink(FrameDirection.UPSTREAM)

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        await worker.queue_frame(TTSSpeakFrame("Hello."))
        while not any(isinstance(f, ErrorFrame) for f in upstream.frames):
            await asyncio.sleep(0.02)

    asyncio.run(_run(tts, script, 24000, upstream))
    error = next(f for f in upstream.frames if isinstance(f, ErrorFrame))
    assert error.error.startswith(f"voxcast 400: {param}:") and error.error.count(f"{param}:") == 1


def _tokens(text: str) -> list[str]:
    """LLM-like tokens: a word with its leading space, long words in parts."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        word = word if i == 0 else " " + word
        out += [word[j : j + 4] for j in range(0, len(word), 4)]
    return out


def test_llm_tokens_are_spoken_as_one_utterance_over_the_websocket(base_url: str, service: Service) -> None:
    """TOKEN aggregation: the reply's tokens feed one utterance as they arrive; its audio is byte
    for byte the whole reply's (same seed, streaming-text layout)."""
    text = "Sure, I can help with that. Your order shipped yesterday."
    extra = {"seed": 6, "max_frames": 30, "cache": False}
    opened = Recorder(service)
    try:
        tts = VoxcastWebsocketTTSService(
            base_url=base_url,
            api_key=KEY,
            extra=extra,
            settings=VoxcastWebsocketTTSService.Settings(voice="ryan"),
        )

        async def script(worker: PipelineWorker, sink: Sink) -> None:
            await worker.queue_frame(LLMFullResponseStartFrame())
            for token in _tokens(text):
                await worker.queue_frame(LLMTextFrame(token))
                await asyncio.sleep(0.01)
            await worker.queue_frame(LLMFullResponseEndFrame())
            await asyncio.wait_for(_stopped(sink), 60)

        sink = asyncio.run(_run(tts, script, 16000))
    finally:
        opened.restore()
    assert len(opened.streams) == 1  # one utterance for the whole reply
    kinds = [
        type(f) for f in sink.frames if isinstance(f, TTSStartedFrame | TTSAudioRawFrame | TTSStoppedFrame)
    ]
    assert kinds[0] is TTSStartedFrame and kinds[-1] is TTSStoppedFrame and TTSAudioRawFrame in kinds
    audio = [f for f in sink.frames if isinstance(f, TTSAudioRawFrame)]
    assert all(f.sample_rate == 16000 for f in audio)
    whole = b"".join(
        c.data
        for c in service.synthesize(
            {"text": text, "voice": "ryan", "response_format": "pcm", "sample_rate": 16000,
             "non_streaming_text": False, **extra}
        )
    )  # fmt: skip
    assert b"".join(f.audio for f in audio) == whole
    assert not sink.errors()


@pytest.mark.parametrize("capacity_wait_s", [3.0, 0.0])
def test_a_reply_refused_past_capacity_is_sent_again_over_the_websocket(
    base_url: str, service: Service, monkeypatch: pytest.MonkeyPatch, capacity_wait_s: float
) -> None:
    """The server refuses the reply's turn once (an ``over_capacity`` error, ``retry_after_s`` 1,
    the rest of the turn dropped): the service sends the whole turn again after it and the reply is
    spoken whole, byte for byte; with ``capacity_wait_s=0`` it gives up with an ErrorFrame."""
    text = "Sure, I can help with that. Your order shipped yesterday."
    extra = {"seed": 6, "max_frames": 30, "cache": False}
    asked: list[int] = []

    def busy_once() -> str | None:  # the engine's admission check, refusing the first stream only
        asked.append(1)
        return "test" if len(asked) == 1 else None

    monkeypatch.setattr(service.engine, "over_capacity", busy_once)
    tts = VoxcastWebsocketTTSService(
        base_url=base_url,
        api_key=KEY,
        extra=extra,
        settings=VoxcastWebsocketTTSService.Settings(voice="ryan"),
        capacity_wait_s=capacity_wait_s,
    )

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        await _reply(worker, text, pause_s=0.01)
        await asyncio.wait_for(_stopped(sink), 60)

    sink = asyncio.run(_run(tts, script, 16000))
    monkeypatch.undo()
    spoken = b"".join(f.audio for f in sink.frames if isinstance(f, TTSAudioRawFrame))
    if capacity_wait_s == 0:
        assert not spoken and any("over capacity: test" in e for e in sink.errors())
        return
    assert len(asked) == 2 and spoken == _pcm(service, text, extra) and not sink.errors()
    kinds = [type(f) for f in sink.frames if isinstance(f, TTSStartedFrame | TTSStoppedFrame)]
    assert kinds == [TTSStartedFrame, TTSStoppedFrame]  # one turn, whole


def test_an_interruption_clears_the_websocket_utterance(base_url: str, service: Service) -> None:
    opened = Recorder(service)
    try:
        tts = VoxcastWebsocketTTSService(
            base_url=base_url, api_key=KEY, extra={"max_frames": 3000},
            settings=VoxcastWebsocketTTSService.Settings(voice="ryan"),
        )  # fmt: skip

        async def script(worker: PipelineWorker, sink: Sink) -> None:
            await worker.queue_frame(LLMFullResponseStartFrame())
            for token in _tokens("A long answer that the caller talks over, and over."):
                await worker.queue_frame(LLMTextFrame(token))
            await asyncio.wait_for(sink.audio.wait(), 60)
            await worker.queue_frame(InterruptionFrame())

        asyncio.run(_run(tts, script, 24000))
    finally:
        opened.restore()
    assert len(opened.streams) == 1
    result = ended(opened.streams[0])
    assert result.timing.finish_reason == "cancelled" and result.timing.frames < 3000


@pytest.fixture(scope="module")
def short_wait(
    tiny_model_dir: Factory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Service]]:
    """A second server (and its service) whose utterances take their text as complete after 0.3 s
    without any (``VOXCAST_TEXT_WAIT_S=0.3``)."""
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, text_wait_s=0.3)
    )
    store = LocalBlobStore(tmp_path_factory.mktemp("store"), fsync=False)
    service = Service.assemble(ServiceConfig(store_audio=False), engine, store)
    try:
        with running(create_app(ServiceHolder(service), HttpConfig(api_key=KEY))) as url:
            yield url, service
    finally:
        service.close()


def _marks(sink: Sink) -> str:
    """The turns' brackets and the end, in order: S (TTSStartedFrame), T (TTSStoppedFrame), E (EndFrame)."""
    names = {TTSStartedFrame: "S", TTSStoppedFrame: "T", EndFrame: "E"}
    return "".join(names[type(f)] for f in sink.frames if type(f) in names)


def _turn_audio(sink: Sink) -> list[bytes]:
    """The audio of each turn (between its TTSStartedFrame and its TTSStoppedFrame)."""
    turns: list[bytes] = []
    for f in sink.frames:
        if isinstance(f, TTSStartedFrame):
            turns.append(b"")
        elif isinstance(f, TTSAudioRawFrame):
            turns[-1] += f.audio
    return turns


def _pcm(service: Service, text: str, extra: dict[str, Any]) -> bytes:
    """What the server makes of ``text`` as one request (streaming-text layout, 16 kHz PCM)."""
    request = {"text": text, "voice": "ryan", "response_format": "pcm", "sample_rate": 16000, **extra}
    return b"".join(c.data for c in service.synthesize({**request, "non_streaming_text": False}))


async def _reply(worker: PipelineWorker, text: str, pause_s: float = 0.0) -> None:
    """An LLM reply: its start, its tokens (long words split; ``pause_s`` after each), its end."""
    await worker.queue_frame(LLMFullResponseStartFrame())
    for token in _tokens(text):
        await worker.queue_frame(LLMTextFrame(token))
        if pause_s:
            await asyncio.sleep(pause_s)
    await worker.queue_frame(LLMFullResponseEndFrame())


@pytest.mark.parametrize("kind", [VoxcastTTSService, VoxcastWebsocketTTSService], ids=["http", "websocket"])
def test_bare_text_frames_are_spoken_to_the_end_before_the_pipeline_ends(
    base_url: str, service: Service, kind: type[VoxcastTTSService | VoxcastWebsocketTTSService]
) -> None:
    """TextFrames with no LLM reply around them, then EndFrame (a goodbye): each is a turn of its own,
    bracketed and spoken whole, and the EndFrame passes on after the last audio."""
    texts = ["Hello there, how are you today?", "Goodbye."]
    extra = {"seed": 5, "max_frames": 12, "cache": False}
    tts = kind(base_url=base_url, api_key=KEY, extra=extra)

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        for text in texts:
            await worker.queue_frame(TextFrame(text))

    sink = asyncio.run(_run(tts, script, 16000))
    assert _marks(sink) == "STSTE"
    assert _turn_audio(sink) == [_pcm(service, text, extra) for text in texts]
    assert not sink.errors()


def test_both_services_give_the_same_audio_for_the_same_text_and_seed(
    base_url: str, service: Service
) -> None:
    text = "Sure, I can help with that."
    extra = {"seed": 9, "max_frames": 12, "cache": False}
    got = []
    for kind in (VoxcastTTSService, VoxcastWebsocketTTSService):
        tts = kind(base_url=base_url, api_key=KEY, extra=extra)

        async def script(worker: PipelineWorker, sink: Sink) -> None:
            await _reply(worker, text)

        sink = asyncio.run(_run(tts, script, 16000))
        assert _marks(sink) == "STE"
        got += _turn_audio(sink)
    assert got == [_pcm(service, text, extra)] * 2


def test_a_reply_that_pauses_past_the_servers_text_wait_stays_one_turn(
    short_wait: tuple[str, Service],
) -> None:
    """The LLM pauses mid-reply until the server has taken the utterance's text as complete and spoken
    it (segment_done); the rest of the reply is the same turn (no second TTSStartedFrame), spoken in
    full, and one TTSStoppedFrame closes it."""
    url, service = short_wait
    first, rest = "Sure, I can help with that.", " Your order shipped yesterday."
    extra = {"seed": 6, "max_frames": 30, "cache": False}
    opened = Recorder(service)
    try:
        tts = VoxcastWebsocketTTSService(base_url=url, api_key=KEY, extra=extra)

        async def script(worker: PipelineWorker, sink: Sink) -> None:
            await worker.queue_frame(LLMFullResponseStartFrame())
            for token in _tokens(first):
                await worker.queue_frame(LLMTextFrame(token))
            # the pause: until the server has taken the text as complete and spoken it
            await asyncio.to_thread(lambda: ended(opened.stream(0)))
            for token in _tokens(rest):
                await worker.queue_frame(LLMTextFrame(token))
            await worker.queue_frame(LLMFullResponseEndFrame())

        sink = asyncio.run(_run(tts, script, 16000))
    finally:
        opened.restore()
    first_end = opened.streams[0].result
    assert first_end is not None and first_end.timing.extra.get("text_timeout") is True
    assert _marks(sink) == "STE"
    assert _turn_audio(sink) == [_pcm(service, first, extra) + _pcm(service, rest.strip(), extra)]
    assert not sink.errors()


def test_a_speak_frame_inside_a_reply_keeps_both_turns_whole_over_the_websocket(
    base_url: str, service: Service
) -> None:
    """A TTSSpeakFrame in the middle of an LLM reply ("One moment.") is a turn of its own, played after
    the reply; the reply's two parts (before and after it) stay one turn."""
    first, rest, aside = "Sure, I can help", " with that right away.", "One moment."
    extra = {"seed": 8, "max_frames": 20, "cache": False}
    tts = VoxcastWebsocketTTSService(base_url=base_url, api_key=KEY, extra=extra)

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        await worker.queue_frame(LLMFullResponseStartFrame())
        for token in _tokens(first):
            await worker.queue_frame(LLMTextFrame(token))
        await worker.queue_frame(TTSSpeakFrame(aside))
        for token in _tokens(rest):
            await worker.queue_frame(LLMTextFrame(token))
        await worker.queue_frame(LLMFullResponseEndFrame())

    sink = asyncio.run(_run(tts, script, 16000))
    assert _marks(sink) == "STSTE"
    reply = _pcm(service, first, extra) + _pcm(service, rest.strip(), extra)
    assert _turn_audio(sink) == [reply, _pcm(service, aside, extra)]
    assert not sink.errors()


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Service]]:
    """A server of the toy family (tests/toy_family), whose utterances, unlike the tiny model's, end
    where their text does (so they carry word timestamps), taking their text as complete after 0.3 s
    without any."""
    registry.register(toy_family.MODULE)
    engine = Engine.load(EngineConfig(model=str(build_cached("toy_sine")), device="cpu", text_wait_s=0.3))
    service = Service.assemble(ServiceConfig(), engine, LocalBlobStore(tmp_path_factory.mktemp("toy")))
    try:
        with running(create_app(ServiceHolder(service), HttpConfig(api_key=KEY))) as url:
            yield url, service
    finally:
        service.close()


def _toy_words(text: str, offset_s: float) -> list[float]:
    """When each word of the toy's utterance ``text`` starts (s), the utterance starting at ``offset_s``."""
    samples = toy_family.SAMPLES_PER_FRAME * FRAMES_PER_WORD * len(text.split())
    audio = sine(toy_family.PITCHES["low"], 0, samples, toy_family.SAMPLE_RATE, 0.3)
    return [offset_s + w.start_ms / 1000 for w in estimate_word_times(text, audio, toy_family.SAMPLE_RATE)]


@pytest.mark.parametrize("word_timestamps", [True, False])
def test_words_reach_the_pipeline_as_they_play(
    toy_server: tuple[str, Service], word_timestamps: bool
) -> None:
    """With word timestamps a ``TTSTextFrame`` per word, stamped with when it plays. The LLM pauses
    mid-reply past the server's text wait, so the reply is two utterances in one turn: the second
    one's words count from the turn's first audio, not their own. Without, the text comes whole after
    its audio (Pipecat's way for a service without them).

    The pause comes after a sentence's first word, as an LLM's would: Pipecat learns that a sentence
    ended from the token after it, and a sentence's words that arrive in the middle of that (a pause
    right after its period, as long as the server's text wait) may be pushed out of order."""
    url, service = toy_server
    first, rest = "Thanks for calling us today. See", " you soon."
    opened = Recorder(service)
    try:
        tts = VoxcastWebsocketTTSService(
            base_url=url,
            api_key=KEY,
            settings=VoxcastWebsocketTTSService.Settings(voice="low"),
            word_timestamps=word_timestamps,
        )

        async def script(worker: PipelineWorker, sink: Sink) -> None:
            await worker.queue_frame(LLMFullResponseStartFrame())
            for token in _tokens(first):
                await worker.queue_frame(LLMTextFrame(token))
            await asyncio.to_thread(lambda: ended(opened.stream(0)))  # the pause
            for token in _tokens(rest):
                await worker.queue_frame(LLMTextFrame(token))
            await worker.queue_frame(LLMFullResponseEndFrame())
            await asyncio.wait_for(_stopped(sink), 60)

        sink = asyncio.run(_run(tts, script, toy_family.SAMPLE_RATE))
    finally:
        opened.restore()
    assert len(opened.streams) == 2 and not sink.errors()
    spoken = [f for f in sink.frames if isinstance(f, TTSTextFrame)]
    if not word_timestamps:
        assert "".join(f.text for f in spoken).split() == (first + rest).split()
        return
    assert [f.text for f in spoken] == (first + rest).split()
    parts = [TextPartForConcatenation(f.text, f.includes_inter_frame_spaces) for f in spoken]
    assert concatenate_aggregated_text(parts).strip() == first + rest  # what the context gets
    first_s = toy_family.SAMPLES_PER_FRAME * FRAMES_PER_WORD * len(first.split()) / toy_family.SAMPLE_RATE
    expected = _toy_words(first, 0.0) + _toy_words(rest.strip(), first_s)
    got = [(f.pts - spoken[0].pts) / 1e9 for f in spoken]
    assert got == pytest.approx([t - expected[0] for t in expected], abs=0.002)


def test_cjk_words_reach_the_context_without_spaces(toy_server: tuple[str, Service]) -> None:
    """A Japanese reply is one word per character (voxcast.text.words): the context gets it back as
    written, not with a space between characters."""
    url, _ = toy_server
    text = "今日は晴れです。"
    tts = VoxcastWebsocketTTSService(
        base_url=url, api_key=KEY, settings=VoxcastWebsocketTTSService.Settings(voice="low")
    )

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        await worker.queue_frame(LLMFullResponseStartFrame())
        for token in ("今日", "は晴", "れです", "。"):
            await worker.queue_frame(LLMTextFrame(token))
        await worker.queue_frame(LLMFullResponseEndFrame())
        await asyncio.wait_for(_stopped(sink), 60)

    sink = asyncio.run(_run(tts, script, toy_family.SAMPLE_RATE))
    spoken = [f for f in sink.frames if isinstance(f, TTSTextFrame)]
    assert [f.text for f in spoken] == [*"今日は晴れで", "す。"] and not sink.errors()
    parts = [TextPartForConcatenation(f.text, f.includes_inter_frame_spaces) for f in spoken]
    assert concatenate_aggregated_text(parts).strip() == text


@pytest.mark.parametrize(
    "word_timestamps", [None, True, False], ids=["http", "websocket-word-timestamps", "websocket"]
)
def test_a_bare_text_frames_words_reach_the_context(
    toy_server: tuple[str, Service], word_timestamps: bool | None
) -> None:
    """A ``TextFrame`` outside any reply (two sentences), then the end of the LLM response: every
    word spoken reaches the assistant context (a real aggregator downstream) and Pipecat drops none
    ("... not recognised by any slot"), over HTTP (``None``) and the WebSocket with and without word
    timestamps. Words are compared, not spacing: without word timestamps Pipecat's ``TOKEN`` mode
    hands over each later sentence with its leading space (" Goodbye."), in a reply as well."""
    url, _ = toy_server
    text = "Hello there. Goodbye."
    settings = VoxcastTTSService.Settings(voice="low")
    tts: VoxcastTTSService | VoxcastWebsocketTTSService = (
        VoxcastTTSService(base_url=url, api_key=KEY, settings=settings)
        if word_timestamps is None
        else VoxcastWebsocketTTSService(
            base_url=url, api_key=KEY, settings=settings, word_timestamps=word_timestamps
        )
    )
    context = LLMContext()
    warnings: list[str] = []
    handler = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")

    async def script(worker: PipelineWorker, sink: Sink) -> None:
        await worker.queue_frame(TextFrame(text))
        await worker.queue_frame(LLMFullResponseEndFrame())
        while not any(isinstance(f, LLMFullResponseEndFrame) for f in sink.frames):
            await asyncio.sleep(0.02)

    try:
        aggregator = LLMAssistantAggregator(context)
        sink = asyncio.run(_run(tts, script, toy_family.SAMPLE_RATE, downstream=aggregator))
    finally:
        logger.remove(handler)
    spoken = [f.text for f in sink.frames if isinstance(f, TTSTextFrame) and f.append_to_context]
    assert " ".join(spoken).split() == text.split()
    said = [m["content"] for m in context.get_messages() if m.get("role") == "assistant"]
    assert len(said) == 1 and said[0].split() == text.split()
    assert [w for w in warnings if "not recognised by any slot" in w] == [] and not sink.errors()
