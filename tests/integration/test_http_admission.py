"""Admission control against the real server (uvicorn on loopback): a model slow enough that one more
stream would not keep real time is refused with 503 ``over_capacity`` and ``Retry-After``, while the
stream already running plays on without a stall and the queue entry points wait and complete.

The model is the toy family (tests/toy_family) with ``toy_step_ms=10``: each batched step sleeps 10 ms
per row. With ``admission_load=0.2`` a step may take 16 ms of the toy's 80 ms frame, so one stream
(10 ms) fits and two (20 ms) do not; an idle engine always admits.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

from tests.fixtures.http_server import Recorder, ended, running, wait_until
from tests.fixtures.models import build_cached
from tests.toy_family.family import PITCHES, SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.toy_family.model import FRAMES_PER_WORD, sine
from voxcast import Engine, EngineConfig
from voxcast.audio.pcm import float_to_int16
from voxcast.models import registry
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.runpod.config import RunpodConfig
from voxcast.serving.runpod.handler import RunpodHandler
from voxcast.storage.local import LocalBlobStore

FAMILY_MODULE = "tests.toy_family.family"
LONG = " ".join(["word"] * 60)  # 180 frames: 14.4 s of audio, at least 1.8 s of 10 ms steps
SHORT = "Thanks for calling."
AMPLITUDE = 0.3  # the toy's default


def _pcm(text: str, voice: str = "low") -> bytes:
    frames = FRAMES_PER_WORD * len(text.split())
    tone = sine(PITCHES[voice], 0, frames * SAMPLES_PER_FRAME, SAMPLE_RATE, AMPLITUDE)
    return float_to_int16(tone).tobytes()


def _body(text: str) -> dict[str, Any]:
    return {
        "input": text,
        "voice": "low",
        "response_format": "pcm",
        "sample_rate": SAMPLE_RATE,
        "cache": False,
    }


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    registry.register(FAMILY_MODULE)
    config = EngineConfig(
        model=str(build_cached("toy_sine")),
        device="cpu",
        warmup=False,
        settings={"toy_step_ms": 10},
        admission_load=0.2,
    )
    engine = Engine.load(config)
    store = LocalBlobStore(tmp_path_factory.mktemp("store"), fsync=False)
    svc = Service.assemble(ServiceConfig(store_audio=False), engine, store)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def url(service: Service) -> Iterator[str]:
    with running(create_app(ServiceHolder(service), HttpConfig())) as base:
        yield base


def _over_capacity_once_measured(service: Service) -> None:
    """Wait until the running stream's steps are measured and one more would not fit."""
    wait_until(lambda: 1 in service.engine.capacity()["step_ms"], 30, "measured steps")
    assert service.engine.over_capacity() is not None


HTTP_REFUSED = r'voxcast_requests_total\{entry="http".*outcome="over_capacity"\} (\S+)'
ENGINE_REFUSED = r"^voxcast_engine_refused_total (\S+)"


