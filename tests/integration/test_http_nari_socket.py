"""``/v1/audio/speech/ws`` (the ``nari.speech.v1`` WebSocket) against a real ``voxcast serve``
process on the tiny CustomVoice checkpoint whose speech ends, driven as nari-labs' tts_bench drives
it: one word per ``input_text.append``, each acknowledged before the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.fixtures.polling import wait_until
from tests.fixtures.procs import free_port, stop_process, wait_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-nari"
PROTOCOL = "nari.speech.v1"
AUDIO = {"encoding": "pcm_s16le", "sample_rate": 24000, "channels": 1}
START = {"type": "request.start", "model": "qwen3-tts", "voice": "Ryan", "language": "English", "seed": 3}
TEXT = "We will meet at the corner cafe after work."
"""Seed 3 ends it by end of speech after 30 frames (2.4 s) on this checkpoint."""
LONG = "Turn left at the second light and park near the gate."
"""Seed 3 speaks it for 115 frames (9.2 s) before its end of speech."""


class Server:
    def __init__(self, base: str, log: Path) -> None:
        self.base, self.log = base, log

    @property
    def ws_url(self) -> str:
        return self.base.replace("http://", "ws://") + "/v1/audio/speech/ws"

    def request_lines(self) -> list[dict[str, Any]]:
        """The request log's lines (JSON log format) so far."""
        lines = [json.loads(x) for x in self.log.read_text().splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("logger") == "voxcast.requests"]


