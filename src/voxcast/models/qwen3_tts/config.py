"""The model configuration of a Qwen3-TTS-12Hz checkpoint, parsed from its ``config.json``.

Frozen dataclasses mirror the three parts of the file: the talker (28-layer transformer over codec
frames), its code predictor (5-layer transformer producing codes 1..15 of each frame) and, for Base
checkpoints, the ECAPA-TDNN speaker encoder. Every value that decides the network's shape or the
prompt layout is read from the file: the official configuration classes' defaults are not the
released values (20 layers, 32 code groups, other special ids) and are never used here. The one
exception is the speaker encoder, whose released ``config.json`` only gives ``enc_dim`` and
``sample_rate``: the released weights were built with the official class's defaults for the other
fields, so those defaults are repeated below.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from voxcast.errors import CheckpointError

__all__ = [
    "MODEL_TYPES",
    "CodePredictorConfig",
    "Qwen3TTSConfig",
    "SpeakerEncoderConfig",
    "TalkerConfig",
]

#: The ``tts_model_type`` values of the released checkpoints.
MODEL_TYPES = ("base", "custom_voice", "voice_design")


def _req(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise CheckpointError(f"config.json: {where} has no {key!r}")
    return d[key]


def _int(d: Mapping[str, Any], key: str, where: str) -> int:
    v = _req(d, key, where)
    if isinstance(v, bool) or not isinstance(v, int):
        raise CheckpointError(f"config.json: {where}.{key} must be an integer, got {v!r}")
    return v


@dataclass(frozen=True)
class CodePredictorConfig:
    """``talker_config.code_predictor_config``: the per-frame transformer for codes 1..15."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_code_groups: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CodePredictorConfig:
        """Parse the ``code_predictor_config`` mapping.

        Raises:
            CheckpointError: a required field is missing or the layer types are not all full attention.
        """
        w = "talker_config.code_predictor_config"
        layers = _int(d, "num_hidden_layers", w)
        types = d.get("layer_types") or ["full_attention"] * layers
        if d.get("use_sliding_window") or any(t != "full_attention" for t in types):
            raise CheckpointError(f"config.json: {w} uses sliding-window layers, which are not supported")
        heads = _int(d, "num_attention_heads", w)
        return cls(
            hidden_size=_int(d, "hidden_size", w),
            intermediate_size=_int(d, "intermediate_size", w),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or _int(d, "hidden_size", w) // heads),
            vocab_size=_int(d, "vocab_size", w),
            num_code_groups=_int(d, "num_code_groups", w),
            rms_norm_eps=float(_req(d, "rms_norm_eps", w)),
            rope_theta=float(_req(d, "rope_theta", w)),
            attention_bias=bool(d.get("attention_bias", False)),
        )


