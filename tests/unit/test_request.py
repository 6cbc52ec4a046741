"""The shared request schema: valid input normalises, bad input names its field."""

from __future__ import annotations

import base64

import pytest

from voxcast.audio.formats import AudioFormat
from voxcast.engine.request import (
    MAX_TEXT_CHARS,
    REQUEST_ID_RE,
    check_request_id,
    parse_request,
    request_id_for,
)
from voxcast.errors import InvalidRequest


def test_openai_alias_and_flat_sampling() -> None:
    req = parse_request(
        {"input": "Hello", "seed": 3, "greedy": True, "response_format": "mulaw", "sample_rate": 8000}
    )
    assert req.text == "Hello"
    assert req.sampling.seed == 3 and req.sampling.greedy
    assert req.response_format is AudioFormat.MULAW and req.sample_rate == 8000


def test_nested_sampling_and_defaults() -> None:
    req = parse_request({"text": "Hi", "sampling": {"temperature": 0.5, "top_k": 10}})
    assert req.sampling.temperature == 0.5 and req.sampling.top_k == 10
    assert req.sampling.top_p == 1.0 and req.sampling.repetition_penalty == 1.05
    assert req.language == "auto" and req.stream and req.cache


def test_a_sampling_field_given_twice_must_agree() -> None:
    """``temperature`` at the top level and in ``sampling``: the same value is one field, two values
    are refused naming it (neither silently wins)."""
    same = parse_request({"text": "Hi", "temperature": 0.5, "sampling": {"temperature": 0.5, "top_k": 9}})
    assert same.sampling.temperature == 0.5 and same.sampling.top_k == 9
    loose = parse_request(
        {"text": "Hi", "temperature": "0.5", "seed": None, "sampling": {"temperature": 0.5, "seed": 4}}
    )
    assert loose.sampling.temperature == 0.5 and loose.sampling.seed == 4  # "0.5" is 0.5; None: not given
    with pytest.raises(InvalidRequest) as e:
        parse_request({"text": "Hi", "temperature": 0.5, "sampling": {"temperature": 0.9}})
    assert e.value.field == "temperature" and "twice" in e.value.message


@pytest.mark.parametrize("entry", ["runpod", "websocket", "rq"])
def test_an_openai_body_is_a_request_at_every_entry_point(entry: str) -> None:
    """The schema itself takes OpenAI's speech fields (``model``, ``instructions``, ``voice`` as
    ``{"id"}``), so an OpenAI body is valid wherever a request is (not only on /v1/audio/speech)."""
    body = {
        "model": "tts-1",
        "input": "Hi.",
        "voice": {"id": "vx_1"},
        "instructions": "calm",
        "request_id": entry,
    }
    req = parse_request(body)
    assert (req.text, req.voice, req.instruct, req.request_id) == ("Hi.", "vx_1", "calm", entry)


