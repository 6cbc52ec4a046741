"""voxcast.integrations.livekit.TTS driven through LiveKit Agents' own TTS machinery (its
SynthesizeStream / ChunkedStream tasks, AudioEmitter, retries) against a running voxcast HTTP server
on a free loopback port (tiny CustomVoice model; the toy family for word times). No LiveKit server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("livekit.agents", reason="the livekit extra is not installed")

from livekit.agents import APIConnectOptions, APIStatusError, tts, utils
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, TimedString

from tests.fixtures.engines import holding_steps
from tests.fixtures.http_server import Recorder, ended, running, wait_until
from tests.fixtures.models import build_cached
from tests.toy_family import family as toy_family
from tests.toy_family.model import FRAMES_PER_WORD, sine
from voxcast.audio.word_times import estimate_word_times
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.integrations.livekit import TTS
from voxcast.models import registry
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.http.ws import SpeechSocket
from voxcast.storage.local import LocalBlobStore

KEY = "sk-livekit"
TEXT = "Sure, I can help with that. Your order shipped yesterday."


@pytest.fixture(scope="module")
def service(tiny_service: Service) -> Service:
    return tiny_service


@pytest.fixture(scope="module")
def base_url(service: Service) -> Iterator[str]:
    with running(create_app(ServiceHolder(service), HttpConfig(api_key=KEY))) as url:
        yield url


@pytest.fixture
def sockets(monkeypatch: pytest.MonkeyPatch) -> list[SpeechSocket]:
    """Every WebSocket connection the servers serve from now on, in order."""
    served: list[SpeechSocket] = []
    run = SpeechSocket.run

    async def counted(self: SpeechSocket) -> None:
        served.append(self)
        await run(self)

    monkeypatch.setattr(SpeechSocket, "run", counted)
    return served


def _tokens(text: str) -> list[str]:
    """LLM-like tokens: a word with its leading space, long words in parts."""
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        word = word if i == 0 else " " + word
        out += [word[j : j + 4] for j in range(0, len(word), 4)]
    return out


def _pcm(service: Service, text: str, extra: dict[str, Any], rate: int = 16000) -> bytes:
    """What the server makes of ``text`` as one request (streaming-text layout, 16-bit PCM)."""
    request = {"text": text, "voice": "ryan", "response_format": "pcm", "sample_rate": rate, **extra}
    return b"".join(c.data for c in service.synthesize({**request, "non_streaming_text": False}))


def _run(script: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``script`` in LiveKit's HTTP session context (what a job process has), bounded in time."""

    async def main() -> Any:
        async with utils.http_context.open():
            return await asyncio.wait_for(script(), 120)

    return asyncio.run(main())


