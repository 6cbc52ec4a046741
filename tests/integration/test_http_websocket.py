"""``/v1/audio/speech/stream`` with a real ``websockets`` client: text deltas (as one utterance fed
word by word, or sentence by sentence), marks, barge-in, fixed telephony frames, errors, auth,
disconnects; uvicorn on a free loopback port, tiny CustomVoice model."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.fixtures.http_server import Recorder, ended, running
from voxcast.service import Service
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.text.split import split_sentences

Factory = Callable[[str], Path]
KEY = "sk-ws"
CONFIG = {
    "type": "config",
    "voice": "ryan",
    "seed": 5,
    "max_frames": 4,
    "cache": False,
    "text_mode": "sentences",
}
WORDS = {**CONFIG, "text_mode": "words", "max_frames": 40}


@pytest.fixture(scope="module")
def service(tiny_service: Service) -> Service:
    return tiny_service


@pytest.fixture(scope="module")
def url(service: Service) -> Iterator[str]:
    with running(create_app(ServiceHolder(service), HttpConfig(api_key=KEY))) as base:
        yield base.replace("http://", "ws://") + "/v1/audio/speech/stream"


def _open(url: str) -> ClientConnection:
    return connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=30)


def _read_until(ws: ClientConnection, kind: str, timeout_s: float = 60) -> list[Any]:
    """Messages (dicts for events, bytes for audio) up to and including the first event of ``kind``."""
    out: list[Any] = []
    while True:
        raw = ws.recv(timeout=timeout_s)
        msg = raw if isinstance(raw, bytes) else json.loads(raw)
        out.append(msg)
        if isinstance(msg, dict) and msg["type"] == kind:
            return out


def _events(msgs: list[Any], kind: str) -> list[dict[str, Any]]:
    return [m for m in msgs if isinstance(m, dict) and m["type"] == kind]


def _audio(msgs: list[Any]) -> bytes:
    return b"".join(m for m in msgs if isinstance(m, bytes))


def _offline(service: Service, text: str, **config: Any) -> bytes:
    """Each sentence of ``text`` through the service directly, concatenated."""
    fields = {k: v for k, v in {**CONFIG, **config}.items() if k not in ("type", "frame_ms", "text_mode")}
    return b"".join(
        b"".join(
            c.data
            for c in service.synthesize(
                {**fields, "response_format": fields.get("response_format", "pcm"), "text": s}
            )
        )
        for s in split_sentences(text)
    )


TEXT = "Hello there, friend. Wie geht's dir heute? 你好。今天很好！ Fine, thanks."


@pytest.mark.parametrize("split_seed", [0, 1, 2])
def test_deltas_split_anywhere_give_the_sentences_audio(url: str, service: Service, split_seed: int) -> None:
    rng = random.Random(split_seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), 12))
    deltas = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)], strict=True)]
    with _open(url) as ws:
        ws.send(json.dumps(CONFIG))
        for d in deltas:
            ws.send(json.dumps({"type": "text", "text": d}))
        ws.send(json.dumps({"type": "close"}))
        msgs = _read_until(ws, "closed")
    started = _events(msgs, "started")
    assert [s["chars"] for s in started] == [len(s) for s in split_sentences(TEXT)]
    assert len(_events(msgs, "segment_done")) == len(started) == msgs[-1]["segments"]
    assert all(d["timing"]["frames"] == 4 for d in _events(msgs, "segment_done"))
    chunks = _events(msgs, "chunk")
    assert sum(c["bytes"] for c in chunks) == len(_audio(msgs))
    assert _audio(msgs) == _offline(service, TEXT)


def test_marks_come_back_after_the_audio_before_them_and_several_utterances(url: str) -> None:
    with _open(url) as ws:
        ws.send(json.dumps(CONFIG))
        ws.send(json.dumps({"type": "text", "text": "One. Two"}))
        ws.send(json.dumps({"type": "mark", "name": "m1"}))
        ws.send(json.dumps({"type": "text", "text": "Three."}))
        ws.send(json.dumps({"type": "flush"}))
        first = _read_until(ws, "segment_done")
        first += _read_until(ws, "segment_done")
        first += _read_until(ws, "mark")
        assert [s["chars"] for s in _events(first, "started")] == [
            4,
            3,
        ]  # "One." and "Two" (the mark flushed it)
        assert first[-1] == {"type": "mark", "name": "m1"}
        third = _read_until(ws, "segment_done")
        assert _events(third, "started")[0]["chars"] == 6 and _audio(third)
        # a second utterance on the same connection, new settings
        ws.send(json.dumps({**CONFIG, "seed": 9}))
        ws.send(json.dumps({"type": "text", "text": "Again."}))
        ws.send(json.dumps({"type": "close"}))
        last = _read_until(ws, "closed")
        assert len(_events(last, "started")) == 1 and last[-1]["segments"] == 4


def test_clear_stops_the_sentence_and_drops_queued_text(url: str, service: Service) -> None:
    opened = Recorder(service)
    try:
        with _open(url) as ws:
            ws.send(json.dumps({**CONFIG, "max_frames": 3000}))
            ws.send(json.dumps({"type": "text", "text": "A long first sentence. A second one. A third one."}))
            ws.send(json.dumps({"type": "flush"}))
            msgs = _read_until(ws, "chunk")
            ws.recv(timeout=30)  # its audio
            ws.send(json.dumps({"type": "clear"}))
            after = _read_until(ws, "cleared")
            ws.send(json.dumps({**CONFIG}))
            ws.send(json.dumps({"type": "text", "text": "New."}))
            ws.send(json.dumps({"type": "close"}))
            rest = _read_until(ws, "closed")
        assert len(_events(msgs + after, "started")) == 1
        # nothing of the cleared speech after "cleared": the next message starts the new sentence
        assert rest[0]["type"] == "started" and rest[0]["chars"] == 4
        assert len(_events(rest, "started")) == 1 and rest[-1]["segments"] == 2
        first = ended(opened.streams[0])
        assert first.timing.finish_reason == "cancelled" and first.timing.frames < 3000
        assert len(opened.streams) == 2  # the queued sentences were never started
    finally:
        opened.restore()


def test_fixed_20ms_mulaw_frames_for_telephony(url: str, service: Service) -> None:
    config = {**CONFIG, "response_format": "mulaw", "sample_rate": 8000, "frame_ms": 20, "max_frames": 5}
    with _open(url) as ws:
        ws.send(json.dumps(config))
        ws.send(json.dumps({"type": "text", "text": "Press one. Or two."}))
        ws.send(json.dumps({"type": "mark", "name": "end"}))
        ws.send(json.dumps({"type": "close"}))
        msgs = _read_until(ws, "closed")
    mark = msgs.index({"type": "mark", "name": "end"})
    assert not [
        m for m in msgs[mark:] if isinstance(m, bytes)
    ]  # every frame, the padded last one too, before it
    frames = [m for m in msgs if isinstance(m, bytes)]
    assert frames and all(len(f) == 160 for f in frames)
    offline = _offline(service, "Press one. Or two.", response_format="mulaw", sample_rate=8000, max_frames=5)
    audio = _audio(msgs)
    assert audio[: len(offline)] == offline and set(audio[len(offline) :]) <= {0xFF}  # padded with silence
    assert len(audio) - len(offline) < 160


def _read_twilio(ws: ClientConnection, until: dict[str, Any]) -> list[dict[str, Any]]:
    """Messages up to and including ``until`` (all JSON with Twilio framing)."""
    out: list[dict[str, Any]] = []
    while not out or out[-1] != until:
        raw = ws.recv(timeout=60)
        assert isinstance(raw, str), "no binary audio with Twilio framing"
        out.append(json.loads(raw))
    return out


def test_twilio_framing_sends_what_a_media_streams_bridge_forwards(url: str, service: Service) -> None:
    """``framing: twilio``: 20 ms frames of 8 kHz mu-law as Twilio ``media`` events, the mark's echo
    as a Twilio ``mark`` after them, a ``clear`` event on barge-in: a bridge passes them on as they
    are. The audio is the raw socket's (the service's offline mu-law)."""
    sid = "MZ0123456789abcdef"
    with _open(url) as ws:
        ws.send(json.dumps({**CONFIG, "framing": "twilio", "stream_sid": sid, "max_frames": 5}))
        ws.send(json.dumps({"type": "text", "text": "Press one. Or two."}))
        ws.send(json.dumps({"type": "mark", "name": "end"}))
        mark = {"event": "mark", "streamSid": sid, "mark": {"name": "end"}}
        msgs = _read_twilio(ws, mark)
        ws.send(json.dumps({**CONFIG, "framing": "twilio", "stream_sid": sid, "max_frames": 3000}))
        ws.send(json.dumps({"type": "text", "text": "A long sentence the caller talks over."}))
        ws.send(json.dumps({"type": "flush"}))
        while json.loads(ws.recv(timeout=60)).get("event") != "media":  # speaking
            pass
        ws.send(json.dumps({"type": "clear"}))
        cleared = _read_twilio(ws, {"type": "cleared"})
        ws.send(json.dumps({"type": "close"}))
    media = [m for m in msgs if m.get("event") == "media"]
    assert media and all(m["streamSid"] == sid and set(m) == {"event", "streamSid", "media"} for m in media)
    frames = [base64.b64decode(m["media"]["payload"]) for m in media]
    assert all(len(f) == 160 for f in frames)  # 20 ms at 8 kHz, one byte a sample
    offline = _offline(service, "Press one. Or two.", response_format="mulaw", sample_rate=8000, max_frames=5)
    audio = b"".join(frames)
    assert audio[: len(offline)] == offline and set(audio[len(offline) :]) <= {0xFF}
    assert {"event": "clear", "streamSid": sid} in cleared
    assert cleared.index({"event": "clear", "streamSid": sid}) < len(cleared) - 1  # before "cleared"


def test_audiosocket_framing_sends_what_asterisk_reads(url: str, service: Service) -> None:
    """``framing: audiosocket``: each 20 ms frame of 8 kHz PCM as one binary message in AudioSocket's
    framing (kind 0x10, big-endian length 320), the last one padded with silence; the audio is the
    service's offline PCM at 8 kHz."""
    with _open(url) as ws:
        ws.send(json.dumps({**CONFIG, "framing": "audiosocket", "max_frames": 5}))
        ws.send(json.dumps({"type": "text", "text": "Press one."}))
        ws.send(json.dumps({"type": "mark", "name": "end"}))
        msgs = _read_until(ws, "mark")
        ws.send(json.dumps({**CONFIG, "framing": "audiosocket", "sample_rate": 16000}))
        wrong_rate = _read_until(ws, "error")[-1]["error"]["param"]
        ws.send(json.dumps({**CONFIG, "framing": "audiosocket", "frame_ms": 0}))
        no_frames = _read_until(ws, "error")[-1]["error"]["param"]
    frames = [m for m in msgs if isinstance(m, bytes)]
    assert frames and all(f[:3] == b"\x10\x01\x40" and len(f) == 323 for f in frames)
    offline = _offline(service, "Press one.", response_format="pcm", sample_rate=8000, max_frames=5)
    audio = b"".join(f[3:] for f in frames)
    assert audio[: len(offline)] == offline and set(audio[len(offline) :]) <= {0}
    assert (wrong_rate, no_frames) == ("sample_rate", "frame_ms")