def _count(metrics: str, pattern: str) -> float:
    """A counter's value in a /metrics page (0 before its first increment)."""
    found = re.search(pattern, metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_past_capacity_the_speech_route_answers_503_and_the_running_stream_plays_on(
    service: Service, url: str
) -> None:
    rec = Recorder(service)
    sdk = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            before = http.get("/metrics").text  # the module's other tests refuse requests too
            assert service.engine.over_capacity() is None  # idle: admits
            with http.stream("POST", "/v1/audio/speech", json=_body(LONG)) as running_one:
                assert running_one.status_code == 200
                _over_capacity_once_measured(service)
                health = http.get("/health").json()["capacity"]
                refused = http.post("/v1/audio/speech", json=_body(SHORT))
                with pytest.raises(openai.InternalServerError) as by_sdk:
                    sdk.audio.speech.create(model="tts", input=SHORT, voice="low", response_format="pcm")
                body = running_one.read()
            assert health["over_capacity"] and "1" in health["step_ms"]  # why the next one is refused
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            error = refused.json()["error"]
            assert error["code"] == "over_capacity" and "VOXCAST_ADMISSION_LOAD" in error["message"]
            assert by_sdk.value.status_code == 503 and by_sdk.value.code == "over_capacity"
            assert body == _pcm(LONG)  # the running stream: all of its audio, to its end
            # (not "no stall": the toy steps 8x faster than real time, so a host hiccup of 70 ms would
            # be one, and refusals cost the running stream nothing the test could tell from that)
            assert ended(rec.stream(0)).timing.finish_reason == "eos"
            again = http.post("/v1/audio/speech", json=_body(SHORT))  # idle again: served
            assert again.status_code == 200 and again.content == _pcm(SHORT)
            metrics = http.get("/metrics").text
        assert _count(metrics, HTTP_REFUSED) - _count(before, HTTP_REFUSED) == 2
        assert _count(metrics, ENGINE_REFUSED) - _count(before, ENGINE_REFUSED) == 2
    finally:
        rec.restore()


def test_a_websocket_start_past_capacity_gets_an_over_capacity_error(service: Service, url: str) -> None:
    with (
        httpx.Client(base_url=url, timeout=60) as http,
        http.stream("POST", "/v1/audio/speech", json=_body(LONG)) as running_one,
    ):
        _over_capacity_once_measured(service)
        with connect(_ws_url(url), open_timeout=30) as ws:
            ws.send(json.dumps({"type": "config", "voice": "low", "cache": False}))
            ws.send(json.dumps({"type": "text", "text": SHORT}))
            ws.send(json.dumps({"type": "close"}))
            msgs = []
            while not msgs or msgs[-1].get("type") != "closed":
                raw = ws.recv(timeout=30)
                if isinstance(raw, str):
                    msgs.append(json.loads(raw))
        assert running_one.read() == _pcm(LONG)
    errors = [m for m in msgs if m["type"] == "error"]
    assert errors and errors[0]["error"]["code"] == "over_capacity" and errors[0]["retry_after_s"] == 1


def test_queue_entry_points_wait_for_room_and_complete(service: Service, url: str) -> None:
    """The RunPod queue handler and an RQ job's call are never refused: they queue in the engine."""
    got: dict[str, Any] = {}

    def runpod_job() -> None:
        async def collect() -> list[dict[str, Any]]:
            handler = RunpodHandler(service, RunpodConfig())
            job = {"text": SHORT, "voice": "low", "response_format": "pcm", "sample_rate": SAMPLE_RATE}
            return [m async for m in handler.handle({"id": "job-1", "input": {**job, "cache": False}})]

        got["runpod"] = asyncio.run(collect())

    def rq_call() -> None:  # what voxcast.serving.rq.jobs.synthesize runs
        fields = {"text": SHORT, "voice": "low", "response_format": "pcm", "sample_rate": SAMPLE_RATE}
        got["rq"] = b"".join(c.data for c in service.synthesize({**fields, "cache": False}, entry="rq"))

    with (
        httpx.Client(base_url=url, timeout=60) as http,
        http.stream("POST", "/v1/audio/speech", json=_body(LONG)) as running_one,
    ):
        _over_capacity_once_measured(service)
        threads = [threading.Thread(target=f) for f in (runpod_job, rq_call)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert running_one.read() == _pcm(LONG)
    assert got["rq"] == _pcm(SHORT)
    messages = got["runpod"]
    audio = b"".join(base64.b64decode(m["audio"]) for m in messages if "audio" in m and not m.get("done"))
    assert audio == _pcm(SHORT) and "error" not in messages[-1]


def _socket_until_closed(ws: Any) -> tuple[list[dict[str, Any]], bytes]:
    """Every event and all the audio of a socket, up to its ``closed`` event."""
    events: list[dict[str, Any]] = []
    audio = b""
    while not events or events[-1].get("type") != "closed":
        raw = ws.recv(timeout=30)
        if isinstance(raw, str):
            events.append(json.loads(raw))
        else:
            audio += raw
    return events, audio


def _next_event(ws: Any, kind: str, audio: bytearray) -> dict[str, Any]:
    """The socket's next ``kind`` event; the audio before it is added to ``audio``."""
    while True:
        raw = ws.recv(timeout=30)
        if not isinstance(raw, str):
            audio += raw
        elif (event := json.loads(raw))["type"] == kind:
            return event


def _socket_audio(url: str, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bytes]:
    """A fresh socket's events and audio for ``messages`` (then ``close``)."""
    with connect(_ws_url(url), open_timeout=30) as ws:
        for message in [*messages, {"type": "close"}]:
            ws.send(json.dumps(message))
        return _socket_until_closed(ws)


WS_CONFIG = {"type": "config", "voice": "low", "cache": False, "sample_rate": SAMPLE_RATE}


def _ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream"


def _refuse_a_turn(service: Service, url: str, ws: Any, early: bytearray) -> dict[str, Any]:
    """Configure ``ws`` and start a turn ("Thanks ") while an HTTP stream holds the engine over
    capacity: the turn's error event, once that stream has ended and there is room again."""
    ws.send(json.dumps(WS_CONFIG))
    with (
        httpx.Client(base_url=url, timeout=60) as http,
        http.stream("POST", "/v1/audio/speech", json=_body(LONG)) as running_one,
    ):
        _over_capacity_once_measured(service)
        ws.send(json.dumps({"type": "text", "text": "Thanks "}))
        refused = _next_event(ws, "error", early)
        assert running_one.read() == _pcm(LONG)
    wait_until(lambda: service.engine.over_capacity() is None, 30, "room again")
    return refused


def test_a_refused_websocket_turn_is_dropped_whole(service: Service, url: str) -> None:
    """Words after a refused turn's first ones are not spoken once room frees up: never the middle of a
    reply without its start. The next turn is admitted."""
    early = bytearray()
    with connect(_ws_url(url), open_timeout=30) as ws:
        refused = _refuse_a_turn(service, url, ws, early)
        ws.send(json.dumps({"type": "text", "text": "for calling."}))  # the refused turn's rest
        ws.send(json.dumps({"type": "flush"}))
        ws.send(json.dumps({"type": "text", "text": SHORT}))  # the next turn
        ws.send(json.dumps({"type": "close"}))
        events, audio = _socket_until_closed(ws)
    assert refused["error"]["code"] == "over_capacity" and refused["retry_after_s"] == 1
    assert not [e for e in events if e["type"] == "error"]
    alone = _socket_audio(url, [WS_CONFIG, {"type": "text", "text": SHORT}])[1]
    assert early + audio == alone and len(alone) > 0  # the next turn's, nothing of the refused one


def test_a_websocket_turn_under_way_is_not_refused(service: Service, url: str) -> None:
    """Sentences mode: the turn's second sentence starts while the engine is over capacity (a queue
    job's stream twice as long started during the first): it is part of a reply already playing, so
    it is spoken."""
    first = " ".join(["word"] * 30) + "."  # 90 frames; the queue job's 180 outlast it
    job_done = threading.Event()
    got: dict[str, bytes] = {}

    def queue_job() -> None:  # never refused: it waits for room (what an RQ job runs)
        fields = {"text": LONG, "voice": "low", "response_format": "pcm", "sample_rate": SAMPLE_RATE}
        got["job"] = b"".join(c.data for c in service.synthesize({**fields, "cache": False}, entry="rq"))
        job_done.set()

    config = {**WS_CONFIG, "text_mode": "sentences"}
    early = bytearray()
    with connect(_ws_url(url), open_timeout=30) as ws:
        ws.send(json.dumps(config))
        ws.send(json.dumps({"type": "text", "text": f"{first} {SHORT}"}))
        ws.send(json.dumps({"type": "flush"}))
        assert _next_event(ws, "started", early)["segment"] == 0
        job = threading.Thread(target=queue_job)
        job.start()
        _over_capacity_once_measured(service)  # the sentence and the job: one more is refused
        second = _next_event(ws, "started", early)
        over_capacity_then = not job_done.is_set()  # the job still ran when the second sentence opened
        ws.send(json.dumps({"type": "close"}))
        events, audio = _socket_until_closed(ws)
        job.join(60)
    assert second["segment"] == 1 and over_capacity_then
    assert not [e for e in events if e["type"] == "error"]
    assert got["job"] == _pcm(LONG)
    alone = _socket_audio(url, [config, {"type": "text", "text": f"{first} {SHORT}"}, {"type": "flush"}])
    assert early + audio == alone[1]


def test_a_pause_as_long_as_the_text_wait_ends_a_refused_turn(
    service: Service, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that never sends flush or mark: after a refusal, text that comes after a pause longer
    than VOXCAST_TEXT_WAIT_S (here 0.2 s) is a new turn, admitted, not dropped forever."""
    from voxcast.serving.http.ws import SpeechSocket

    monkeypatch.setattr(SpeechSocket, "_text_wait_s", property(lambda self: 0.2))
    early = bytearray()
    with connect(_ws_url(url), open_timeout=30) as ws:
        refused = _refuse_a_turn(service, url, ws, early)
        threading.Event().wait(0.3)  # the client pauses longer than the text wait (the input, not a check)
        ws.send(json.dumps({"type": "text", "text": SHORT}))
        ws.send(json.dumps({"type": "close"}))
        events, audio = _socket_until_closed(ws)
    assert refused["error"]["code"] == "over_capacity"
    assert not [e for e in events if e["type"] == "error"]
    alone = _socket_audio(url, [WS_CONFIG, {"type": "text", "text": SHORT}])[1]
    assert early + audio == alone and len(alone) > 0
