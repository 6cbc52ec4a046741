"""VoicePrompt: exact round trip, refusal of corrupt/foreign/other-schema bytes, content ids, building."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import save as st_save

from voxcast.errors import InvalidRequest
from voxcast.models.qwen3_tts.codec_encoder import CodecEncoder, load_codec_encoder
from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder, SpeakerEncoderConfig
from voxcast.models.qwen3_tts.voice_prompt import (
    SCHEMA_VERSION,
    InvalidVoicePrompt,
    VoicePrompt,
    build_voice_prompt,
)
from voxcast.testing.qwen3_tts_parts import (
    random_speaker_encoder_state,
    tiny_speaker_encoder_config,
    write_random_speech_tokenizer,
)


def _icl() -> VoicePrompt:
    g = torch.Generator().manual_seed(0)
    return VoicePrompt(
        x_vector=torch.randn(64, generator=g),
        ref_codes=torch.randint(0, 2048, (37, 16), generator=g),
        ref_text="The quick brown fox.",
        ref_text_ids=torch.tensor([785, 3974, 13876, 38835, 13]),
        x_vector_only=False,
        model_identity="qwen3-tts-12hz-base:abc",
    )


def _xvec() -> VoicePrompt:
    return VoicePrompt(torch.linspace(-1, 1, 32), None, None, None, True, "m")


@pytest.mark.parametrize("make", [_icl, _xvec])
def test_round_trip_is_exact(make: object) -> None:
    p = make()  # type: ignore[operator]
    q = VoicePrompt.from_bytes(p.to_bytes())
    assert q == p
    assert q.x_vector.dtype == torch.float32 and torch.equal(q.x_vector, p.x_vector)
    if p.ref_codes is not None:
        assert q.ref_codes is not None and q.ref_codes.dtype == torch.int64
        assert torch.equal(q.ref_codes, p.ref_codes)
    assert q.icl == (not q.x_vector_only) and q.schema_version == SCHEMA_VERSION
    assert p.to_bytes() == q.to_bytes()  # deterministic bytes


def test_expected_identity() -> None:
    b = _icl().to_bytes()
    assert VoicePrompt.from_bytes(b, expected_identity="qwen3-tts-12hz-base:abc") == _icl()
    with pytest.raises(InvalidVoicePrompt, match="made by model"):
        VoicePrompt.from_bytes(b, expected_identity="other")


def _with_metadata(meta: dict[str, str], tensors: dict[str, torch.Tensor] | None = None) -> bytes:
    return bytes(st_save(tensors or {"x_vector": torch.zeros(4)}, metadata=meta))


def _valid_meta(**over: object) -> dict[str, str]:
    meta: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "ref_text": None,
        "x_vector_only": True,
        "model_identity": "m",
    }
    meta.update(over)
    return {"voxcast.voice_prompt": json.dumps(meta)}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00" * 7,
        b"not a safetensors file at all, just text",
        struct.pack("<Q", 10**12) + b"{}",
        struct.pack("<Q", 4) + b"{bad",
        _icl().to_bytes()[:-3],  # truncated
        bytes(st_save({"x_vector": torch.zeros(4)})),  # safetensors, no metadata
        _with_metadata({"format": "something.else"}),  # foreign safetensors
        _with_metadata(_valid_meta(schema_version=999)),  # other schema
        _with_metadata({"voxcast.voice_prompt": "{not json"}),
        _with_metadata({"voxcast.voice_prompt": "[]"}),
        _with_metadata(
            {"voxcast.voice_prompt": json.dumps({"schema_version": SCHEMA_VERSION})}
        ),  # missing fields
        _with_metadata(_valid_meta(), {"other": torch.zeros(4)}),  # no x_vector
        _with_metadata(_valid_meta(), {"x_vector": torch.zeros(4, dtype=torch.float64)}),
        _with_metadata(_valid_meta(), {"x_vector": torch.tensor([float("nan")] * 4)}),
        _with_metadata(_valid_meta(ref_text="hi", x_vector_only=False)),  # ICL without codes
        _with_metadata(_valid_meta(x_vector_only="yes")),
        _with_metadata(  # x-vector-only with codes
            _valid_meta(), {"x_vector": torch.zeros(4), "ref_codes": torch.zeros(3, 16, dtype=torch.int16)}
        ),
    ],
    ids=lambda d: f"{len(d)}B",
)
def test_rejects_bad_bytes(data: bytes) -> None:
    with pytest.raises(InvalidVoicePrompt) as e:
        VoicePrompt.from_bytes(data)
    assert isinstance(e.value, InvalidRequest) and e.value.to_dict()["code"] == "invalid_voice_prompt"


def test_schema_mismatch_message_says_recompute() -> None:
    with pytest.raises(InvalidVoicePrompt, match="recompute"):
        VoicePrompt.from_bytes(_with_metadata(_valid_meta(schema_version=0)))


def test_constructor_checks_consistency() -> None:
    with pytest.raises(InvalidVoicePrompt):
        VoicePrompt(torch.zeros(4), torch.zeros(3, 15, dtype=torch.long), "t", None, False, "m")
    with pytest.raises(InvalidVoicePrompt):
        VoicePrompt(torch.zeros(4), torch.zeros(3, 16, dtype=torch.long), "", None, False, "m")
    with pytest.raises(InvalidVoicePrompt):
        VoicePrompt(torch.zeros(4, 2), None, None, None, True, "m")


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> tuple[SpeakerEncoder, CodecEncoder]:
    d = write_random_speech_tokenizer(tmp_path_factory.mktemp("st") / "speech_tokenizer", "tiny", 0)
    cfg = tiny_speaker_encoder_config(64)
    spk = SpeakerEncoder(SpeakerEncoderConfig.from_dict(cfg))
    spk.load_state_dict(
        {k.removeprefix("speaker_encoder."): v for k, v in random_speaker_encoder_state(cfg).items()}
    )
    return spk.eval(), load_codec_encoder(d)


def _wav_bytes(seconds: float = 2.0, sr: int = 24000) -> bytes:
    t = np.arange(int(seconds * sr)) / sr
    wav = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    sf.write(buf, wav.astype(np.float32), sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_build_icl_and_xvector_only(encoders: tuple[SpeakerEncoder, CodecEncoder], tmp_path: Path) -> None:
    spk, enc = encoders
    audio = _wav_bytes(2.0)
    p = build_voice_prompt(
        spk, enc, audio, "hello", x_vector_only=False, model_identity="m", tokenize=lambda s: [1, 2]
    )
    assert p.icl and p.ref_codes is not None and p.ref_codes.shape == (25, 16)
    assert p.x_vector.shape == (64,) and p.ref_text == "hello"
    assert p.ref_text_ids is not None and p.ref_text_ids.tolist() == [1, 2]
    assert VoicePrompt.from_bytes(p.to_bytes()) == p
    path = tmp_path / "ref.wav"
    path.write_bytes(audio)
    x = build_voice_prompt(spk, enc, path, None, x_vector_only=True, model_identity="m")
    assert x.x_vector_only and x.ref_codes is None and x.ref_text is None
    assert torch.equal(x.x_vector, p.x_vector)


def test_build_requires_ref_text_for_icl(encoders: tuple[SpeakerEncoder, CodecEncoder]) -> None:
    spk, enc = encoders
    for text in (None, "", "   "):
        with pytest.raises(InvalidRequest) as e:
            build_voice_prompt(spk, enc, _wav_bytes(), text, x_vector_only=False, model_identity="m")
        assert e.value.field == "ref_text"
    with pytest.raises(InvalidRequest) as e:
        build_voice_prompt(spk, enc, b"junk" * 100, "hi", x_vector_only=False, model_identity="m")
    assert e.value.field == "ref_audio"