def test_bad_messages_get_errors_naming_the_field_and_the_socket_goes_on(url: str) -> None:
    with _open(url) as ws:

        def error_for(message: str | bytes) -> dict[str, Any]:
            ws.send(message)
            return _read_until(ws, "error")[-1]["error"]

        assert error_for("not json")["param"] == "message"
        assert error_for(b"\x00\x01")["param"] == "message"
        assert error_for(json.dumps({"type": "text", "text": "Hi."}))["param"] == "type"  # no config yet
        assert error_for(json.dumps({"type": "dance"}))["param"] == "type"
        assert error_for(json.dumps({**CONFIG, "sample_rate": 5}))["param"] == "sample_rate"
        assert error_for(json.dumps({**CONFIG, "response_format": "mp3"}))["param"] == "response_format"
        assert error_for(json.dumps({**CONFIG, "frame_ms": "20"}))["param"] == "frame_ms"
        assert error_for(json.dumps({**CONFIG, "seed": -1}))["param"] == "seed"
        assert error_for(json.dumps({**CONFIG, "text_mode": "letters"}))["param"] == "text_mode"
        assert error_for(json.dumps({**CONFIG, "framing": "sip"}))["param"] == "framing"
        assert error_for(json.dumps({**CONFIG, "framing": "twilio"}))["param"] == "stream_sid"
        twilio = {**CONFIG, "framing": "twilio", "stream_sid": "MZ1"}
        assert error_for(json.dumps({**twilio, "response_format": "pcm"}))["param"] == "response_format"
        assert error_for(json.dumps({**twilio, "sample_rate": 16000}))["param"] == "sample_rate"
        err = error_for(json.dumps({**CONFIG, "voice": "nobody"}))  # at the config, not the first text
        assert err["code"] == "voice_not_found" and err["param"] == "voice"
        for token in ("Not ", "in ", "that ", "voice."):  # after a refused config: dropped, no error each
            ws.send(json.dumps({"type": "text", "text": token}))
        ws.send(json.dumps({"type": "flush"}))
        ws.send(json.dumps(WORDS))  # each delta feeds an utterance
        too_long = error_for(json.dumps({"type": "text", "text": "word " * 1200}))  # 6000 > 5000 a request
        assert too_long["param"] == "text" and "5000" in too_long["message"]
        ws.send(json.dumps({"type": "flush"}))  # nothing of it to end: no empty utterance
        ws.send(json.dumps({"type": "text", "text": "Still here."}))
        ws.send(json.dumps({"type": "close"}))
        msgs = _read_until(ws, "closed")
        assert _audio(msgs) and len(_events(msgs, "segment_done")) == 1
        assert len(_events(msgs, "started")) == 1 and not _events(msgs, "error")  # no utterance for it


