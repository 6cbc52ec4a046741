"""Content-addressed cache of rendered audio.

A repeated deterministic request (IVR menus, greetings, hold messages) is served from storage in
milliseconds instead of a GPU pass. The key is the SHA-256 of a canonical JSON of everything that
decides the output bytes: normalised text, voice (registered id or speaker), model identity,
language, instruct, sampling (incl. seed), format, sample rate, prefill mode, frame cap, schema version.
Only deterministic requests are cacheable (a seed or greedy decoding): a sampled request without a seed
is a fresh draw each time.

Fills are create-once (``IfNoneMatch="*"`` on S3, ``os.link`` locally): concurrent fills of one key
never produce a torn or mixed object, and losing the race is not an error. Failures raise
:class:`~voxcast.errors.StorageError`; the caller reports them and keeps serving.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from voxcast.audio.stretch import METHOD as STRETCH_METHOD
from voxcast.engine.request import SynthesisRequest
from voxcast.errors import StorageError
from voxcast.storage.base import MAX_METADATA_BYTES, BlobInfo, BlobNotFound, BlobStore, BlobStream
from voxcast.storage.keys import AUDIO_SCHEMA, audio_key, canonical_json, sha256_hex
from voxcast.text.normalize import normalize_text

__all__ = ["CONTENT_TYPES", "AudioCache", "CachedAudio", "CachedStream"]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 16 * 1024
"""Default read chunk: ~0.33 s of 24 kHz PCM16, ~2 s of 8 kHz mu-law."""

CONTENT_TYPES: dict[str, str] = {
    "pcm": "audio/L16",
    "wav": "audio/wav",
    "mulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}

_KIND = "audio"
_META = "voxcast-audio"


@dataclass(frozen=True)
class CachedAudio:
    """A cache entry as seen without reading its body.

    Attributes:
        key: the cache key (64 hex chars).
        size: body size in bytes.
        content_type: MIME type of the body.
        metadata: what the filler stored (e.g. ``format``, ``sample_rate``, ``audio_s``, original
            ``timing``).
    """

    key: str
    size: int
    content_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


def _entry(key: str, info: BlobInfo) -> CachedAudio:
    tags = info.metadata
    if tags.get("voxcast-kind") != _KIND:
        raise StorageError(f"object for cache key {key} is not a voxcast audio cache entry")
    try:
        meta = json.loads(tags.get(_META, "{}"))
        if not isinstance(meta, dict):
            raise ValueError("metadata is not an object")
    except ValueError as e:
        raise StorageError(f"cache entry {key} has corrupt metadata: {e}") from e
    return CachedAudio(key, info.size, info.content_type, meta)


class CachedStream:
    """An open cache entry: ``.audio`` plus its body, streamed once. Close it (or use ``with``)."""

    def __init__(self, audio: CachedAudio, blob: BlobStream, chunk_bytes: int) -> None:
        self.audio = audio
        self._blob = blob
        self._chunk_bytes = chunk_bytes

    def iter_chunks(self, chunk_bytes: int | None = None) -> Iterator[bytes]:
        """The body in pieces of at most ``chunk_bytes``.

        Raises:
            StorageError: the read failed part-way.
        """
        return self._blob.iter_chunks(chunk_bytes or self._chunk_bytes)

    def close(self) -> None:
        self._blob.close()

    def __enter__(self) -> CachedStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AudioCache:
    """Rendered-audio cache over a blob store.

    Args:
        store: the blob store (shared by all workers).
        chunk_bytes: default size of streamed chunks.
    """

    def __init__(self, store: BlobStore, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        self.store = store
        self.chunk_bytes = chunk_bytes

    @staticmethod
    def cacheable(request: SynthesisRequest) -> bool:
        """True if the request asks for caching and its output is reproducible (seeded or greedy)."""
        return request.cache and (request.sampling.greedy or request.sampling.seed is not None)

    @staticmethod
    def key_for(
        request: SynthesisRequest,
        *,
        model_identity: str,
        voice: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The cache key (64 hex chars) of ``request`` on a model.

        Args:
            request: the parsed request.
            model_identity: the model's identity string.
            voice: the resolved voice: a registered voice id (required when the request carries
                reference audio: register it first) or a built-in speaker; default ``request.voice``.
            extra: anything else that changes the output bytes (e.g. a post-processing version);
                must be JSON-able.

        Raises:
            ValueError: reference audio without a resolved ``voice``.
        """
        if voice is None and request.ref_audio is not None:
            raise ValueError("register the reference audio and pass its voice id as voice=")
        s = request.sampling
        if s.greedy:
            sampling: dict[str, Any] = {"greedy": True, "repetition_penalty": s.repetition_penalty}
        else:
            sampling = s.model_dump()
        recipe = {
            "schema": AUDIO_SCHEMA,
            "model": model_identity,
            "text": normalize_text(request.text),
            "voice": (voice or request.voice or "").lower() or None,
            "instruct": normalize_text(request.instruct) if request.instruct else None,
            "language": request.language,
            "format": request.response_format.value,
            "sample_rate": request.sample_rate,
            "non_streaming_text": request.non_streaming_text,
            "max_frames": request.max_frames,
            "sampling": sampling,
            "extra": dict(extra or {}),
        }
        if request.speed != 1.0:  # absent at 1.0: the keys from before the field existed still hold
            recipe["speed"] = {"factor": request.speed, "method": STRETCH_METHOD}
        return sha256_hex(canonical_json(recipe))

    def blob_key(self, key: str) -> str:
        """The store key of a cache entry."""
        return audio_key(key)

    def lookup(self, key: str) -> CachedAudio | None:
        """The entry's size and metadata, or None on a miss.

        Raises:
            StorageError: store failure, or a foreign/corrupt object under the key.
        """
        info = self.store.head(audio_key(key))
        return None if info is None else _entry(key, info)

    def open(self, key: str) -> CachedStream | None:
        """Open an entry with one request (metadata + body): the fastest path to the first chunk.

        Returns:
            None on a miss.

        Raises:
            StorageError: store failure, or a foreign/corrupt object under the key.
        """
        try:
            blob = self.store.open_stream(audio_key(key))
        except BlobNotFound:
            return None
        try:
            return CachedStream(_entry(key, blob.info), blob, self.chunk_bytes)
        except BaseException:
            blob.close()
            raise

    def iter_chunks(self, key: str, chunk_bytes: int | None = None) -> Iterator[bytes]:
        """Stream an entry's body (opened at call time).

        Raises:
            BlobNotFound: a miss (a StorageError). StorageError: any other failure.
        """
        return self.store.iter_chunks(audio_key(key), chunk_bytes or self.chunk_bytes)

    def fill(
        self,
        key: str,
        data: bytes,
        metadata: Mapping[str, Any] | None = None,
        *,
        content_type: str | None = None,
    ) -> bool:
        """Store a rendered result, create-once.

        Args:
            key: the cache key.
            data: the complete audio file/stream bytes.
            metadata: JSON-able facts about it (``format``, ``sample_rate``, ``audio_s``, ``timing``...);
                if they exceed the metadata budget, nested values are dropped first.
            content_type: MIME type; default from ``metadata["format"]``.

        Returns:
            True if this call stored it; False if the entry already existed (not an error).

        Raises:
            StorageError: the write failed (no partial object is ever visible).
        """
        meta = dict(metadata or {})
        ctype = content_type or CONTENT_TYPES.get(str(meta.get("format", "")), "application/octet-stream")
        encoded = _encode_meta(meta)
        created = self.store.put_bytes(
            audio_key(key),
            data,
            content_type=ctype,
            metadata={"voxcast-kind": _KIND, _META: encoded},
            if_none_match=True,
        )
        log.debug("cache fill %s: %s (%d bytes)", key, "stored" if created else "already present", len(data))
        return created

    def delete(self, key: str) -> None:
        """Drop an entry (no error if absent)."""
        self.store.delete(audio_key(key))

    def presigned_url(self, key: str, expires_s: int = 3600) -> str | None:
        """A GET URL for an entry (S3), or None (local store)."""
        return self.store.presigned_url(audio_key(key), expires_s)


def _encode_meta(meta: dict[str, Any]) -> str:
    budget = MAX_METADATA_BYTES - 64  # room for the kind tag and key names
    encoded = json.dumps(meta, separators=(",", ":"), ensure_ascii=True, default=str)
    if len(encoded) > budget:
        flat = {k: v for k, v in meta.items() if not isinstance(v, dict | list)}
        log.warning("cache metadata of %d bytes trimmed to scalar fields", len(encoded))
        encoded = json.dumps(flat, separators=(",", ":"), ensure_ascii=True, default=str)
    if len(encoded) > budget:
        raise ValueError(f"cache metadata is {len(encoded)} bytes even without nested fields")
    return encoded
