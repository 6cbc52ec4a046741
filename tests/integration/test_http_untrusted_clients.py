"""The HTTP server against careless and hostile clients: deeply nested JSON, lone surrogates, odd
tracing headers, browser origins, non-JSON bodies, and what an API key closes. Real uvicorn on a free
loopback port (tiny CustomVoice model), driven with httpx, the ``openai`` SDK and ``websockets``."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.fixtures.http_server import messages_until, running
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


def _speaks(ws: ClientConnection) -> bytes:
    """The connection still serves: a config, a sentence and a flush give audio."""
    ws.send(json.dumps(CONFIG))
    ws.send(json.dumps({"type": "text", "text": "Still here."}))
    ws.send(json.dumps({"type": "flush"}))
    msgs = messages_until(ws, "segment_done")
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


# -- the Host header (DNS rebinding) -------------------------------------------------------------------
def _handshake_status(url: str, host: str, path: str = "/v1/audio/speech/stream") -> int:
    """The status a WebSocket handshake sent with this ``Host`` gets (a raw request: clients set their own)."""
    netloc = httpx.URL(url)
    with socket.create_connection((netloc.host, netloc.port), timeout=30) as sock:
        sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        return int(sock.recv(4096).split(b" ", 2)[1])


def test_a_rebound_host_is_refused_without_a_key_and_loopback_or_an_address_is_served(
    tiny_service: Service,
) -> None:
    """A page at attacker.example whose name now resolves to 127.0.0.1 is same-origin with itself: its
    ``Origin`` equals its ``Host``, so only the ``Host`` tells it from the server's own pages."""
    with running(create_app(ServiceHolder(tiny_service), HttpConfig())) as base:
        port = httpx.URL(base).port
        evil = f"attacker.example:{port}"
        with httpx.Client(base_url=base, timeout=60) as http:
            r = http.post("/v1/audio/speech", json=SAY, headers={"Host": evil, "Origin": f"http://{evil}"})
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "host_not_allowed" and err["param"] == "Host", err
            assert "VOXCAST_ALLOWED_HOSTS" in err["message"]
            assert http.get("/v1/audio/voices", headers={"Host": evil}).status_code == 400  # no Origin
            assert _handshake_status(base, evil) == 403
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"10.1.2.3:{port}"):
                ok = http.post(
                    "/v1/audio/speech", json=SAY, headers={"Host": host, "Origin": f"http://{host}"}
                )
                assert ok.status_code == 200, (host, ok.text)
            assert _handshake_status(base, f"localhost:{port}") == 101
            assert http.get("/ping", headers={"Host": evil}).status_code == 200  # probes: any name
            assert http.get("/health").json()["requests"]["refused"] == {"host": 3}
            metrics = http.get("/metrics").text
            assert 'voxcast_http_refused_total{reason="host",status="400"} 2.0' in metrics
            assert 'voxcast_http_refused_total{reason="host",status="403"} 1.0' in metrics


def test_allowed_hosts_name_the_hosts_served_and_a_key_alone_skips_the_check(
    http: httpx.Client, tiny_service: Service
) -> None:
    port = http.base_url.port
    _ok(http, Host=f"attacker.example:{port}")  # the key protects: a rebound page cannot send it
    exposure = Exposure.from_env({"VOXCAST_ALLOWED_HOSTS": ".example.com, tts.internal"})
    config = HttpConfig(api_key=KEY, exposure=exposure)
    with (
        running(create_app(ServiceHolder(tiny_service), config)) as base,
        httpx.Client(base_url=base, timeout=60) as client,
    ):
        for host in ("example.com", "tts.example.com", "TTS.internal.", "localhost", "192.0.2.7"):
            _ok(client, Host=f"{host}:{port}")
        for host in ("attacker.example", "evilexample.com", "tts.internal.evil"):
            r = client.post("/v1/audio/speech", json=SAY, headers={**AUTH, "Host": host})
            assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed", host
    with pytest.raises(ValueError, match="VOXCAST_ALLOWED_HOSTS"):
        Exposure.from_env({"VOXCAST_ALLOWED_HOSTS": "https://tts.example.com"})


# -- refusals are counted ------------------------------------------------------------------------------
def test_missing_or_wrong_keys_are_counted_in_metrics_and_health_without_the_key(
    http: httpx.Client, url: str
) -> None:
    def refused() -> tuple[int, float, float]:
        health = http.get("/health").json()["requests"]["refused"].get("api_key", 0)
        metrics = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in http.get("/metrics", headers=AUTH).text.splitlines()
            if line.startswith("voxcast_http_refused_total")
        }
        http_401 = metrics.get('voxcast_http_refused_total{reason="api_key",status="401"}', 0.0)
        ws_403 = metrics.get('voxcast_http_refused_total{reason="api_key",status="403"}', 0.0)
        return health, http_401, ws_403

    before = refused()
    assert http.post("/v1/audio/speech", json=SAY).status_code == 401
    wrong = {"Authorization": "Bearer sk-wrong-secret"}
    assert http.post("/v1/audio/speech", json=SAY, headers=wrong).status_code == 401
    assert http.get("/metrics", headers=wrong).status_code == 401
    with pytest.raises(InvalidStatus):
        connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", open_timeout=30)
    after = refused()
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (4, 3.0, 1.0)
    text = http.get("/metrics", headers=AUTH).text + http.get("/health").text
    assert KEY not in text and "sk-wrong-secret" not in text