def test_auth_by_header_or_query_and_refused_without(url: str) -> None:
    with pytest.raises(InvalidStatus):
        connect(url, open_timeout=30)
    with connect(url + f"?api_key={KEY}", open_timeout=30) as ws:
        ws.send(json.dumps(CONFIG))
        ws.send(json.dumps({"type": "close"}))
        assert _read_until(ws, "closed")[-1]["segments"] == 0


def test_a_client_that_disconnects_mid_sentence_cancels_it(url: str, service: Service) -> None:
    opened = Recorder(service)
    try:
        with _open(url) as ws:
            ws.send(json.dumps({**CONFIG, "max_frames": 3000}))
            ws.send(json.dumps({"type": "text", "text": "A long sentence that will not be heard."}))
            ws.send(json.dumps({"type": "flush"}))
            _read_until(ws, "chunk")
        result = ended(opened.streams[0])
        assert result.timing.finish_reason == "cancelled" and result.timing.frames < 3000
    finally:
        opened.restore()


def test_unspoken_text_is_bounded(url: str) -> None:
    with _open(url) as ws:
        ws.send(json.dumps({**CONFIG, "max_frames": 3000}))
        errors: list[dict[str, Any]] = []
        for _ in range(8):  # flushed text waits in the queue while the first sentence is spoken
            ws.send(json.dumps({"type": "text", "text": "Hi there. " * 400}))
            ws.send(json.dumps({"type": "flush"}))
        ws.send(json.dumps({"type": "mark", "name": "x" * 300}))
        ws.send(json.dumps({"type": "clear"}))
        for msg in _read_until(ws, "cleared"):
            if isinstance(msg, dict) and msg["type"] == "error":
                errors.append(msg["error"])
        # 8 x 4000 characters against a 20000 limit: the last rounds are refused, however far the
        # speaker got with the first sentences
        params = [e["param"] for e in errors]
        assert params[-1] == "name" and len(params) >= 3 and set(params[:-1]) == {"text"}
        assert "unspoken" in errors[0]["message"]
        ws.send(json.dumps({"type": "close"}))
        _read_until(ws, "closed")