@pytest.fixture(scope="module")
def server(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("nari")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VOXCAST_", "RUNPOD_", "PORT"))}
    env.update(
        VOXCAST_MODEL=str(demo_model_dir),
        VOXCAST_DEVICE="cpu",
        VOXCAST_STORAGE_DIR=str(tmp / "store"),
        VOXCAST_STORAGE_FSYNC="0",
        VOXCAST_WARMUP="0",
        VOXCAST_THREADS="1",
        OMP_NUM_THREADS="1",
        VOXCAST_ADMISSION="off",  # one stream at a time here; a shared CPU's slow round refuses none
        VOXCAST_API_KEY=KEY,
        VOXCAST_LOG_FORMAT="json",
    )
    port = free_port()
    log = tmp / "serve.log"
    cmd = [sys.executable, "-m", "voxcast.serving.cli.main", "serve", "--port", str(port)]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=fh, stderr=fh)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(base + "/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_ready(proc, ready, 120, "voxcast serve", poll_s=0.1, details=lambda: log.read_text()[-2000:])
        yield Server(base, log)
    finally:
        stop_process(proc)
    assert "Traceback" not in log.read_text()


def _open(server: Server, **kw: Any) -> ClientConnection:
    kw.setdefault("subprotocols", [PROTOCOL])
    kw.setdefault("additional_headers", {"Authorization": f"Bearer {KEY}"})
    return connect(server.ws_url, open_timeout=30, max_size=None, **kw)


def _words(text: str) -> list[str]:
    """One word a piece with its trailing space, as tts_bench cuts a prompt."""
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


def _event(ws: ClientConnection) -> dict[str, Any]:
    message = ws.recv(timeout=60)
    assert isinstance(message, str), "a binary message where an event was due"
    out: dict[str, Any] = json.loads(message)
    return out


def _until_closed(ws: ClientConnection) -> tuple[list[Any], int | None]:
    """Messages (events as dicts, audio as bytes) until the server closes; and its close code."""
    out: list[Any] = []
    while True:
        try:
            message = ws.recv(timeout=60)
        except ConnectionClosed as closed:
            return out, closed.rcvd.code if closed.rcvd is not None else None
        out.append(message if isinstance(message, bytes) else json.loads(message))


def _configured(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    assert _event(ws) == {"type": "session.created", "protocol": PROTOCOL, "audio": AUDIO}
    ws.send(json.dumps({**START, **fields}))
    configured = _event(ws)
    assert configured["type"] == "request.configured", configured
    return configured


def _speak(server: Server, text: str, **fields: Any) -> tuple[list[Any], int | None, str]:
    """The whole exchange for ``text``, each append's ack awaited before the next, as tts_bench does;
    returns every message after ``request.configured`` (acks included), the close code, the request id."""
    with _open(server) as ws:
        request_id = _configured(ws, **fields)["request_id"]
        seen: list[Any] = []
        pieces = _words(text)
        for i, piece in enumerate(pieces):
            ws.send(json.dumps({"type": "input_text.append", "sequence": i, "text": piece}))
            while True:
                message = ws.recv(timeout=60)
                seen.append(message if isinstance(message, bytes) else json.loads(message))
                if _is_ack(seen[-1], "input_text.append", i):
                    break
        ws.send(json.dumps({"type": "input_text.end", "sequence": len(pieces)}))
        rest, code = _until_closed(ws)
    return seen + rest, code, request_id


def _is_ack(message: Any, event: str, sequence: int) -> bool:
    return (
        isinstance(message, dict)
        and message["type"] == "input_text.ack"
        and (
            message["event"],
            message["sequence"],
        )
        == (event, sequence)
    )


def _events(messages: list[Any]) -> list[dict[str, Any]]:
    return [m for m in messages if isinstance(m, dict)]


def _audio(messages: list[Any]) -> bytes:
    return b"".join(m for m in messages if isinstance(m, bytes))


def test_one_word_per_append_gives_the_whole_sequence_and_the_chunk_count(server: Server) -> None:
    messages, code, request_id = _speak(server, TEXT)
    events = _events(messages)
    assert code == 1000
    kinds = [e["type"] for e in events]
    n = len(_words(TEXT))
    assert kinds.count("response.started") == 1 and kinds[0] == "response.started"  # before any audio
    assert not isinstance(messages[0], bytes)
    acks = [(e["event"], e["sequence"]) for e in events if e["type"] == "input_text.ack"]
    assert acks == [("input_text.append", i) for i in range(n)] + [("input_text.end", n)]
    assert all(e["request_id"] == request_id for e in events)
    assert events[0]["audio"] == AUDIO
    done = events[-1]
    assert done["type"] == "response.done" and kinds.count("response.done") == 1
    binaries = [m for m in messages if isinstance(m, bytes)]
    assert done["audio_chunks"] == len(binaries) > 1
    assert done["stop_reason"] == "stop" and done["finish_reason"] == "eos"
    assert done["timing"]["frames"] == 30 and len(_audio(messages)) == 30 * 3840
    assert "error" not in kinds


def test_audio_equals_the_same_seeded_text_sent_whole_over_http(server: Server) -> None:
    messages, code, _ = _speak(server, TEXT)
    body = {
        "input": TEXT,
        "voice": "Ryan",
        "language": "English",
        "seed": 3,
        "non_streaming_text": False,
        "response_format": "pcm",
        "cache": False,
    }
    whole = httpx.post(
        server.base + "/v1/audio/speech", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )
    assert whole.status_code == 200 and code == 1000
    assert _audio(messages) == whole.content and len(whole.content) == 30 * 3840


def test_response_cancel_stops_the_synthesis_and_closes_1000(server: Server) -> None:
    with _open(server) as ws:
        request_id = _configured(ws)["request_id"]
        seen: list[Any] = []
        for i, piece in enumerate(_words(LONG)):
            ws.send(json.dumps({"type": "input_text.append", "sequence": i, "text": piece}))
        while not any(isinstance(m, bytes) for m in seen):  # the audio has started
            message = ws.recv(timeout=60)
            seen.append(message if isinstance(message, bytes) else json.loads(message))
        t0 = time.monotonic()
        ws.send(json.dumps({"type": "response.cancel"}))
        rest, code = _until_closed(ws)
        waited_s = time.monotonic() - t0
    messages = seen + rest
    (done,) = [e for e in _events(messages) if e["type"] == "response.done"]
    assert code == 1000 and isinstance(messages[-1], dict) and messages[-1] is done
    assert done["stop_reason"] == "cancelled" and done["request_id"] == request_id
    assert done["audio_chunks"] == len([m for m in messages if isinstance(m, bytes)])
    assert waited_s < 10
    wait_until(
        lambda: any(x["request_id"] == request_id for x in server.request_lines()), what="its log line"
    )
    (line,) = [x for x in server.request_lines() if x["request_id"] == request_id]
    assert line["outcome"] == "cancelled" and line["entry"] == "websocket"
    assert line["frames"] < 115 // 2  # stopped, not spoken to its end
    assert len(_audio(messages)) <= line["frames"] * 3840


@pytest.mark.parametrize(
    ("start", "param"),
    [
        ({"max_frames": 1}, "max_frames"),
        ({"voice": "nobody"}, "voice"),
        ({"response_format": "mp3"}, "response_format"),
        ({"input": "Hello."}, "input"),
    ],
)
def test_a_bad_request_start_field_is_an_error_naming_it_then_close(
    server: Server, start: dict[str, Any], param: str
) -> None:
    with _open(server) as ws:
        assert _event(ws)["type"] == "session.created"
        ws.send(json.dumps({**START, **start}))
        messages, code = _until_closed(ws)
    assert code == 1008
    (error,) = messages
    assert error["type"] == "error" and error["error"]["param"] == param, error
    assert error["error"]["code"] in ("invalid_request", "voice_not_found")
    messages, code, _ = _speak(server, "Still here.")  # the server serves on
    assert code == 1000 and _events(messages)[-1]["type"] == "response.done"


def test_unknown_types_and_messages_out_of_order_are_errors_naming_them(server: Server) -> None:
    with _open(server) as ws:
        _configured(ws)
        ws.send(json.dumps({"type": "input_text.flush"}))
        (error,), code = _until_closed(ws)
    assert (
        code == 1008 and error["error"]["param"] == "type" and "input_text.flush" in error["error"]["message"]
    )
    with _open(server) as ws:
        _configured(ws)
        ws.send(json.dumps({"type": "input_text.append", "sequence": 1, "text": "Hello"}))
        (error,), code = _until_closed(ws)
    assert code == 1008 and error["error"]["param"] == "sequence"
    with _open(server) as ws:
        assert _event(ws)["type"] == "session.created"
        ws.send(json.dumps({"type": "input_text.append", "sequence": 0, "text": "Hello"}))
        (error,), code = _until_closed(ws)
    assert code == 1008 and error["error"]["param"] == "type" and "request.start" in error["error"]["message"]


def test_the_subprotocol_the_api_key_and_the_origin_are_required(server: Server) -> None:
    with _open(server, subprotocols=None) as ws:
        assert ws.subprotocol is None
        (error,), code = _until_closed(ws)
    assert code == 1008 and error["error"]["param"] == "Sec-WebSocket-Protocol"
    with _open(server) as ws:
        assert ws.subprotocol == PROTOCOL
    with pytest.raises(InvalidStatus) as refused:
        _open(server, additional_headers={})
    assert refused.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as refused:
        _open(
            server,
            additional_headers={"Authorization": f"Bearer {KEY}", "Origin": "https://elsewhere.example"},
        )
    assert refused.value.response.status_code == 403
