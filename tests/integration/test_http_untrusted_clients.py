"""The HTTP server against careless and hostile clients: deeply nested JSON, lone surrogates, odd
tracing headers, browser origins, non-JSON bodies, and what an API key closes. Real uvicorn on a free
loopback port (tiny CustomVoice model), driven with httpx, the ``openai`` SDK and ``websockets``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.fixtures.http_server import running
from voxcast.ids import REQUEST_ID_RE
from voxcast.service import Service
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.http.exposure import Exposure

KEY = "sk-untrusted"
AUTH = {"Authorization": f"Bearer {KEY}"}
SAY = {"input": "Hello there.", "voice": "ryan", "response_format": "pcm", "max_frames": 3, "seed": 2}
CONFIG = {"type": "config", "voice": "ryan", "seed": 5, "max_frames": 3, "cache": False}
APP = "http://app.example"


@pytest.fixture(scope="module")
def url(tiny_service: Service) -> Iterator[str]:
    """A server with an API key and one allowed browser origin."""
    config = HttpConfig(api_key=KEY, exposure=Exposure(cors_origins=(APP,)))
    with running(create_app(ServiceHolder(tiny_service), config)) as base:
        yield base


@pytest.fixture
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client


def _ws(url: str, **headers: str) -> ClientConnection:
    ws_url = url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    return connect(ws_url, additional_headers={**AUTH, **headers}, open_timeout=30)


def _until(ws: ClientConnection, kind: str) -> list[Any]:
    out: list[Any] = []
    while True:
        raw = ws.recv(timeout=60)
        msg = raw if isinstance(raw, bytes) else json.loads(raw)
        out.append(msg)
        if isinstance(msg, dict) and msg["type"] == kind:
            return out


def _speaks(ws: ClientConnection) -> bytes:
    """The connection still serves: a config, a sentence and a flush give audio."""
    ws.send(json.dumps(CONFIG))
    ws.send(json.dumps({"type": "text", "text": "Still here."}))
    ws.send(json.dumps({"type": "flush"}))
    msgs = _until(ws, "segment_done")
    assert not [m for m in msgs if isinstance(m, dict) and m["type"] == "error"], msgs
    return b"".join(m for m in msgs if isinstance(m, bytes))


def _ok(http: httpx.Client, **headers: str) -> httpx.Response:
    r = http.post("/v1/audio/speech", json=SAY, headers={**AUTH, **headers})
    assert r.status_code == 200, r.text
    assert len(r.content) == 3 * 3840
    return r


# -- JSON nested too deeply ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body", ["[" * 100_000, '{"input": ' + "[" * 40 + "]" * 40 + "}"], ids=["100000-deep", "valid-40-deep"]
)
def test_deeply_nested_json_is_400_naming_the_body(http: httpx.Client, body: str) -> None:
    r = http.post("/v1/audio/speech", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "request" and err["code"] == "invalid_request"
    assert "nested too deeply" in err["message"] or "not valid JSON" in err["message"]
    _ok(http)


def test_websocket_deeply_nested_message_is_an_error_event_and_the_connection_goes_on(url: str) -> None:
    with _ws(url) as ws:
        ws.send("[" * 100_000)
        event = json.loads(ws.recv(timeout=60))
        assert event["type"] == "error" and event["error"]["param"] == "message", event
        assert "nested too deeply" in event["error"]["message"]
        assert len(_speaks(ws)) > 0


# -- lone surrogates -----------------------------------------------------------------------------------
def test_websocket_text_with_a_lone_surrogate_is_an_error_event_naming_text(url: str) -> None:
    with _ws(url) as ws:
        ws.send(json.dumps({**CONFIG, "text_mode": "words"}))
        ws.send('{"type": "text", "text": "bad \\ud800 text"}')  # JSON's escape of a lone surrogate
        event = json.loads(ws.recv(timeout=60))
        assert event["type"] == "error" and event["error"]["param"] == "text", event
        assert "surrogate" in event["error"]["message"]
        assert len(_speaks(ws)) > 0


# -- tracing headers -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header", ["trace.abc.123", "t" * 200, "a b/c?d"], ids=["dots", "200-chars", "spaces"]
)
def test_an_odd_x_request_id_never_rejects_a_request(http: httpx.Client, header: str) -> None:
    r = _ok(http, **{"X-Request-Id": header})
    assert REQUEST_ID_RE.fullmatch(r.headers["x-request-id"]), r.headers["x-request-id"]
    ok = http.post("/v1/audio/speech", json=SAY, headers={**AUTH, "X-Request-Id": "plain-id_1"})
    assert ok.headers["x-request-id"] == "plain-id_1"  # a valid one is kept as sent


# -- exposure ------------------------------------------------------------------------------------------
def test_with_an_api_key_docs_are_off_and_metrics_need_the_key(http: httpx.Client) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert http.get(path).status_code == 404, path
    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", headers=AUTH).status_code == 200
    assert http.get("/ping").status_code == 200  # health stays open


def test_docs_and_metrics_open_without_a_key_or_by_setting(tiny_service: Service) -> None:
    settings = [HttpConfig(), HttpConfig(api_key=KEY, exposure=Exposure(docs=True, metrics_auth=False))]
    for config in settings:
        with running(create_app(ServiceHolder(tiny_service), config)) as base:
            assert httpx.get(base + "/openapi.json", timeout=30).status_code == 200
            assert httpx.get(base + "/metrics", timeout=30).status_code == 200


def test_a_foreign_browser_origin_is_refused_and_an_allowed_one_gets_cors(http: httpx.Client) -> None:
    evil = http.post("/v1/audio/speech", json=SAY, headers={**AUTH, "Origin": "http://evil.example"})
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    preflight = http.options(
        "/v1/audio/speech",
        headers={
            "Origin": "http://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert "access-control-allow-origin" not in preflight.headers
    allowed = http.options(
        "/v1/audio/speech",
        headers={
            "Origin": APP,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == APP
    r = _ok(http, Origin=APP)
    assert r.headers["access-control-allow-origin"] == APP
    own = http.base_url.scheme + "://" + http.base_url.netloc.decode()
    _ok(http, Origin=own)  # the server's own pages (e.g. /docs) may call it


def test_websocket_from_a_foreign_origin_is_refused(url: str) -> None:
    with pytest.raises(InvalidStatus) as err:
        _ws(url, Origin="http://evil.example")
    assert err.value.response.status_code == 403
    with _ws(url, Origin=APP) as ws:
        assert len(_speaks(ws)) > 0


def test_a_body_not_sent_as_json_is_refused(http: httpx.Client) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        r = http.post(
            "/v1/audio/speech", content=json.dumps(SAY), headers={**AUTH, "Content-Type": content_type}
        )
        assert r.status_code == 415, (content_type, r.text)
        assert r.json()["error"]["code"] == "unsupported_media_type"
    _ok(http)
