"""config.json parsing: the five published configs (when the reference folder is present) and errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from voxcast.errors import CheckpointError
from voxcast.models.qwen3_tts.config import Qwen3TTSConfig
from voxcast.testing.qwen3_tts import model_config_dict, reference_dir

REF = reference_dir()
needs_reference = pytest.mark.skipif(REF is None, reason="reference configs (../shared) not present")

# (tts_model_type, size tag, talker width, code predictor width, has speaker encoder, speakers)
PUBLISHED = {
    "0.6B-Base": ("base", "0b6", 1024, 1024, True, 0),
    "0.6B-CustomVoice": ("custom_voice", "0b6", 1024, 1024, False, 9),
    "1.7B-Base": ("base", "1b7", 2048, 1024, True, 0),
    "1.7B-CustomVoice": ("custom_voice", "1b7", 2048, 1024, False, 9),
    "1.7B-VoiceDesign": ("voice_design", "1b7", 2048, 1024, False, 0),
}


@needs_reference
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs(name: str) -> None:
    assert REF is not None
    cfg = Qwen3TTSConfig.from_file(REF / "configs" / name / "config.json")
    kind, size, width, cp_width, has_spk, n_spk = PUBLISHED[name]
    t = cfg.talker
    assert (cfg.tts_model_type, cfg.tts_model_size) == (kind, size)
    assert (t.hidden_size, t.code_predictor.hidden_size) == (width, cp_width)
    assert (t.num_hidden_layers, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (28, 16, 8, 128)
    cp = t.code_predictor
    assert (cp.num_hidden_layers, cp.num_attention_heads, cp.num_key_value_heads, cp.vocab_size) == (
        5,
        16,
        8,
        2048,
    )
    assert t.num_code_groups == cp.num_code_groups == 16
    assert (t.vocab_size, t.text_vocab_size, t.text_hidden_size) == (3072, 151936, 2048)
    assert (t.codec_pad_id, t.codec_bos_id, t.codec_eos_token_id) == (2148, 2149, 2150)
    assert (t.codec_think_id, t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id) == (
        2154,
        2155,
        2156,
        2157,
    )
    assert t.mrope_section == (24, 20, 20) and t.mrope_interleaved and t.rope_theta == 1e6
    assert (cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id) == (151671, 151672, 151673)
    assert (cfg.im_start_token_id, cfg.im_end_token_id, cfg.assistant_token_id) == (151644, 151645, 77091)
    assert (cfg.speaker_encoder is not None) == has_spk
    if cfg.speaker_encoder is not None:
        assert cfg.speaker_encoder.enc_dim == width
        assert cfg.speaker_encoder.enc_channels == (512, 512, 512, 512, 1536)
    assert len(cfg.speakers) == n_spk
    assert cfg.has_mtp_projection == (width != cp_width)
    assert cfg.languages[0] == "auto" and "english" in cfg.languages
    assert not any("dialect" in lang for lang in cfg.languages)
    assert cfg.supports_instruct == (kind == "voice_design" or (kind == "custom_voice" and size == "1b7"))
    if n_spk:
        assert t.spk_id["ryan"] == 3061 and t.spk_id["eric"] == 2875
        assert (
            t.spk_is_dialect["eric"] == "sichuan_dialect" and t.spk_is_dialect["dylan"] == "beijing_dialect"
        )
        assert t.spk_is_dialect["ryan"] is None
        assert t.codec_language_id["beijing_dialect"] == 2074


@pytest.mark.parametrize("kind", ["base", "custom_voice", "voice_design"])
@pytest.mark.parametrize("size", ["tiny", "tiny-1.7b"])
def test_tiny_configs_parse(kind: str, size: str) -> None:
    cfg = Qwen3TTSConfig.from_dict(model_config_dict(kind, size))
    assert cfg.tts_model_type == kind
    assert cfg.has_mtp_projection == (size == "tiny-1.7b" or kind == "voice_design")


@needs_reference
@pytest.mark.parametrize(("kind", "size"), [("custom_voice", "0.6b"), ("base", "1.7b")])
def test_full_size_test_configs_are_the_published_ones(kind: str, size: str) -> None:
    cfg = Qwen3TTSConfig.from_dict(model_config_dict(kind, size))
    assert cfg.talker.num_hidden_layers == 28


def test_config_is_frozen() -> None:
    cfg = Qwen3TTSConfig.from_dict(model_config_dict("custom_voice"))
    with pytest.raises(AttributeError):
        cfg.tts_model_type = "base"  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.talker.spk_id["x"] = 1  # type: ignore[index]


def _broken(mutate: Any) -> dict[str, Any]:
    d = copy.deepcopy(model_config_dict("custom_voice"))
    mutate(d)
    return d


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(model_type="llama"), "model_type"),
        (lambda d: d.update(tts_model_type="karaoke"), "tts_model_type"),
        (lambda d: d.update(tokenizer_type="qwen3_tts_tokenizer_25hz"), "tokenizer_type"),
        (lambda d: d.pop("talker_config"), "talker_config"),
        (lambda d: d["talker_config"].pop("codec_eos_token_id"), "codec_eos_token_id"),
        (lambda d: d["talker_config"].update(num_hidden_layers="2"), "integer"),
        (lambda d: d["talker_config"]["code_predictor_config"].pop("vocab_size"), "vocab_size"),
        (lambda d: d["talker_config"].update(spk_id={}), "spk_id"),
        (lambda d: d["talker_config"]["spk_is_dialect"].update(eric="klingon_dialect"), "dialect"),
        (lambda d: d["talker_config"].update(codec_pad_id=99999), "outside"),
        (lambda d: d["talker_config"]["rope_scaling"].update(mrope_section=[1, 1, 1]), "mrope_section"),
        (lambda d: d.update(tts_pad_token_id=None), "tts_pad_token_id"),
    ],
)
def test_bad_configs_raise_checkpoint_error(mutate: Any, needle: str) -> None:
    with pytest.raises(CheckpointError, match=needle):
        Qwen3TTSConfig.from_dict(_broken(mutate))


def test_base_without_speaker_encoder_config() -> None:
    d = copy.deepcopy(model_config_dict("base"))
    d.pop("speaker_encoder_config")
    with pytest.raises(CheckpointError, match="speaker_encoder_config"):
        Qwen3TTSConfig.from_dict(d)


def test_from_file_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot read"):
        Qwen3TTSConfig.from_file(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read"):
        Qwen3TTSConfig.from_file(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    with pytest.raises(CheckpointError, match="not a JSON object"):
        Qwen3TTSConfig.from_file(tmp_path / "list.json")
