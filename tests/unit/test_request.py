"""The shared request schema: valid input normalises, bad input names its field."""

from __future__ import annotations

import base64

import pytest

from voxcast.audio.formats import AudioFormat
from voxcast.engine.request import MAX_TEXT_CHARS, parse_request
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


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "text"),
        ({"text": "   \n"}, "text"),
        ({"text": "x" * (MAX_TEXT_CHARS + 1)}, "text"),
        ({"input": ""}, "text"),
        ({"text": "a", "sample_rate": 11025}, "sample_rate"),
        ({"text": "a", "response_format": "aiff"}, "response_format"),
        ({"text": "a", "temperature": 0}, "sampling.temperature"),
        ({"text": "a", "top_p": 1.5}, "sampling.top_p"),
        ({"text": "a", "top_k": -1}, "sampling.top_k"),
        ({"text": "a", "seed": -5}, "sampling.seed"),
        ({"text": "a", "chunk_frames": 0}, "chunk_frames"),
        ({"text": "a", "max_frames": 1}, "max_frames"),
        ({"text": "a", "ref_audio": "not base64!"}, "ref_audio"),
        ({"text": "a", "unknown_field": 1}, "unknown_field"),
        ({"text": "a", "request_id": "../etc"}, "request_id"),
        ({"text": 5}, "text"),
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
