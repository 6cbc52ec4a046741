"""Prompt-library manifests and prerender presets/post-processing (pure: no model, no Redis)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.loudness import integrated_loudness
from voxcast.errors import InvalidRequest
from voxcast.prerender.library import PrerenderJob, library_prefix
from voxcast.prerender.manifest import default_seed, detect_format, parse_manifest
from voxcast.prerender.presets import (
    DEFAULT_PRESETS,
    PRESETS,
    PostProcess,
    encode_preset,
    postprocess,
)

CSV = """id,text,voice,language,seed,temperature
welcome,Welcome to Acme.,vivian,english,,
hold,Please hold.,ryan,english,7,0.5
,No id here.,vivian,english,,
bad id!,Hello.,vivian,english,,
empty,   ,vivian,english,,
welcome,Duplicate.,vivian,english,,
hot,Too hot.,vivian,english,,9.5
"""


def test_csv_rows_good_and_bad() -> None:
    m = parse_manifest(CSV, "library.csv")
    assert [p.id for p in m.prompts] == ["welcome", "hold"]
    assert [(e.row, e.field) for e in m.errors] == [
        (3, "id"),
        (4, "id"),
        (5, "text"),
        (6, "id"),
        (7, "temperature"),
    ]
    welcome, hold = m.prompts
    assert welcome.request.sampling.seed == default_seed("welcome")
    assert hold.request.sampling.seed == 7 and hold.request.sampling.temperature == 0.5
    assert welcome.request.response_format.value == "pcm" and welcome.request.sample_rate == 24000
    assert (
        welcome.fields["text"] == "Welcome to Acme."
        and welcome.fields["sampling"]["seed"] == welcome.request.sampling.seed
    )


def test_json_and_yaml_with_defaults() -> None:
    doc = {"defaults": {"voice": "vivian", "language": "english"}, "prompts": [{"id": "a", "text": "One."}]}
    m = parse_manifest(json.dumps(doc))
    assert m.prompts[0].request.voice == "vivian" and not m.errors
    y = "defaults:\n  voice: ryan\nprompts:\n  - id: b\n    text: Two.\n    greedy: true\n  - id: c\n    text: Three.\n    voice: vivian\n"
    m = parse_manifest(y)
    assert [p.request.voice for p in m.prompts] == ["ryan", "vivian"]
    assert m.prompts[0].request.sampling.greedy and m.prompts[0].request.sampling.seed is None
    assert parse_manifest("- id: d\n  text: Four.\n", "yml").prompts[0].id == "d"


def test_job_defaults_apply_under_manifest_defaults() -> None:
    m = parse_manifest("id,text\nx,Hi.\n", "csv", defaults={"voice": "aiden"})
    assert m.prompts[0].request.voice == "aiden"


@pytest.mark.parametrize(
    ("text", "fmt"),
    [("", "csv"), ("[]", None), ("{not json", "json"), ("a: [", "yaml"), ('{"prompts": 3}', None)],
)
def test_unreadable_manifests_fail_as_a_whole(text: str, fmt: str | None) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_manifest(text, fmt)
    assert e.value.field.startswith("manifest")


@pytest.mark.parametrize(
    ("text", "fmt"), [("id,txet\na,Hello.\nb,Bye.\n", "csv"), ('[{"id": "a", "words": "Hi."}]', "json")]
)
def test_a_misspelt_text_column_fails_as_a_whole_naming_the_columns(text: str, fmt: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_manifest(text, fmt)
    assert e.value.field == "manifest" and "'text'" in e.value.message and "id" in e.value.message
    blank = parse_manifest("id,text\na,\nb,Hi.\n", "csv")  # the column is there: one row lacks it
    assert [p.id for p in blank.prompts] == ["b"] and [e.field for e in blank.errors] == ["text"]


def test_a_row_may_set_its_speed_and_speed_one_leaves_the_render_hash_alone() -> None:
    from voxcast.prerender.gate import GateSettings
    from voxcast.prerender.library import render_hash

    m = parse_manifest("id,text,speed\na,One.,\nb,One.,1.0\nc,One.,1.25\nd,One.,9\n", "x.csv")
    a, b, c = m.prompts
    assert [(e.row, e.field) for e in m.errors] == [(4, "speed")]
    assert "speed" not in a.fields and "speed" not in b.fields and c.fields["speed"] == 1.25
    assert a.request.speed == b.request.speed == 1.0 and c.request.speed == 1.25

    def h(p: object) -> str:
        return render_hash("m", p, PostProcess(), GateSettings())  # type: ignore[arg-type]

    same = {k: v for k, v in vars(a).items()}
    assert h(a) == h(type(a)(**{**same, "id": "b"}))  # the hash is the content's, not the id's
    assert h(c) != h(a)


def test_rows_cannot_set_format_or_unknown_columns() -> None:
    m = parse_manifest("id,text,response_format,colour\nx,Hi.,mp3,\ny,Hi.,,red\n", "csv")
    assert not m.prompts and [e.field for e in m.errors] == ["response_format", "colour"]


def test_detect_format() -> None:
    assert detect_format("[1]") == "json" and detect_format("- a: 1") == "yaml"
    assert detect_format("id,text\n") == "csv" and detect_format("x", "m.YAML") == "yaml"
    with pytest.raises(InvalidRequest):
        detect_format("x", "m.xlsx")


def test_default_seed_is_stable_and_31_bit() -> None:
    assert default_seed("welcome") == default_seed("welcome") != default_seed("welcome2")
    assert 0 <= default_seed("x") < 2**31


def test_job_payload_validation() -> None:
    job = PrerenderJob.from_payload({"library": "acme", "manifest": "id,text\n", "presets": "mulaw8k,mp3"})
    assert job.presets == ("mulaw8k", "mp3") and job.post.loudness_lufs == -19.0
    assert PrerenderJob.from_payload({"library": "acme", "manifest": "x"}).presets == DEFAULT_PRESETS
    for bad, field in [
        ({"library": "../x", "manifest": "x"}, "library"),
        ({"library": "a"}, "manifest"),
        ({"library": "a", "manifest": "x", "presets": ["gsm"]}, "presets"),
        ({"library": "a", "manifest": "x", "loudness_lufs": 3}, "loudness_lufs"),
        ({"library": "a", "manifest": "x", "colour": 1}, "colour"),
    ]:
        with pytest.raises(InvalidRequest) as e:
            PrerenderJob.from_payload(bad)
        assert e.value.field == field
    assert library_prefix("acme-ivr.v2") == "libraries/acme-ivr.v2/"


def _speech_like(sr: int = 24000) -> np.ndarray:
    t = np.arange(int(0.6 * sr)) / sr
    tone = 0.05 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    silence = np.zeros(int(0.5 * sr))
    return np.concatenate([silence, tone, silence]).astype(np.float32)


def test_postprocess_trims_and_leaves_the_level_to_each_preset() -> None:
    x = _speech_like()
    y, facts = postprocess(x, PostProcess(loudness_lufs=-20.0, pad_ms=50.0, highpass_hz=None))
    assert facts["source_duration_s"] == pytest.approx(1.6, abs=0.01)
    assert facts["duration_s"] == pytest.approx(0.7, abs=0.03)
    assert facts["source_loudness_lufs"] == pytest.approx(integrated_loudness(y, 24000), abs=0.01)
    assert np.abs(y).max() == pytest.approx(np.abs(x).max(), rel=1e-6)  # no gain here
    assert y[0] == 0.0 and y[-1] == 0.0  # faded edges


def test_postprocess_takes_a_dc_offset_off_without_touching_the_speech_band() -> None:
    x = _speech_like()
    y, _ = postprocess(x + np.float32(0.2), PostProcess(trim=False))
    assert abs(float(y.mean())) < 1e-3 and np.abs(y).max() < 0.09  # the offset (0.2) is gone
    clean, _ = postprocess(x, PostProcess(trim=False))
    assert integrated_loudness(y, 24000) == pytest.approx(integrated_loudness(clean, 24000), abs=0.1)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_encodes_a_readable_file(name: str) -> None:
    preset = PRESETS[name]
    data = encode_preset(_speech_like(), preset)
    raw: dict[str, object] = {}
    if preset.raw:  # Asterisk's headerless files: read as their encoding and rate, as sox -t ul/sln does
        subtype = {"mulaw": "ULAW", "alaw": "ALAW", "pcm": "PCM_16"}[preset.sample_format]
        raw = {
            "format": "RAW",
            "subtype": subtype,
            "samplerate": preset.sample_rate,
            "channels": 1,
            "endian": "LITTLE",
        }
        assert not data.startswith(b"RIFF")
    with sf.SoundFile(io.BytesIO(data), **raw) as f:
        assert f.samplerate == preset.sample_rate and f.channels == 1
        assert f.frames == pytest.approx(1.6 * preset.sample_rate, rel=0.05)
    if name == "mulaw8k":
        assert sf.info(io.BytesIO(data)).subtype == "ULAW"
    if name == "alaw8k":
        assert sf.info(io.BytesIO(data)).subtype == "ALAW"


def test_a_prompt_survives_its_trip_through_a_chunk_payload() -> None:
    from voxcast.prerender.manifest import prompt_from_row

    m = parse_manifest(CSV, "library.csv")
    g = parse_manifest("id,text,greedy,speed,max_frames\ng,Greedy.,true,1.5,40\n", "csv").prompts[0]
    for p in [*m.prompts, g]:
        back = prompt_from_row(json.loads(json.dumps(p.to_row())))
        assert (back.id, back.row, back.fields) == (p.id, p.row, p.fields)
        assert back.request == p.request


def test_chunks_close_at_either_limit_and_keep_the_order() -> None:
    from voxcast.prerender.plan import chunk_work
    from voxcast.prerender.render import Work

    texts = ["a" * 10, "b" * 10, "c" * 50, "d" * 10, "e" * 10, "f" * 10]
    csv_text = "id,text\n" + "".join(f"p{i},{t}\n" for i, t in enumerate(texts))
    work = [Work(p, "h", {}) for p in parse_manifest(csv_text, "csv").prompts]
    chunks = chunk_work(work, max_prompts=3, max_chars=40)
    assert [[w.prompt.id for w in c] for c in chunks] == [["p0", "p1"], ["p2"], ["p3", "p4", "p5"]]


def test_job_in_flight_and_chunk_size_and_the_chunk_payload() -> None:
    job = PrerenderJob.from_payload(
        {"library": "a", "manifest": "x", "in_flight": 4, "chunk_prompts": 8, "loudness_lufs": None,
         "gate": {"max_pause_ms": 900}, "defaults": {"voice": "ryan"}, "presets": ["mp3"]}
    )  # fmt: skip
    assert (job.in_flight, job.chunk_prompts) == (4, 8)
    again = PrerenderJob.from_payload(json.loads(json.dumps(job.to_payload())))
    assert again == PrerenderJob(**{**vars(job), "manifest": ""})
    for bad in ({"in_flight": 0}, {"in_flight": 2.5}, {"chunk_prompts": True}, {"in_flight": 65}):
        with pytest.raises(InvalidRequest) as e:
            PrerenderJob.from_payload({"library": "a", "manifest": "x", **bad})
        assert e.value.field == next(iter(bad))
