"""Storage keys: pure functions of content hashes and schema versions.

Every object voxcast writes lives under a key built here, never from raw user input. The only
user-supplied strings that reach a key are voice ids, and those must match :data:`VOICE_ID_RE` first.
:func:`validate_key` is the last line of defence for both backends: a key is a relative POSIX path of
safe components, so no key can address anything outside the store (no ``..``, no absolute paths, no
hidden files, no backslashes or control characters).

Layout (``<prefix>/`` comes from the store's configuration)::

    voices/v<VOICE_SCHEMA>/<model-hash>/<voice_id>.safetensors   voice prompt
    voices/v<VOICE_SCHEMA>/<model-hash>/<voice_id>.json          its metadata (informational)
    audio/v<AUDIO_SCHEMA>/<k[:2]>/<k>                            rendered audio, k = cache key (hex)
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from voxcast.errors import InvalidRequest

__all__ = [
    "AUDIO_SCHEMA",
    "MAX_KEY_BYTES",
    "VOICE_ID_RE",
    "VOICE_SCHEMA",
    "audio_key",
    "canonical_json",
    "is_voice_id",
    "model_hash",
    "sha256_hex",
    "validate_key",
    "voice_id_for",
    "voice_keys",
    "voice_prefix",
]

VOICE_SCHEMA = 1
"""Version of the stored voice-prompt layout; bump when the format or the id recipe changes."""

AUDIO_SCHEMA = 1
"""Version of the rendered-audio cache key recipe and object layout."""

MAX_KEY_BYTES = 512
"""Longest accepted key (S3 allows 1024; we keep room for a configured prefix)."""

VOICE_ID_RE = re.compile(r"^vx_[0-9a-f]{32}$")
"""A registered voice id: ``vx_`` + 128 bits of a content hash, lowercase hex."""

_COMPONENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]*$")
_HEX_RE = re.compile(r"^[0-9a-f]{64}$")


def validate_key(key: str, *, field: str = "key") -> str:
    """Check that ``key`` is a safe relative object key and return it unchanged.

    Raises:
        InvalidRequest: empty, too long, absolute, with empty/``.``/``..``/hidden components, or with
            characters outside ``[A-Za-z0-9._=-]`` and ``/``.
    """
    if not isinstance(key, str) or not key:
        raise InvalidRequest("storage key is empty", field=field)
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidRequest(f"storage key is longer than {MAX_KEY_BYTES} bytes", field=field)
    for part in key.split("/"):
        if not _COMPONENT_RE.match(part):
            raise InvalidRequest(f"storage key {key!r} has an unsafe component {part!r}", field=field)
    return key


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, no spaces, ASCII) for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def model_hash(model_identity: str) -> str:
    """A short, path-safe hash of a model identity string (16 hex chars = 64 bits)."""
    if not model_identity:
        raise ValueError("model identity is empty")
    return sha256_hex(model_identity.encode("utf-8"))[:16]


def voice_id_for(model_identity: str, audio_sha256: str, ref_text: str | None, x_vector_only: bool) -> str:
    """The id of a voice registered from these inputs with this model.

    ``ref_text`` is ignored in x-vector-only mode (the model does not use it there), so the same audio
    registered with or without a transcript in that mode gives one id.
    """
    recipe = {
        "schema": VOICE_SCHEMA,
        "model": model_identity,
        "audio_sha256": audio_sha256,
        "ref_text": None if x_vector_only else ref_text,
        "x_vector_only": bool(x_vector_only),
    }
    return "vx_" + sha256_hex(canonical_json(recipe))[:32]


def is_voice_id(value: str) -> bool:
    """True if ``value`` has the shape of a registered voice id (it may still be unknown)."""
    return bool(VOICE_ID_RE.fullmatch(value))  # not match: "$" would also take a trailing newline


def voice_prefix(model_identity: str) -> str:
    """Key prefix (ending in ``/``) of every voice of one model."""
    return f"voices/v{VOICE_SCHEMA}/{model_hash(model_identity)}/"


def voice_keys(model_identity: str, voice_id: str) -> tuple[str, str]:
    """(prompt key, metadata key) of a voice.

    Raises:
        InvalidRequest: ``voice_id`` is not of the voice-id shape (field ``voice``).
    """
    if not is_voice_id(voice_id):
        raise InvalidRequest(f"{voice_id!r} is not a voice id", field="voice")
    base = voice_prefix(model_identity) + voice_id
    return validate_key(base + ".safetensors"), validate_key(base + ".json")


def audio_key(cache_key: str) -> str:
    """Object key of a rendered-audio cache entry.

    Raises:
        ValueError: ``cache_key`` is not a 64-char lowercase hex digest.
    """
    if not _HEX_RE.match(cache_key):
        raise ValueError(f"not a cache key: {cache_key!r}")
    return validate_key(f"audio/v{AUDIO_SCHEMA}/{cache_key[:2]}/{cache_key}")