async def _reply(
    stream: tts.SynthesizeStream,
    text: str,
    pause_at: int = -1,
    pause: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """An LLM writing ``text`` into ``stream`` token by token, with ``pause`` before token ``pause_at``."""
    for i, token in enumerate(_tokens(text)):
        if i == pause_at and pause is not None:
            await pause()
        stream.push_text(token)
        await asyncio.sleep(0.005)
    stream.end_input()


async def _speak(voice: TTS, text: str) -> list[tts.SynthesizedAudio]:
    """One reply through ``voice.stream()``, as an agent's ``tts_node`` drives it."""
    async with voice.stream() as stream:
        feed = asyncio.create_task(_reply(stream, text))
        events = [ev async for ev in stream]
        await feed
    return events


def _audio(events: list[tts.SynthesizedAudio]) -> bytes:
    return b"".join(bytes(ev.frame.data) for ev in events)


@pytest.mark.parametrize("how", ["stream", "synthesize"])
def test_a_reply_pushed_token_by_token_is_the_whole_texts_audio(
    base_url: str, service: Service, sockets: list[SpeechSocket], how: str
) -> None:
    """The reply's tokens feed one utterance as they come: with a seed its audio is byte for byte
    the whole text's (16 kHz mono PCM, as the TTS declares), one segment ending with a final
    frame; ``synthesize`` of the whole text gives the same bytes."""
    extra = {"seed": 6, "max_frames": 30, "cache": False}
    opened = Recorder(service)
    try:

        async def script() -> list[tts.SynthesizedAudio]:
            voice = TTS(base_url=base_url, api_key=KEY, voice="ryan", sample_rate=16000, extra=extra)
            try:
                if how == "stream":
                    return await _speak(voice, TEXT)
                async with voice.synthesize(TEXT) as chunked:
                    return [ev async for ev in chunked]
            finally:
                await voice.aclose()

        events = _run(script)
    finally:
        opened.restore()
    assert len(opened.streams) == 1 and len(sockets) == 1  # one utterance for the whole reply
    assert all(ev.frame.sample_rate == 16000 and ev.frame.num_channels == 1 for ev in events)
    assert _audio(events) == _pcm(service, TEXT, extra)
    assert events[-1].is_final and not any(ev.is_final for ev in events[:-1])
    assert len({ev.segment_id for ev in events}) == 1


def test_an_interruption_stops_the_server_within_one_frame_and_the_connection_serves_on(
    base_url: str, service: Service, sockets: list[SpeechSocket]
) -> None:
    """An agent's barge-in closes the reply's stream mid-audio: nothing more comes out of it, the
    server's utterance is cancelled within one frame (the engine is held after its first step, so
    the cancel lands mid-utterance however fast the host), and the next reply on the same pooled
    connection is its own audio only, none of the cut-off one's."""
    extra = {"seed": 6, "max_frames": 30, "first_chunk_frames": 1, "chunk_frames": 1, "cache": False}
    opened = Recorder(service)
    cut: dict[str, Any] = {}
    try:

        async def script() -> list[tts.SynthesizedAudio]:
            voice = TTS(base_url=base_url, api_key=KEY, voice="ryan", sample_rate=16000, extra=extra)
            try:
                with holding_steps(service.engine) as release:
                    stream = voice.stream()
                    for token in _tokens("A long answer that the caller talks over, and over again."):
                        stream.push_text(token)
                    await stream.__anext__()  # its first audio
                    await stream.aclose()  # what the agent does on an interruption
                    cut["after"] = [ev async for ev in stream]
                    utterance = opened.stream(0)
                    await asyncio.to_thread(
                        wait_until, lambda: utterance.cancelled, 10, "the server's cancel"
                    )
                    cut["steps"] = service.engine.stats()["steps"]
                    release.set()
                    cut["result"] = await asyncio.to_thread(ended, utterance)
                    cut["steps_after"] = service.engine.stats()["steps"]
                while voice._settling:  # until the server answered the clear: the connection is free
                    await asyncio.sleep(0.01)
                return await _speak(voice, TEXT)
            finally:
                await voice.aclose()

        events = _run(script)
    finally:
        opened.restore()
    assert cut["after"] == []  # nothing of the reply after the interruption
    result = cut["result"]
    assert result.timing.finish_reason == "cancelled"
    assert result.timing.frames <= 2  # the first, and the one held when the cancel came
    assert cut["steps_after"] <= cut["steps"] + 1  # one more at most, begun before the cancel
    assert len(sockets) == 1  # the next reply reused the connection
    assert _audio(events) == _pcm(service, TEXT, extra)


@pytest.mark.parametrize("capacity_wait_s", [3.0, 0.0])
def test_a_reply_refused_past_capacity_is_sent_again_after_retry_after(
    base_url: str, service: Service, monkeypatch: pytest.MonkeyPatch, capacity_wait_s: float
) -> None:
    """The server refuses the reply's turn once (``over_capacity``, ``retry_after_s`` 1, the rest
    of the turn dropped): the TTS sends the whole reply again after it, spoken whole, byte for byte;
    with ``capacity_wait_s=0`` the stream fails with a 503 LiveKit does not retry."""
    extra = {"seed": 6, "max_frames": 30, "cache": False}
    asked: list[int] = []

    def busy_once() -> str | None:  # the engine's admission check, refusing the first stream only
        asked.append(1)
        return "test" if len(asked) == 1 else None

    monkeypatch.setattr(service.engine, "over_capacity", busy_once)
    errors: list[tts.TTSError] = []

    async def script() -> list[tts.SynthesizedAudio] | APIStatusError:
        voice = TTS(
            base_url=base_url, api_key=KEY, voice="ryan", sample_rate=16000, extra=extra,
            capacity_wait_s=capacity_wait_s,
        )  # fmt: skip
        voice.on("error", errors.append)
        try:
            return await _speak(voice, TEXT)
        except APIStatusError as e:
            return e
        finally:
            await voice.aclose()

    got = _run(script)
    monkeypatch.undo()
    if capacity_wait_s == 0:
        assert isinstance(got, APIStatusError) and got.status_code == 503 and not got.retryable
        assert "over capacity: test" in got.message and len(asked) == 1
        assert [e.recoverable for e in errors] == [False]
        return
    assert not isinstance(got, APIStatusError)
    assert len(asked) == 2 and _audio(got) == _pcm(service, TEXT, extra) and not errors


def test_a_connection_the_server_drops_is_replaced_and_the_reply_spoken_whole(
    base_url: str, service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes the first connection as the reply starts (a restart, a proxy): LiveKit's
    retry (no audio was pushed yet) opens a new one and the reply is spoken whole."""
    extra = {"seed": 6, "max_frames": 30, "cache": False}
    served: list[SpeechSocket] = []
    run = SpeechSocket.run

    async def dropped_first(self: SpeechSocket) -> None:
        served.append(self)
        if len(served) == 1:
            await self.ws.close(code=1011)
            return
        await run(self)

    monkeypatch.setattr(SpeechSocket, "run", dropped_first)

    async def script() -> list[tts.SynthesizedAudio]:
        voice = TTS(base_url=base_url, api_key=KEY, voice="ryan", sample_rate=16000, extra=extra)
        try:
            async with voice.stream(conn_options=APIConnectOptions(max_retry=1)) as stream:
                feed = asyncio.create_task(_reply(stream, TEXT))
                events = [ev async for ev in stream]
                await feed
            return events
        finally:
            await voice.aclose()

    events = _run(script)
    assert len(served) == 2
    assert _audio(events) == _pcm(service, TEXT, extra)


def test_a_refused_voice_is_an_error_naming_the_field(base_url: str) -> None:
    """A voice the server does not have: a 400 naming ``voice``, not retried."""

    async def script() -> APIStatusError | None:
        voice = TTS(base_url=base_url, api_key=KEY, voice="nobody")
        try:
            await _speak(voice, "Hello.")
        except APIStatusError as e:
            return e
        finally:
            await voice.aclose()
        return None

    error = _run(script)
    assert error is not None and error.status_code == 400 and not error.retryable
    assert error.message.startswith("voxcast: voice:") and error.message.count("voice:") == 1


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


def _toy_words(text: str, offset_s: float) -> list[tuple[float, float]]:
    """When each word of the toy's utterance ``text`` starts and ends (s), the utterance starting
    at ``offset_s``."""
    samples = toy_family.SAMPLES_PER_FRAME * FRAMES_PER_WORD * len(text.split())
    audio = sine(toy_family.PITCHES["low"], 0, samples, toy_family.SAMPLE_RATE, 0.3)
    words = estimate_word_times(text, audio, toy_family.SAMPLE_RATE)
    return [(offset_s + w.start_ms / 1000, offset_s + w.end_ms / 1000) for w in words]


def test_transcripts_carry_word_times_from_the_replys_first_audio(toy_server: tuple[str, Service]) -> None:
    """Each word comes as a ``TimedString`` on the reply's frames, with its start and end. The LLM
    pauses mid-reply past the server's text wait, so the reply is two utterances in one segment:
    the second one's words count from the reply's first audio, not their own."""
    url, service = toy_server
    first, rest = "Thanks for calling us today. See", " you soon."
    opened = Recorder(service)
    try:

        async def pause() -> None:  # until the server took the first part as complete and spoke it
            await asyncio.to_thread(lambda: ended(opened.stream(0)))

        async def script() -> list[tts.SynthesizedAudio]:
            voice = TTS(base_url=url, api_key=KEY, voice="low", sample_rate=toy_family.SAMPLE_RATE)
            assert voice.capabilities.streaming and voice.capabilities.aligned_transcript
            try:
                async with voice.stream() as stream:
                    feed = asyncio.create_task(_reply(stream, first + rest, len(_tokens(first)), pause))
                    events = [ev async for ev in stream]
                    await feed
                return events
            finally:
                await voice.aclose()

        events = _run(script)
    finally:
        opened.restore()
    assert len(opened.streams) == 2
    words: list[TimedString] = [w for ev in events for w in ev.frame.userdata[USERDATA_TIMED_TRANSCRIPT]]
    assert "".join(words).strip() == first + rest  # what the transcript shows
    first_s = toy_family.SAMPLES_PER_FRAME * FRAMES_PER_WORD * len(first.split()) / toy_family.SAMPLE_RATE
    expected = _toy_words(first, 0.0) + _toy_words(rest.strip(), first_s)
    got = [t for w in words for t in (w.start_time, w.end_time)]
    assert got == pytest.approx([t for pair in expected for t in pair], abs=0.002)
    frames = FRAMES_PER_WORD * len((first + rest).split())
    assert len(_audio(events)) == 2 * toy_family.SAMPLES_PER_FRAME * frames  # both utterances, whole
