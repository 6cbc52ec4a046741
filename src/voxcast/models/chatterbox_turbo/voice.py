"""A Turbo voice: what T3 and S3Gen are conditioned on, computed once from reference audio.

The official ``prepare_conditionals`` computes, from a reference loudness-normalised to -27 LUFS at
24 kHz (longer than 5 s):

- for T3: the VoiceEncoder embedding of the whole reference at 16 kHz, and the S3 tokens of its first
  15 s (at most 375);
- for S3Gen, from its first 10 s: the 24 kHz log mel (the prompt mel), the speech tokens and the CAMPPlus
  x-vector of the same audio resampled to 16 kHz by S3Gen's own resampler (two mel frames per token:
  the tokens are cut to the mel's length).

:class:`TurboVoice` holds them; it is stored as safetensors with one JSON metadata entry (schema
version, model identity), deterministic bytes for content-addressed storage. The official built-in
voice ``conds.pt`` (a torch pickle) is read with ``weights_only=True`` (no code runs) and converted.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyloudnorm
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from voxcast.audio.resample import resample_fixed
from voxcast.errors import CheckpointError, InvalidRequest, InvalidVoicePrompt

__all__ = ["SCHEMA_VERSION", "TurboVoice", "build_voice"]

SCHEMA_VERSION = 1
_FORMAT = "voxcast-chatterbox-turbo-voice"
REF_RATE, TOKEN_RATE = 24000, 16000
MIN_REFERENCE_S = 5.0
TARGET_LUFS = -27.0
T3_PROMPT_S, T3_PROMPT_TOKENS = 15, 375
S3GEN_PROMPT_S = 10
#: Speech token ids (FSQ 3^8); T3's start and stop tokens are never part of a voice.
SPEECH_TOKENS = 6561


@dataclass(frozen=True)
class TurboVoice:
    """The conditionals of one voice (all on the CPU, float32 / int64).

    Attributes:
        speaker: ``[1, 256]`` VoiceEncoder embedding (T3).
        t3_tokens: ``[1, P]`` speech tokens of the reference's first 15 s (T3's prompt).
        prompt_tokens: ``[1, Q]`` speech tokens of its first 10 s (S3Gen's prompt).
        prompt_mel: ``[1, 2Q, 80]`` their 24 kHz log mel.
        xvector: ``[1, 192]`` CAMPPlus embedding (S3Gen).
        model_identity: the checkpoint the voice was made with ("" for a converted ``conds.pt``).
        name: a built-in voice's name, else "".
    """

    speaker: Tensor
    t3_tokens: Tensor
    prompt_tokens: Tensor
    prompt_mel: Tensor
    xvector: Tensor
    model_identity: str = ""
    name: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        q = self.prompt_tokens.shape[-1]
        if self.prompt_mel.dim() != 3 or self.prompt_mel.shape[1] != 2 * q or self.prompt_mel.shape[2] != 80:
            raise InvalidVoicePrompt(
                f"prompt mel {tuple(self.prompt_mel.shape)} does not match {q} prompt tokens", field="voice"
            )
        shapes = {
            "speaker": (self.speaker, (1, 256)),
            "xvector": (self.xvector, (1, 192)),
        }
        for name, (t, shape) in shapes.items():
            if tuple(t.shape) != shape or not bool(torch.isfinite(t).all()):
                raise InvalidVoicePrompt(
                    f"voice {name} {tuple(t.shape)} is not a finite {shape}", field="voice"
                )
        for name, t in (("t3_tokens", self.t3_tokens), ("prompt_tokens", self.prompt_tokens)):
            if t.dim() != 2 or t.shape[0] != 1 or t.is_floating_point():
                raise InvalidVoicePrompt(f"voice {name} must be [1, n] integers", field="voice")
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= SPEECH_TOKENS):
                raise InvalidVoicePrompt(
                    f"voice {name} holds ids outside [0, {SPEECH_TOKENS})", field="voice"
                )
        if self.t3_tokens.shape[1] > T3_PROMPT_TOKENS:
            raise InvalidVoicePrompt(f"voice t3_tokens: more than {T3_PROMPT_TOKENS}", field="voice")

    def to_bytes(self) -> bytes:
        """Serialise as safetensors with JSON metadata."""
        tensors = {
            "speaker": self.speaker.float().contiguous(),
            "t3_tokens": self.t3_tokens.to(torch.int64).contiguous(),
            "prompt_tokens": self.prompt_tokens.to(torch.int64).contiguous(),
            "prompt_mel": self.prompt_mel.float().contiguous(),
            "xvector": self.xvector.float().contiguous(),
        }
        meta = {
            "schema_version": self.schema_version,
            "model_identity": self.model_identity,
            "name": self.name,
        }
        return bytes(st_save(tensors, metadata={_FORMAT: json.dumps(meta, sort_keys=True)}))

    @classmethod
    def from_bytes(cls, data: bytes, expected_identity: str | None = None) -> TurboVoice:
        """Parse :meth:`to_bytes` output.

        Raises:
            InvalidVoicePrompt: corrupt or foreign bytes, another schema or model (field "voice").
        """
        try:
            n = int.from_bytes(data[:8], "little")
            header = json.loads(data[8 : 8 + n]).get("__metadata__") or {}
            meta = json.loads(header[_FORMAT])
            if not isinstance(meta, dict):
                raise TypeError("metadata is not an object")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InvalidVoicePrompt("data is not a voxcast Chatterbox Turbo voice", field="voice") from e
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise InvalidVoicePrompt(
                f"voice schema {meta.get('schema_version')!r} is not {SCHEMA_VERSION}; recompute it",
                field="voice",
            )
        identity = str(meta.get("model_identity", ""))
        if expected_identity is not None and identity not in ("", expected_identity):
            raise InvalidVoicePrompt("this voice was made by another model; recreate it", field="voice")
        try:
            t = st_load(bytes(data))
            return cls(
                t["speaker"], t["t3_tokens"], t["prompt_tokens"], t["prompt_mel"], t["xvector"],
                identity, str(meta.get("name", "")),
            )  # fmt: skip
        except (KeyError, SafetensorError, ValueError) as e:
            raise InvalidVoicePrompt(f"corrupt voice: {e}", field="voice") from e

    @classmethod
    def from_conds(cls, path: str | Path, name: str = "default") -> TurboVoice:
        """Convert the official ``conds.pt`` (read with ``weights_only=True``: tensors only, no code).

        Raises:
            CheckpointError: unreadable, or not the official layout.
        """
        try:
            raw: Any = torch.load(str(path), map_location="cpu", weights_only=True)
            t3, gen = raw["t3"], raw["gen"]
            return cls(
                speaker=t3["speaker_emb"].float().reshape(1, -1),
                t3_tokens=torch.atleast_2d(t3["cond_prompt_speech_tokens"]).long(),
                prompt_tokens=torch.atleast_2d(gen["prompt_token"]).long(),
                prompt_mel=gen["prompt_feat"].float(),
                xvector=gen["embedding"].float().reshape(1, -1),
                name=name,
            )
        except (OSError, RuntimeError, KeyError, TypeError, AttributeError, InvalidVoicePrompt) as e:
            raise CheckpointError(f"{path}: not a Chatterbox Turbo conds.pt: {e}") from e
        except pickle.UnpicklingError as e:  # weights_only refused something other than tensors
            raise CheckpointError(f"{path}: holds more than tensors; refused: {e}") from e


def normalize_loudness(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """The official ``norm_loudness``: gain to -27 LUFS integrated (no peak limit), skipped when the
    loudness cannot be measured (silence: -inf)."""
    try:
        loudness = pyloudnorm.Meter(sample_rate).integrated_loudness(wav)
    except ValueError:
        return wav
    gain = 10.0 ** ((TARGET_LUFS - loudness) / 20.0)
    return wav * gain if math.isfinite(gain) and gain > 0.0 else wav


def resample_16k(wav: np.ndarray) -> np.ndarray:
    """24 -> 16 kHz as ``librosa.resample(res_type="soxr_hq")`` (upstream's T3 side)."""
    return resample_fixed(wav, REF_RATE, TOKEN_RATE)


def build_voice(
    wav_24k: np.ndarray,
    *,
    embed_speaker: Callable[[np.ndarray], Tensor],
    tokens: Callable[[Tensor, int | None], Tensor],
    xvector: Callable[[Tensor], Tensor],
    mel: Callable[[Tensor], Tensor],
    resample: Callable[[Tensor, int, int], Tensor],
    model_identity: str,
) -> TurboVoice:
    """A voice from a mono 24 kHz float reference, as the official ``prepare_conditionals``.

    Args:
        embed_speaker: 16 kHz numpy audio -> ``[1, 256]`` (the VoiceEncoder).
        tokens: (16 kHz audio ``[1, L]``, max tokens or None) -> ``[1, T]`` (the S3 tokenizer).
        xvector: 16 kHz audio ``[1, L]`` -> ``[1, 192]`` (CAMPPlus).
        mel: 24 kHz audio ``[1, L]`` -> ``[1, 80, frames]``.
        resample: S3Gen's resampler (audio, rate in, rate out).

    Raises:
        InvalidRequest: the reference is 5 s or shorter (field "ref_audio").
    """
    wav = np.asarray(wav_24k, dtype=np.float32)
    if wav.ndim != 1 or len(wav) / REF_RATE <= MIN_REFERENCE_S:
        raise InvalidRequest(
            f"reference audio must be longer than {MIN_REFERENCE_S:g} s (got {len(wav) / REF_RATE:.2f} s)",
            field="ref_audio",
        )
    wav = normalize_loudness(wav, REF_RATE).astype(np.float32, copy=False)
    ref_16k = resample_16k(wav)
    gen_24k = torch.from_numpy(np.ascontiguousarray(wav[: S3GEN_PROMPT_S * REF_RATE]))[None].float()
    prompt_mel = mel(gen_24k).transpose(1, 2)
    gen_16k = resample(gen_24k, REF_RATE, TOKEN_RATE)
    xvec = xvector(gen_16k)
    prompt_tokens = tokens(gen_16k.float(), None)
    if prompt_mel.shape[1] != 2 * prompt_tokens.shape[1]:
        prompt_tokens = prompt_tokens[:, : prompt_mel.shape[1] // 2]
        prompt_mel = prompt_mel[:, : 2 * prompt_tokens.shape[1]]
    t3_16k = torch.from_numpy(np.ascontiguousarray(ref_16k[: T3_PROMPT_S * TOKEN_RATE]))[None]
    t3_tokens = torch.atleast_2d(tokens(t3_16k, T3_PROMPT_TOKENS))
    speaker = embed_speaker(ref_16k).reshape(1, -1)
    return TurboVoice(
        speaker.float().cpu(), t3_tokens.long().cpu(), prompt_tokens.long().cpu(), prompt_mel.float().cpu(),
        xvec.float().reshape(1, -1).cpu(), model_identity,
    )  # fmt: skip
