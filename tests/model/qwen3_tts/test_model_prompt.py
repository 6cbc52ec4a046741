"""Prefill layouts of every mode and request validation (InvalidRequest with the right field)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from voxcast.errors import InvalidRequest
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt

TEXT = "Good morning, how are you today?"


@pytest.fixture(scope="module")
def models(tiny_model_dir: Any) -> dict[str, Qwen3TTS]:
    return {
        "custom_voice": Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice"))),
        "custom_voice_17": Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice", "tiny-1.7b"))),
        "base": Qwen3TTS.from_pretrained(str(tiny_model_dir("base"))),
        "voice_design": Qwen3TTS.from_pretrained(str(tiny_model_dir("voice_design"))),
    }


def _voice(
    model: Qwen3TTS, frames: int | None, ref_text: str | None = "A reference sentence."
) -> VoicePrompt:
    g = torch.Generator().manual_seed(frames or 0)
    x = torch.randn(model.config.talker.hidden_size, generator=g)
    if frames is None:
        return VoicePrompt(x, None, None, None, True, model.identity)
    codes = torch.randint(0, 2048, (frames, 16), generator=g)
    return VoicePrompt(x, codes, ref_text, None, False, model.identity)


def _n_text(model: Qwen3TTS, text: str) -> int:
    return len(model.tokenizer.encode(text))


@pytest.mark.parametrize(("language", "tags"), [("english", 4), ("auto", 3)])
def test_custom_voice_layout(models: dict[str, Qwen3TTS], language: str, tags: int) -> None:
    m = models["custom_voice"]
    n = _n_text(m, TEXT)
    p = m.build_prompt(TEXT, speaker="Ryan", language=language)
    # role 3 + tags + speaker 1 + (tts_bos, pad) 1 + text n + eod 1 + final (pad, bos) 1
    assert p.length == 3 + tags + 1 + 1 + n + 1 + 1
    assert p.trailing.shape[1] == 1 and torch.equal(p.trailing, p.pad)
    assert p.mode == "custom_voice" and p.text_tokens == n and p.voice is None
    s = m.build_prompt(TEXT, speaker="ryan", language=language, non_streaming_text=False)
    assert s.length == 3 + tags + 1 + 1 + 1 and s.trailing.shape[1] == n  # text[1:] + eod
    assert torch.equal(s.embeds[:, :-1], p.embeds[:, : s.length - 1])


def test_dialect_speaker_uses_dialect_id(models: dict[str, Qwen3TTS]) -> None:
    m = models["custom_voice"]
    t = m.talker
    eric_auto = m.build_prompt(TEXT, speaker="eric", language="auto").embeds
    eric_zh = m.build_prompt(TEXT, speaker="eric", language="chinese").embeds
    eric_en = m.build_prompt(TEXT, speaker="eric", language="english").embeds
    assert torch.equal(eric_auto, eric_zh) and eric_auto.shape[1] == eric_en.shape[1]
    # position 5 (role 3, think, think_bos) carries the language id
    _, _, pad = m._prompts._special_embeds()
    with torch.inference_mode():
        sichuan = pad[0, 0] + t.codec_embed(torch.tensor(2062))
        english = pad[0, 0] + t.codec_embed(torch.tensor(2050))
    assert torch.equal(eric_zh[0, 5], sichuan) and torch.equal(eric_en[0, 5], english)


def test_instruct_is_prepended(models: dict[str, Qwen3TTS]) -> None:
    m = models["custom_voice_17"]
    plain = m.build_prompt(TEXT, speaker="ryan")
    ins = m.build_prompt(TEXT, speaker="ryan", instruct="Whisper.")
    k = len(m.tokenizer.encode("<|im_start|>user\nWhisper.<|im_end|>\n"))
    assert ins.length == plain.length + k
    assert torch.equal(ins.embeds[:, k:], plain.embeds)


def test_voice_design_layout(models: dict[str, Qwen3TTS]) -> None:
    m = models["voice_design"]
    p = m.build_prompt(TEXT, instruct="A bright young voice.")
    k = len(m.tokenizer.encode("<|im_start|>user\nA bright young voice.<|im_end|>\n"))
    n = _n_text(m, TEXT)
    assert p.length == k + 3 + 3 + 1 + n + 2  # no speaker slot
    assert p.mode == "voice_design"


def test_x_vector_clone_layout(models: dict[str, Qwen3TTS]) -> None:
    m = models["base"]
    v = _voice(m, None)
    p = m.build_prompt(TEXT, voice=v, language="english")
    assert p.mode == "clone_xvector" and p.voice is v
    assert p.length == 3 + 4 + 1 + 1 + 1  # streaming text by default for clones
    with torch.inference_mode():
        _, _, pad = m._prompts._special_embeds()
    assert torch.equal(p.embeds[0, 7], pad[0, 0] + v.x_vector)  # x-vector goes in unprojected


@pytest.mark.parametrize("frames", [3, 40])
def test_icl_layouts(models: dict[str, Qwen3TTS], frames: int) -> None:
    m = models["base"]
    v = _voice(m, frames)
    n = _n_text(m, TEXT)
    n_ref = len(m.tokenizer.encode("A reference sentence."))
    text_len, codec_len = n_ref + n + 1, frames + 1
    prefix = 3 + 4 + 1 + 1
    s = m.build_prompt(TEXT, voice=v, language="english")
    assert s.mode == "clone_icl"
    assert s.length == prefix + codec_len
    assert s.trailing.shape[1] == max(text_len - codec_len, 1)
    ns = m.build_prompt(TEXT, voice=v, language="english", non_streaming_text=True)
    assert ns.length == prefix + text_len + codec_len and torch.equal(ns.trailing, ns.pad)
    assert torch.equal(s.embeds[:, :prefix], ns.embeds[:, :prefix])


def test_voice_caches_are_per_object(models: dict[str, Qwen3TTS]) -> None:
    m = models["base"]
    a, b = _voice(m, 5), _voice(m, 6)
    pa, pb = m.build_prompt(TEXT, voice=a), m.build_prompt(TEXT, voice=b)
    assert not torch.equal(pa.embeds, pb.embeds)
    assert torch.equal(m.build_prompt(TEXT, voice=a).embeds, pa.embeds)


@pytest.mark.parametrize(
    ("kind", "kwargs", "field"),
    [
        ("custom_voice", {"speaker": "nobody"}, "voice"),
        ("custom_voice", {}, "voice"),
        ("custom_voice", {"speaker": "ryan", "language": "klingon"}, "language"),
        ("custom_voice", {"speaker": "ryan", "language": "sichuan_dialect"}, "language"),
        ("custom_voice", {"speaker": "ryan", "instruct": "Shout."}, "instruct"),  # 0.6B: no instruct
        ("custom_voice", {"speaker": "ryan", "voice": "VOICE"}, "ref_audio"),
        ("custom_voice", {"speaker": "ryan", "text": "   "}, "text"),
        ("base", {}, "ref_audio"),
        ("base", {"speaker": "ryan", "voice": "VOICE"}, "voice"),
        ("base", {"voice": "VOICE", "instruct": "Shout."}, "instruct"),
        ("voice_design", {}, "instruct"),
        ("voice_design", {"instruct": " "}, "instruct"),
        ("voice_design", {"instruct": "Deep.", "speaker": "ryan"}, "voice"),
        ("voice_design", {"instruct": "Deep.", "voice": "VOICE"}, "ref_audio"),
    ],
)
def test_invalid_requests(models: dict[str, Qwen3TTS], kind: str, kwargs: dict[str, Any], field: str) -> None:
    m = models[kind]
    kw = dict(kwargs)
    if kw.get("voice") == "VOICE":
        kw["voice"] = _voice(models["base"], 4)
    text = kw.pop("text", TEXT)
    with pytest.raises(InvalidRequest) as e:
        m.build_prompt(text, **kw)
    assert e.value.field == field


def test_voice_from_another_model(models: dict[str, Qwen3TTS]) -> None:
    m = models["base"]
    v = VoicePrompt(torch.zeros(64), None, None, None, True, "some-other-model")
    with pytest.raises(InvalidRequest) as e:
        m.build_prompt(TEXT, voice=v)
    assert e.value.field == "voice"


def test_clone_needs_a_base_model(models: dict[str, Qwen3TTS]) -> None:
    import numpy as np

    with pytest.raises(InvalidRequest) as e:
        models["custom_voice"].make_voice_prompt(np.zeros(24000, dtype=np.float32), 24000, "hi")
    assert e.value.field == "ref_audio"


def test_languages_and_speakers_are_case_insensitive(models: dict[str, Qwen3TTS]) -> None:
    m = models["custom_voice"]
    a = m.build_prompt(TEXT, speaker="UNCLE_FU", language="English").embeds
    b = m.build_prompt(TEXT, speaker="uncle_fu", language="english").embeds
    assert torch.equal(a, b)