def _whole(service: Service, text: str, **config: Any) -> bytes:
    """``text`` sent whole through the service in the streaming-text layout the words mode uses."""
    fields = {k: v for k, v in {**WORDS, **config}.items() if k not in ("type", "frame_ms", "text_mode")}
    request = {**fields, "response_format": "pcm", "text": text, "non_streaming_text": False}
    return b"".join(c.data for c in service.synthesize(request))


@pytest.mark.parametrize("split_seed", [0, 1, 2])
def test_words_mode_speaks_the_utterance_exactly_as_sent_whole(
    url: str, service: Service, split_seed: int
) -> None:
    rng = random.Random(split_seed)
    cuts = sorted(rng.sample(range(1, len(TEXT)), 20))
    deltas = [TEXT[a:b] for a, b in zip([0, *cuts], [*cuts, len(TEXT)], strict=True)]
    opened = Recorder(service)
    try:
        with _open(url) as ws:
            ws.send(json.dumps(WORDS))
            for d in deltas:
                ws.send(json.dumps({"type": "text", "text": d}))
            ws.send(json.dumps({"type": "flush"}))
            msgs = _read_until(ws, "segment_done")
            ws.send(json.dumps({"type": "close"}))
            _read_until(ws, "closed")
        result = ended(opened.streams[0])
    finally:
        opened.restore()
    started = _events(msgs, "started")
    assert len(started) == 1 and started[0]["chars"] is None  # one utterance, its text still arriving
    assert _events(msgs, "segment_done")[0]["timing"]["frames"] == 40
    assert _audio(msgs) == _whole(service, TEXT)  # byte for byte the utterance sent whole
    assert opened.streams[0].request.text == TEXT  # the text as spoken, for the request log
    assert result.timing.extra["text_in_pieces"]["tokens"] > 10


