"""The HTTP server's pieces without a server: OpenAI body mapping, settings, endpoint choice, the pump's
stall guard."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from voxcast.audio.formats import AudioFormat
from voxcast.engine.request import parse_request
from voxcast.errors import InvalidRequest
from voxcast.serving.endpoint import endpoint_type
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.http.speech import speech_request
from voxcast.serving.pump import ThreadPump


def test_openai_body_maps_onto_the_request_schema() -> None:
    fields, fmt = speech_request(
        {
            "model": "tts-1",
            "input": "Hi.",
            "voice": {"id": "vx_1"},
            "instructions": "calm",
            "speed": 1,
            "seed": 4,
        }
    )
    req = parse_request(fields)
    assert (req.text, req.voice, req.instruct, req.speed, req.sampling.seed) == (
        "Hi.",
        "vx_1",
        "calm",
        1.0,
        4,
    )
    assert req.response_format is AudioFormat.MP3  # OpenAI's default, where voxcast's is wav
    assert fmt == "audio"
    assert speech_request({"input": "x", "stream_format": "sse", "response_format": "pcm"})[1] == "sse"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([1], "request"),
        ({"input": "x", "stream_format": "ws"}, "stream_format"),
        ({"input": "x", "voice": {"name": "a"}}, "voice.id"),
        ({"input": "x", "instructions": "a", "instruct": "b"}, "instructions"),
        ({"input": "x", "model": 3}, "model"),
    ],
)
def test_openai_body_errors_name_the_field(body: object, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_request(speech_request(body)[0])
    assert err.value.field == field


def test_http_settings_from_the_environment() -> None:
    assert HttpConfig.from_env({}) == HttpConfig()
    c = HttpConfig.from_env(
        {"PORT": "9000", "PORT_HEALTH": "9001", "VOXCAST_API_KEY": " k ", "VOXCAST_HOST": "0.0.0.0"}
    )
    assert (c.port, c.health_port, c.api_key, c.host, c.separate_health_port) == (
        9000,
        9001,
        "k",
        "0.0.0.0",
        True,
    )
    assert HttpConfig.from_env({"PORT": "9000", "VOXCAST_PORT": "7000"}).port == 7000
    assert not HttpConfig.from_env({"PORT": "9000", "PORT_HEALTH": "9000"}).separate_health_port
    assert HttpConfig.from_env({"VOXCAST_HTTP_MAX_BODY_MB": "0.5"}).max_body_bytes == 512 * 1024
    for env in ({"PORT": "x"}, {"VOXCAST_PORT": "70000"}, {"VOXCAST_HTTP_STALL_S": "0"}):
        with pytest.raises(ValueError, match=next(iter(env))):
            HttpConfig.from_env(env)


def test_endpoint_type_picks_queue_or_http() -> None:
    assert endpoint_type({}) == "queue"
    assert endpoint_type({"VOXCAST_ENDPOINT_TYPE": "HTTP"}) == "http"
    assert endpoint_type({"VOXCAST_ENDPOINT_TYPE": "load_balancer"}) == "http"
    with pytest.raises(ValueError, match="VOXCAST_ENDPOINT_TYPE"):
        endpoint_type({"VOXCAST_ENDPOINT_TYPE": "serverless"})


def test_a_pump_whose_consumer_stops_reading_gives_up_and_drains() -> None:
    stopped = threading.Event()

    def source() -> Iterator[int]:
        i = 0
        while not stopped.is_set() and i < 10_000:
            yield i
            i += 1

    async def main() -> tuple[list[int], ThreadPump[int]]:
        pump = ThreadPump(source(), maxsize=2, stall_s=0.05, on_stall=stopped.set).start()
        first = [await pump.__anext__()]
        assert await pump.wait_finished(30)  # never read again: the pump gives up, the source stops
        return first + [item async for item in pump], pump

    got, pump = asyncio.run(main())
    assert pump.stalled and stopped.is_set()
    assert got == list(range(len(got))) and len(got) <= 4  # what was handed over before the stall, in order


def test_a_pump_keeps_reporting_its_end() -> None:
    async def main() -> int:
        pump: ThreadPump[int] = ThreadPump(iter(())).start()
        ends = 0
        for _ in range(3):  # an empty source: the end, again and again (never a hang)
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(pump.__anext__(), 10)
            ends += 1
        assert pump.finished
        return ends

    assert asyncio.run(main()) == 3


def test_query_string_keys_are_redacted() -> None:
    from voxcast.logs import redact

    line = '"WebSocket /v1/audio/speech/stream?x=1&api_key=sk-secret" [accepted] redis://:pw@host/0'
    assert (
        redact(line) == '"WebSocket /v1/audio/speech/stream?x=1&api_key=***" [accepted] redis://:***@host/0'
    )