@pytest.mark.parametrize(
    ("fields", "rate"),
    [
        ({"response_format": "mulaw"}, 8000),  # G.711 without a rate: a telephone line's
        ({"response_format": "alaw"}, 8000),
        ({"response_format": "mulaw", "sample_rate": 16000}, 16000),  # a rate given is kept
        ({"response_format": "pcm"}, 24000),
        ({}, 24000),
    ],
)
def test_g711_defaults_to_8_khz(fields: dict, rate: int) -> None:
    assert parse_request({"text": "Hi", **fields}).sample_rate == rate


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "text"),
        ({"text": "   \n"}, "text"),
        ({"text": "x" * (MAX_TEXT_CHARS + 1)}, "text"),
        ({"input": ""}, "text"),
        ({"text": "a", "sample_rate": 11025}, "sample_rate"),
        ({"text": "a", "response_format": "aiff"}, "response_format"),
        # sampling fields are named as sent: flat, or nested under "sampling"
        ({"text": "a", "temperature": 0}, "temperature"),
        ({"text": "a", "top_p": 1.5}, "top_p"),
        ({"text": "a", "top_k": -1}, "top_k"),
        ({"text": "a", "seed": -5}, "seed"),
        ({"text": "a", "sampling": {"seed": -5}}, "sampling.seed"),
        ({"text": "a", "chunk_frames": 0}, "chunk_frames"),
        ({"text": "a", "max_frames": 1}, "max_frames"),
        ({"text": "a", "ref_audio": "not base64!"}, "ref_audio"),
        ({"text": "a", "unknown_field": 1}, "unknown_field"),
        ({"text": "a", "request_id": "../etc"}, "request_id"),
        # ids the old pattern allowed but RQ job ids or storage keys refuse
        ({"text": "a", "request_id": "a:b"}, "request_id"),
        ({"text": "a", "request_id": "a.b"}, "request_id"),
        ({"text": "a", "request_id": ".hidden"}, "request_id"),
        ({"text": "a", "request_id": "-x"}, "request_id"),
        ({"text": "a", "request_id": "x" * 129}, "request_id"),
        ({"text": 5}, "text"),
        # used to surface as internal_error
        ({"text": "caf\udce9"}, "text"),
        ({"text": "a", "instruct": "\ud800 calm"}, "instruct"),
        ({"text": "a", "sampling": 5, "seed": 1}, "sampling"),
        ({"text": "a", "sampling": 5}, "sampling"),
        ({"text": "\u200b\u200d"}, "text"),
        ({"text": "\u0301\u200c"}, "text"),
    ],
)
def test_bad_input_names_the_field(payload: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(payload)
    assert info.value.field == field
    assert info.value.to_dict()["field"] == field
    assert field.split(".")[-1] in info.value.message or field in info.value.message


def test_voice_and_ref_audio_are_exclusive() -> None:
    audio = base64.b64encode(b"RIFF....").decode()
    with pytest.raises(InvalidRequest):
        parse_request({"text": "a", "voice": "ryan", "ref_audio": audio})
    with pytest.raises(InvalidRequest):
        parse_request({"text": "a", "ref_text": "hello"})


def test_data_uri_ref_audio() -> None:
    raw = b"\x00\x01\x02"
    req = parse_request({"text": "a", "ref_audio": "data:audio/wav;base64," + base64.b64encode(raw).decode()})
    assert req.ref_audio_bytes() == raw


def test_not_a_mapping() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(["text"])  # type: ignore[arg-type]
    assert info.value.field == "request"


@pytest.mark.parametrize("text", ["\u200b\u200b", " \ufeff\u00ad ", "\u2060\t\n"])
def test_text_of_invisible_characters_only_is_refused(text: str) -> None:
    with pytest.raises(InvalidRequest, match="nothing to speak") as e:
        parse_request({"text": text})
    assert e.value.field == "text"


def test_text_and_instruct_are_normalised_once_at_the_edge() -> None:
    req = parse_request({"text": " \u201cHi\u201d\u200b  there ", "instruct": "\u200b "})
    assert req.text == '"Hi" there' and req.instruct is None
    assert parse_request(req) is req  # a parsed request is not parsed again


@pytest.mark.parametrize("rid", ["a", "job-1_X", "7" * 128, "sync-1b2c3d4e-u1"])
def test_request_ids_that_follow_the_rule_are_kept(rid: str) -> None:
    assert parse_request({"text": "a", "request_id": rid}).request_id == rid
    assert check_request_id(rid) == rid and request_id_for(rid) == rid


def test_platform_ids_map_into_the_rule_without_collisions() -> None:
    long_a, long_b = "j" * 128 + "a", "j" * 128 + "b"  # the same first 128 characters
    mapped = [request_id_for(i) for i in (long_a, long_b, "a:b", "a.b", "ab", "", "../../x", "\u00e9t\u00e9")]
    assert all(REQUEST_ID_RE.match(m) for m in mapped)
    assert len(set(mapped)) == len(mapped)
    assert request_id_for(long_a) == request_id_for(long_a)  # deterministic: retries find their stream
    with pytest.raises(InvalidRequest) as info:
        check_request_id("a:b", "job_id")
    assert info.value.field == "job_id"