def test_words_mode_utterances_marks_and_barge_in(url: str, service: Service) -> None:
    opened = Recorder(service)
    try:
        with _open(url) as ws:
            ws.send(json.dumps(WORDS))
            ws.send(json.dumps({"type": "text", "text": "One and"}))
            ws.send(json.dumps({"type": "text", "text": " two."}))
            ws.send(json.dumps({"type": "mark", "name": "m1"}))  # ends the utterance
            ws.send(json.dumps({"type": "text", "text": "Three."}))
            ws.send(json.dumps({"type": "flush"}))
            first = _read_until(ws, "mark")
            second = _read_until(ws, "segment_done")
            assert len(_events(first, "segment_done")) == 1 and _audio(first)
            assert first[-1] == {"type": "mark", "name": "m1"} and _audio(second)
            # barge-in while an utterance waits for more text
            ws.send(json.dumps({**WORDS, "max_frames": 3000}))
            ws.send(json.dumps({"type": "text", "text": "A long reply that keeps "}))
            _read_until(ws, "chunk")
            ws.send(json.dumps({"type": "clear"}))
            _read_until(ws, "cleared")
            ws.send(json.dumps(WORDS))
            ws.send(json.dumps({"type": "text", "text": "New."}))
            ws.send(json.dumps({"type": "close"}))
            rest = _read_until(ws, "closed")
        assert len(_events(rest, "started")) == 1 and rest[-1]["segments"] == 4
        barged = ended(opened.streams[2])
        assert barged.timing.finish_reason == "cancelled" and barged.timing.frames < 3000
    finally:
        opened.restore()


def test_words_mode_at_a_speed_is_the_whole_text_at_that_speed(url: str, service: Service) -> None:
    """``speed`` in the config: the utterance fed word by word, time-stretched as it streams, is byte
    for byte the whole text at that speed."""
    config = {**WORDS, "speed": 1.5, "max_frames": 20}
    with _open(url) as ws:
        ws.send(json.dumps(config))
        for word in TEXT.split(" "):
            ws.send(json.dumps({"type": "text", "text": word + " "}))
        ws.send(json.dumps({"type": "flush"}))
        msgs = _read_until(ws, "segment_done")
        ws.send(json.dumps({"type": "close"}))
        _read_until(ws, "closed")
    audio = _audio(msgs)
    assert len(audio) == 2 * round(20 * 1920 / 1.5)
    assert audio == _whole(service, TEXT.strip(), speed=1.5, max_frames=20)


def test_words_mode_text_after_the_utterance_ended_starts_a_new_one(url: str) -> None:
    """An utterance that reached its ``max_frames`` has ended though its text is still open: more
    text is a new utterance, spoken, not pushed into the ended stream and lost."""
    with _open(url) as ws:
        ws.send(json.dumps({**WORDS, "max_frames": 4}))
        ws.send(json.dumps({"type": "text", "text": "A first reply that runs past its frames "}))
        first = _read_until(ws, "segment_done")  # ended at 4 frames, its text not closed
        ws.send(json.dumps({"type": "text", "text": "Then more."}))
        ws.send(json.dumps({"type": "flush"}))
        ws.send(json.dumps({"type": "close"}))
        rest = _read_until(ws, "closed")
    assert _events(first, "segment_done")[0]["timing"]["frames"] == 4
    assert len(_events(rest, "started")) == 1 and _audio(rest) and rest[-1]["segments"] == 2