@dataclass(frozen=True)
class TalkerConfig:
    """``talker_config``: the main transformer, its embeddings and every special codec id."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_token_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    codec_language_id: Mapping[str, int]
    spk_id: Mapping[str, int]
    #: speaker -> dialect language name (a key of ``codec_language_id``), or None.
    spk_is_dialect: Mapping[str, str | None]
    code_predictor: CodePredictorConfig
    attention_bias: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TalkerConfig:
        """Parse the ``talker_config`` mapping.

        Raises:
            CheckpointError: a required field is missing or inconsistent.
        """
        w = "talker_config"
        if d.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"config.json: {w}.hidden_act {d.get('hidden_act')!r} is not supported")
        if d.get("use_sliding_window"):
            raise CheckpointError(f"config.json: {w} uses a sliding window, which is not supported")
        heads = _int(d, "num_attention_heads", w)
        head_dim = int(d.get("head_dim") or _int(d, "hidden_size", w) // heads)
        rope = d.get("rope_scaling") or {}
        section = tuple(int(x) for x in rope.get("mrope_section", (head_dim // 2,)))
        if sum(section) != head_dim // 2:
            raise CheckpointError(f"config.json: {w}.rope_scaling.mrope_section must sum to head_dim/2")
        langs = {str(k).lower(): int(v) for k, v in (_req(d, "codec_language_id", w) or {}).items()}
        spk = {str(k).lower(): int(v) for k, v in (d.get("spk_id") or {}).items()}
        dialect: dict[str, str | None] = {}
        for name, v in (d.get("spk_is_dialect") or {}).items():
            dialect[str(name).lower()] = str(v).lower() if v not in (False, None, "") else None
        for name, dia in dialect.items():
            if dia is not None and dia not in langs:
                raise CheckpointError(f"config.json: speaker {name!r} has unknown dialect {dia!r}")
        return cls(
            hidden_size=_int(d, "hidden_size", w),
            intermediate_size=_int(d, "intermediate_size", w),
            num_hidden_layers=_int(d, "num_hidden_layers", w),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            vocab_size=_int(d, "vocab_size", w),
            text_vocab_size=_int(d, "text_vocab_size", w),
            text_hidden_size=_int(d, "text_hidden_size", w),
            num_code_groups=_int(d, "num_code_groups", w),
            rms_norm_eps=float(_req(d, "rms_norm_eps", w)),
            rope_theta=float(_req(d, "rope_theta", w)),
            mrope_section=section,
            mrope_interleaved=bool(rope.get("interleaved", False)),
            codec_pad_id=_int(d, "codec_pad_id", w),
            codec_bos_id=_int(d, "codec_bos_id", w),
            codec_eos_token_id=_int(d, "codec_eos_token_id", w),
            codec_think_id=_int(d, "codec_think_id", w),
            codec_nothink_id=_int(d, "codec_nothink_id", w),
            codec_think_bos_id=_int(d, "codec_think_bos_id", w),
            codec_think_eos_id=_int(d, "codec_think_eos_id", w),
            codec_language_id=MappingProxyType(langs),
            spk_id=MappingProxyType(spk),
            spk_is_dialect=MappingProxyType(dialect),
            code_predictor=CodePredictorConfig.from_dict(_req(d, "code_predictor_config", w)),
            attention_bias=bool(d.get("attention_bias", False)),
        )


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """``speaker_encoder_config`` (Base checkpoints): ECAPA-TDNN producing the x-vector.

    Defaults are the official class's, which the released files rely on for everything except
    ``enc_dim`` and ``sample_rate``.
    """

    enc_dim: int
    sample_rate: int = 24000
    mel_dim: int = 128
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeakerEncoderConfig:
        """Parse the ``speaker_encoder_config`` mapping (missing fields take the official defaults)."""
        kw: dict[str, Any] = {"enc_dim": _int(d, "enc_dim", "speaker_encoder_config")}
        for key in (
            "sample_rate",
            "mel_dim",
            "enc_attention_channels",
            "enc_res2net_scale",
            "enc_se_channels",
        ):
            if key in d:
                kw[key] = int(d[key])
        for key in ("enc_channels", "enc_kernel_sizes", "enc_dilations"):
            if key in d:
                kw[key] = tuple(int(x) for x in d[key])
        cfg = cls(**kw)
        if not len(cfg.enc_channels) == len(cfg.enc_kernel_sizes) == len(cfg.enc_dilations):
            raise CheckpointError("config.json: speaker_encoder_config lists differ in length")
        return cfg


@dataclass(frozen=True)
class Qwen3TTSConfig:
    """A whole ``config.json``."""

    tts_model_type: str
    tts_model_size: str
    tokenizer_type: str
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None
    im_start_token_id: int
    im_end_token_id: int
    assistant_token_id: int
    tts_pad_token_id: int
    tts_bos_token_id: int
    tts_eos_token_id: int
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Qwen3TTSConfig:
        """Parse a loaded ``config.json``.

        Raises:
            CheckpointError: not a Qwen3-TTS-12Hz config, or a field is missing or inconsistent.
        """
        if d.get("model_type") != "qwen3_tts":
            raise CheckpointError(f"config.json: model_type is {d.get('model_type')!r}, not 'qwen3_tts'")
        kind = str(_req(d, "tts_model_type", "config"))
        if kind not in MODEL_TYPES:
            raise CheckpointError(f"config.json: unknown tts_model_type {kind!r} (known: {MODEL_TYPES})")
        tok = str(d.get("tokenizer_type", "qwen3_tts_tokenizer_12hz"))
        if tok != "qwen3_tts_tokenizer_12hz":
            raise CheckpointError(f"config.json: tokenizer_type {tok!r} is not supported (12 Hz only)")
        talker = TalkerConfig.from_dict(_req(d, "talker_config", "config"))
        spk_enc = None
        if kind == "base":
            spk_enc = SpeakerEncoderConfig.from_dict(_req(d, "speaker_encoder_config", "config"))
            if spk_enc.enc_dim != talker.hidden_size:
                raise CheckpointError("config.json: speaker_encoder_config.enc_dim != talker hidden_size")
        cfg = cls(
            tts_model_type=kind,
            tts_model_size=str(d.get("tts_model_size", "")),
            tokenizer_type=tok,
            talker=talker,
            speaker_encoder=spk_enc,
            im_start_token_id=_int(d, "im_start_token_id", "config"),
            im_end_token_id=_int(d, "im_end_token_id", "config"),
            assistant_token_id=_int(d, "assistant_token_id", "config"),
            tts_pad_token_id=_int(d, "tts_pad_token_id", "config"),
            tts_bos_token_id=_int(d, "tts_bos_token_id", "config"),
            tts_eos_token_id=_int(d, "tts_eos_token_id", "config"),
            raw=MappingProxyType(dict(d)),
        )
        cfg._check()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path) -> Qwen3TTSConfig:
        """Read and parse a ``config.json`` file.

        Raises:
            CheckpointError: unreadable, not JSON, or not a valid config.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read {path}: {e}") from e
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: not a JSON object")
        return cls.from_dict(data)

    def _check(self) -> None:
        t = self.talker
        if self.tts_model_type == "custom_voice" and not t.spk_id:
            raise CheckpointError("config.json: a custom_voice model without spk_id")
        if t.num_code_groups != t.code_predictor.num_code_groups:
            raise CheckpointError("config.json: talker and code predictor disagree on num_code_groups")
        ids = [t.codec_pad_id, t.codec_bos_id, t.codec_eos_token_id, t.codec_think_id, t.codec_nothink_id]
        ids += [*t.codec_language_id.values(), *t.spk_id.values()]
        if any(not 0 <= i < t.vocab_size for i in ids):
            raise CheckpointError("config.json: a codec special id is outside the codec vocabulary")

    @property
    def speakers(self) -> tuple[str, ...]:
        """Named speakers (CustomVoice), lower case, in file order."""
        return tuple(self.talker.spk_id)

    @property
    def languages(self) -> tuple[str, ...]:
        """Languages a request may name: "auto" plus every non-dialect language id."""
        return ("auto", *(k for k in self.talker.codec_language_id if "dialect" not in k))

    @property
    def has_mtp_projection(self) -> bool:
        """Whether ``small_to_mtp_projection`` is a Linear (talker and code predictor widths differ)."""
        return self.talker.hidden_size != self.talker.code_predictor.hidden_size

    @property
    def supports_instruct(self) -> bool:
        """Whether the model honours ``instruct`` (VoiceDesign; CustomVoice except 0.6B)."""
        if self.tts_model_type == "voice_design":
            return True
        return self.tts_model_type == "custom_voice" and self.tts_model_size not in ("0b6", "")
