"""Per-voice constant data for voice cloning (Base models), and its safe serialisation.

A :class:`VoicePrompt` holds what the official ``create_voice_clone_prompt`` computes from a
reference clip: the speaker x-vector, the reference codes (ICL mode only) and the reference text.
It is computed once per voice and stored; ``to_bytes`` writes safetensors (tensors + JSON metadata,
never pickle) and ``from_bytes`` refuses anything that is not a voxcast voice prompt of this
schema version, with :class:`InvalidVoicePrompt`.

Voice ids (content hashes) are made by the registry: :func:`voxcast.storage.keys.voice_id_for`.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from voxcast.audio.reference import load_reference_audio
from voxcast.errors import InvalidRequest, InvalidVoicePrompt

from .speaker_encoder import SpeakerEncoder, extract_xvector

if TYPE_CHECKING:  # the encoder module imports transformers (Mimi): only Base models need it
    from .codec_encoder import CodecEncoder

__all__ = [
    "SCHEMA_VERSION",
    "InvalidVoicePrompt",
    "VoicePrompt",
    "build_voice_prompt",
]

logger = logging.getLogger(__name__)

#: Version of the stored layout; bump on any change of fields or meaning.
SCHEMA_VERSION = 1
_FORMAT = "voxcast.voice_prompt"
_NUM_GROUPS = 16
_MAX_HEADER = 1 << 20


@dataclass(frozen=True, eq=False)
class VoicePrompt:
    """The constant conditioning of one cloned voice.

    Attributes:
        x_vector: float32 [D] speaker embedding (D = talker width).
        ref_codes: LongTensor [N, 16] reference codes (ICL mode), else None.
        ref_text: transcript of the reference clip (ICL mode), else None.
        ref_text_ids: LongTensor [K] token ids of ``ref_text`` as the model tokenizes it, or None.
        x_vector_only: True when only the x-vector conditions the voice.
        model_identity: identity string of the checkpoint that computed it.
        schema_version: layout version (:data:`SCHEMA_VERSION`).
    """

    x_vector: torch.Tensor
    ref_codes: torch.Tensor | None
    ref_text: str | None
    ref_text_ids: torch.Tensor | None
    x_vector_only: bool
    model_identity: str
    schema_version: int = SCHEMA_VERSION

    @property
    def icl(self) -> bool:
        """In-context mode: reference codes and text condition the voice too."""
        return not self.x_vector_only

    def __post_init__(self) -> None:
        _check(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VoicePrompt):
            return NotImplemented
        return (
            _same(self.x_vector, other.x_vector)
            and _same(self.ref_codes, other.ref_codes)
            and _same(self.ref_text_ids, other.ref_text_ids)
            and (self.ref_text, self.x_vector_only, self.model_identity, self.schema_version)
            == (other.ref_text, other.x_vector_only, other.model_identity, other.schema_version)
        )

    __hash__ = None  # type: ignore[assignment]

    def to_bytes(self) -> bytes:
        """Serialise as safetensors with JSON metadata (codes stored as int16)."""
        tensors = {"x_vector": self.x_vector.contiguous()}
        if self.ref_codes is not None:
            tensors["ref_codes"] = self.ref_codes.to(torch.int16).contiguous()
        if self.ref_text_ids is not None:
            tensors["ref_text_ids"] = self.ref_text_ids.to(torch.int64).contiguous()
        meta = {
            "schema_version": self.schema_version,
            "ref_text": self.ref_text,
            "x_vector_only": self.x_vector_only,
            "model_identity": self.model_identity,
        }
        # One metadata key: safetensors does not keep the order of several, and the bytes should be
        # deterministic (content-addressed storage).
        header = {_FORMAT: json.dumps(meta, sort_keys=True)}
        return bytes(st_save(tensors, metadata=header))

    @classmethod
    def from_bytes(cls, data: bytes, expected_identity: str | None = None) -> VoicePrompt:
        """Parse bytes written by :meth:`to_bytes`.

        Args:
            data: the serialised prompt.
            expected_identity: if given, the prompt must come from this model identity.

        Raises:
            InvalidVoicePrompt: corrupt or foreign bytes, other schema version, other model,
                or inconsistent fields.
        """
        header = _read_metadata(data)
        if _FORMAT not in header:
            raise InvalidVoicePrompt("data is not a voxcast voice prompt", field="voice")
        try:
            meta = json.loads(header[_FORMAT])
            version = meta["schema_version"] if isinstance(meta, dict) else None
        except (KeyError, ValueError) as e:
            raise InvalidVoicePrompt(f"corrupt voice prompt metadata: {e}", field="voice") from e
        if version != SCHEMA_VERSION:
            raise InvalidVoicePrompt(
                f"voice prompt schema {version!r} is not {SCHEMA_VERSION}; recompute it", field="voice"
            )
        try:
            tensors = st_load(bytes(data))
            prompt = cls(
                x_vector=tensors["x_vector"],
                ref_codes=tensors["ref_codes"].to(torch.int64) if "ref_codes" in tensors else None,
                ref_text=meta["ref_text"],
                ref_text_ids=tensors.get("ref_text_ids"),
                x_vector_only=meta["x_vector_only"],
                model_identity=meta["model_identity"],
            )
        except InvalidVoicePrompt:
            raise
        except (KeyError, TypeError, ValueError, SafetensorError) as e:
            raise InvalidVoicePrompt(f"corrupt voice prompt: {e}", field="voice") from e
        if expected_identity is not None and prompt.model_identity != expected_identity:
            raise InvalidVoicePrompt(
                f"voice prompt was made by model {prompt.model_identity!r}, not {expected_identity!r}",
                field="voice",
            )
        return prompt


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and torch.equal(a, b)


def _bad(msg: str) -> InvalidVoicePrompt:
    return InvalidVoicePrompt(f"inconsistent voice prompt: {msg}", field="voice")


def _check(p: VoicePrompt) -> None:
    """Field types, shapes and mode consistency."""
    if not isinstance(p.x_vector, torch.Tensor) or p.x_vector.dim() != 1 or p.x_vector.dtype != torch.float32:
        raise _bad("x_vector must be a float32 tensor [D]")
    if not bool(torch.isfinite(p.x_vector).all()):
        raise _bad("x_vector has non-finite values")
    if not isinstance(p.x_vector_only, bool) or not isinstance(p.model_identity, str):
        raise _bad("x_vector_only must be a bool and model_identity a str")
    if p.ref_text is not None and not isinstance(p.ref_text, str):
        raise _bad("ref_text must be a str")
    if p.x_vector_only:
        if p.ref_codes is not None:
            raise _bad("x-vector-only prompts carry no reference codes")
        return
    c = p.ref_codes
    if c is None or c.dim() != 2 or c.shape[1] != _NUM_GROUPS or c.shape[0] == 0 or c.dtype != torch.int64:
        raise _bad(f"ICL prompts need int64 reference codes [N, {_NUM_GROUPS}]")
    if int(c.min()) < 0 or int(c.max()) > 32767:
        raise _bad("reference codes out of range")
    if not p.ref_text:
        raise _bad("ICL prompts need a reference text")
    ids = p.ref_text_ids
    if ids is not None and (ids.dim() != 1 or ids.dtype != torch.int64):
        raise _bad("ref_text_ids must be int64 [K]")


def _read_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors buffer, without trusting the buffer."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 8:
        raise InvalidVoicePrompt("voice prompt data is empty or truncated", field="voice")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > min(_MAX_HEADER, len(data) - 8):
        raise InvalidVoicePrompt("data is not a voxcast voice prompt (bad header size)", field="voice")
    try:
        header = json.loads(bytes(data[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidVoicePrompt("data is not a voxcast voice prompt (bad header)", field="voice") from e
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(meta, dict):
        raise InvalidVoicePrompt("data is not a voxcast voice prompt (no metadata)", field="voice")
    return meta


def _mode(x_vector_only: bool) -> str:
    return "x_vector_only" if x_vector_only else "icl"


def build_voice_prompt(
    speaker_encoder: SpeakerEncoder,
    codec_encoder: CodecEncoder,
    audio: bytes | str | Path | np.ndarray,
    ref_text: str | None,
    *,
    x_vector_only: bool,
    model_identity: str,
    tokenize: Callable[[str], Sequence[int]] | None = None,
) -> VoicePrompt:
    """Compute a voice prompt from reference audio, as the official ``create_voice_clone_prompt``.

    Args:
        speaker_encoder: the model's speaker encoder.
        codec_encoder: the speech tokenizer's encoder (used in ICL mode only).
        audio: encoded audio (bytes or path; decoded and resampled by
            :func:`~.reference_audio.load_reference_audio`) or an already prepared float32 mono
            24 kHz array.
        ref_text: transcript of the clip; required unless ``x_vector_only``.
        x_vector_only: condition on the x-vector only (no reference codes or text).
        model_identity: identity string of the checkpoint.
        tokenize: optional function giving the token ids of ``ref_text`` to store with it.

    Raises:
        InvalidRequest: bad audio (field "ref_audio") or missing reference text (field "ref_text").
    """
    if not x_vector_only and not (ref_text and ref_text.strip()):
        raise InvalidRequest("ref_text is required for in-context voice cloning", field="ref_text")
    wav = audio if isinstance(audio, np.ndarray) else load_reference_audio(audio)
    x_vector = extract_xvector(speaker_encoder, wav)
    if x_vector_only:
        return VoicePrompt(x_vector, None, None, None, True, model_identity)
    assert ref_text is not None
    codes = codec_encoder.encode(wav)
    ids = torch.tensor(list(tokenize(ref_text)), dtype=torch.int64) if tokenize is not None else None
    logger.debug("voice prompt: %d reference frames, x-vector %d", codes.shape[0], x_vector.shape[0])
    return VoicePrompt(x_vector, codes, ref_text, ids, False, model_identity)
