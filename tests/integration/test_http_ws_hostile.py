"""voxcast's WebSockets against hostile clients: text frames that are not UTF-8, a lone surrogate in
``stream_sid``, a flood of text deltas past the unspoken-text limit. Real uvicorn on a free loopback
port (tiny CustomVoice model), driven with ``websockets``; what the server logs is read with caplog."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.fixtures.http_server import messages_until, running
from voxcast.service import Service
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig

CONFIG = {"type": "config", "voice": "ryan", "seed": 5, "max_frames": 3, "cache": False}
STREAM = "/v1/audio/speech/stream"
NARI = "/v1/audio/speech/ws"


@pytest.fixture(scope="module")
def url(tiny_service: Service) -> Iterator[str]:
    with running(create_app(ServiceHolder(tiny_service), HttpConfig())) as base:
        yield base.replace("http://", "ws://")


def _open(url: str, path: str = STREAM) -> ClientConnection:
    protocols: Any = ["nari.speech.v1"] if path == NARI else None
    return connect(url + path, subprotocols=protocols, open_timeout=30)


def _errors(msgs: list[Any]) -> list[dict[str, Any]]:
    return [m for m in msgs if isinstance(m, dict) and m.get("type") == "error"]


def _speaks(ws: ClientConnection) -> None:
    """The connection still serves: a config, a sentence and a flush give audio and no error."""
    ws.send(json.dumps(CONFIG))
    ws.send(json.dumps({"type": "text", "text": "Still here."}))
    ws.send(json.dumps({"type": "flush"}))
    msgs = messages_until(ws, "segment_done")
    assert not _errors(msgs), msgs
    assert any(isinstance(m, bytes) for m in msgs)


def _invalid_utf8_closes(service: Service) -> float:
    value = service.metrics.registry.get_sample_value("voxcast_websocket_invalid_utf8_total")
    return value or 0.0


@pytest.mark.parametrize("path", [STREAM, NARI], ids=["stream", "nari"])
def test_invalid_utf8_closes_1007_with_one_info_line_per_connection_and_a_count(
    url: str, tiny_service: Service, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    caplog.set_level(logging.INFO)
    before = _invalid_utf8_closes(tiny_service)
    n = 10
    for _ in range(n):
        with _open(url, path) as ws:
            ws.send(b"\xff\xfe bad", text=True)  # a text frame that is not UTF-8
            with pytest.raises(ConnectionClosed) as closed:
                while True:  # nari.speech.v1 may greet first
                    ws.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    server = [r for r in caplog.records if not r.name.startswith("websockets.client")]
    assert not [r for r in server if r.levelno >= logging.WARNING or r.exc_info], [
        (r.name, r.getMessage()) for r in server if r.levelno >= logging.WARNING
    ]
    assert len([r for r in server if "not valid UTF-8" in r.getMessage()]) == n
    assert _invalid_utf8_closes(tiny_service) - before == n
    with _open(url) as ws:
        _speaks(ws)


def test_a_lone_surrogate_in_stream_sid_is_an_error_event_naming_it(url: str) -> None:
    with _open(url) as ws:
        ws.send('{"type": "config", "voice": "ryan", "framing": "twilio", "stream_sid": "MZ\\ud800"}')
        event = json.loads(ws.recv(timeout=60))
        assert event["type"] == "error" and event["error"]["param"] == "stream_sid", event
        assert "surrogate" in event["error"]["message"]
        _speaks(ws)


def _flood(ws: ClientConnection, deltas: int) -> list[Any]:
    """``deltas`` deltas of 1000 characters without a sentence end (20 fit the limit), then a clear."""
    for _ in range(deltas):
        ws.send(json.dumps({"type": "text", "text": "a" * 999 + " "}))
    ws.send(json.dumps({"type": "clear"}))
    return messages_until(ws, "cleared")


def test_a_flood_past_the_unspoken_text_limit_gets_one_error_until_a_clear(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with _open(url) as ws:
        ws.send(json.dumps({**CONFIG, "text_mode": "sentences"}))
        first = _errors(_flood(ws, 60))
        assert len(first) == 1 and first[0]["error"]["param"] == "text", first
        assert "unspoken" in first[0]["error"]["message"]
        again = _errors(_flood(ws, 60))  # after the clear the limit applies afresh: one error again
        assert len(again) == 1, again
        _speaks(ws)
    voxcast = [r for r in caplog.records if r.name.startswith("voxcast")]
    assert len(voxcast) < 40, [r.getMessage() for r in voxcast]
