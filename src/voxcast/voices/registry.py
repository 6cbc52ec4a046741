"""Voice registry: reference audio -> voice id -> persisted voice prompt, shared by every worker.

A voice prompt (speaker x-vector, reference codes, reference text ids...) costs a pass through the
speaker encoder and the codec encoder; it is computed once, stored as safetensors + a JSON sidecar
(never pickle) in the :class:`~voxcast.storage.BlobStore`, and kept in an in-memory LRU bounded in
bytes. The voice id is a content hash of the reference audio, transcript, mode and model identity, so
registering the same inputs twice (on any worker) gives the same id and builds nothing the second time.

The prompt type is opaque here: anything with ``to_bytes()`` plus a ``loader(bytes)`` to rebuild it
(``VoicePrompt.to_bytes`` / ``VoicePrompt.from_bytes`` of the model package), and a ``builder(audio,
ref_text, x_vector_only)`` that computes one (the model's ``make_voice_prompt``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from voxcast.errors import InvalidRequest, StorageError, VoiceNotFound
from voxcast.lru import ByteLRU
from voxcast.storage.base import BlobNotFound, BlobStore
from voxcast.storage.keys import (
    VOICE_SCHEMA,
    is_voice_id,
    model_hash,
    sha256_hex,
    voice_id_for,
    voice_keys,
    voice_prefix,
)
from voxcast.voices.writer import BackgroundWriter

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "Registration",
    "SerializableVoicePrompt",
    "VoiceInfo",
    "VoiceLabel",
    "VoiceRegistry",
]

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
"""Default in-memory budget for voice prompts."""

_KIND = "voice-prompt"


class _CorruptVoice(StorageError):
    """A stored voice prompt that cannot be used (corrupt, foreign, other schema)."""


class SerializableVoicePrompt(Protocol):
    """What the registry needs of a voice prompt."""

    def to_bytes(self) -> bytes: ...


P = TypeVar("P", bound=SerializableVoicePrompt)

VoiceLabel = tuple[str | None, str | None]
"""``(name, consent id)`` a registration gives its voice (either may be None)."""


@dataclass(frozen=True)
class VoiceInfo:
    """A voice as listed: built-in speakers have only a name; registered voices carry provenance
    (``name`` and ``consent``: what the registration gave, e.g. OpenAI's voice-create fields)."""

    voice_id: str
    builtin: bool
    ref_text: str | None = None
    x_vector_only: bool | None = None
    audio_sha256: str | None = None
    created_at: float | None = None
    nbytes: int | None = None
    name: str | None = None
    consent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (None fields omitted)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Registration(Generic[P]):
    """Result of :meth:`VoiceRegistry.ensure`.

    Attributes:
        voice_id: the content-hash id.
        prompt: the voice prompt, ready to use.
        built: this call ran the builder (no worker had stored it, or the store was unusable).
        cache_hit: served from this process's in-memory LRU.
        storage_error: the prompt could not be read from or written to the store (None = persisted, or
            with ``persist_in_background`` being written: a failed background write is logged and
            retried by the voice's next ``ensure``).
    """

    voice_id: str
    prompt: P
    built: bool
    cache_hit: bool
    storage_error: StorageError | None = None


class VoiceRegistry(Generic[P]):
    """Registered voices of one model, over a blob store.

    Args:
        store: where prompts live (shared by all workers).
        model_identity: the model's ``identity`` string; voices of other models are invisible.
        builder: ``(ref_audio bytes, ref_text | None, x_vector_only) -> prompt``; may raise
            :class:`InvalidRequest` for unusable audio.
        loader: ``bytes -> prompt`` (the inverse of ``prompt.to_bytes()``).
        speakers: the model's built-in speaker names (CustomVoice), listed as built-in voices.
        max_cache_bytes: LRU budget (serialised prompt sizes).
        persist_in_background: :meth:`ensure` returns a newly built prompt at once and writes it to the
            store on a background thread (:class:`~voxcast.voices.writer.BackgroundWriter`) instead of
            before returning; :meth:`register` always waits for its write. Call :meth:`close` (or
            :meth:`flush`) before the store goes away.
    """

    def __init__(
        self,
        store: BlobStore,
        model_identity: str,
        builder: Callable[[bytes, str | None, bool], P],
        loader: Callable[[bytes], P],
        *,
        speakers: Iterable[str] = (),
        max_cache_bytes: int = DEFAULT_CACHE_BYTES,
        recheck_s: float | None = None,
        persist_in_background: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.model_identity = model_identity
        self._model_hash = model_hash(model_identity)
        self._builder = builder
        self._loader = loader
        self._speakers = {s.lower(): s for s in speakers}
        self._lru: ByteLRU[P] = ByteLRU(max_cache_bytes)
        #: Seconds a prompt in memory is trusted before the store is asked whether it still exists
        #: (another worker may have deleted it); None: never asked.
        self.recheck_s = recheck_s
        self._clock = clock
        self._seen: dict[str, float] = {}  # voice id -> when the store last had it (clock)
        self._unpersisted: set[str] = set()
        self._writer = BackgroundWriter("voxcast-voice-writer") if persist_in_background else None
        self._writing: set[str] = set()  # queued on or being written by the background writer

    # -- built-in speakers -------------------------------------------------------------------

    def is_builtin(self, name: str) -> bool:
        """True if ``name`` is a built-in speaker of the model (case-insensitive)."""
        return name.lower() in self._speakers

    def builtin_name(self, name: str) -> str:
        """The model's own spelling of a built-in speaker.

        Raises:
            VoiceNotFound: not a built-in speaker.
        """
        try:
            return self._speakers[name.lower()]
        except KeyError:
            raise VoiceNotFound(f"unknown speaker {name!r}", field="voice") from None

    # -- registration ----------------------------------------------------------------------

    def register(
        self,
        ref_audio: bytes,
        ref_text: str | None = None,
        x_vector_only: bool = False,
        *,
        label: VoiceLabel | None = None,
    ) -> str:
        """Register a voice from reference audio (idempotent) and return its id.

        Builds the prompt only if no worker has stored it yet. ``label``: its name and consent id,
        kept in its metadata when this call stores it (the id depends only on the audio, transcript
        and mode: a voice registered before keeps its first label).

        Raises:
            InvalidRequest: empty audio, or the builder rejected the audio/transcript.
            StorageError: the prompt could not be persisted (it is still usable in this process, and
                a later ``register``/``ensure`` of the same inputs retries the write).
        """
        reg = self.ensure(ref_audio, ref_text, x_vector_only, wait=True, label=label)
        if reg.storage_error is not None:
            raise reg.storage_error
        return reg.voice_id

    def ensure(
        self,
        ref_audio: bytes,
        ref_text: str | None = None,
        x_vector_only: bool = False,
        *,
        wait: bool = False,
        label: VoiceLabel | None = None,
    ) -> Registration[P]:
        """Register-or-load for on-the-fly cloning: returns the prompt too, and never fails on storage.

        Order: in-memory LRU, then the store, then the builder (then a create-once write: on the
        background writer with ``persist_in_background`` unless ``wait``). A store failure is returned
        in ``storage_error`` (synthesis can go on with the prompt); a corrupt stored prompt is rebuilt
        and overwritten.

        Raises:
            InvalidRequest: empty audio, or the builder rejected the audio/transcript.
        """
        if not ref_audio:
            raise InvalidRequest("reference audio is empty", field="ref_audio")
        ref_text = (ref_text or "").strip() or None
        audio_sha = sha256_hex(ref_audio)
        voice_id = voice_id_for(self.model_identity, audio_sha, ref_text, x_vector_only)
        cached = self._lru.get(voice_id)
        if cached is not None and voice_id in self._writing:  # its write is queued or under way
            if not wait:
                return Registration(voice_id, cached, built=False, cache_hit=True)
            self.flush()
        if cached is not None and voice_id not in self._unpersisted:
            return Registration(voice_id, cached, built=False, cache_hit=True)
        repair = False
        if cached is None:
            try:
                return Registration(voice_id, self.lookup(voice_id)[0], built=False, cache_hit=False)
            except VoiceNotFound:
                pass
            except _CorruptVoice as e:
                log.warning("voice %s: %s; rebuilding it", voice_id, e)
                repair = True
            except StorageError as e:
                log.warning("voice %s: store unavailable (%s); building it anyway", voice_id, e)
        prompt = cached if cached is not None else self._builder(ref_audio, ref_text, x_vector_only)
        data = prompt.to_bytes()
        self._remember(voice_id, prompt, len(data))
        self._unpersisted.add(voice_id)
        name, consent = label if label is not None else (None, None)
        meta = VoiceInfo(
            voice_id, False, ref_text, x_vector_only, audio_sha, time.time(), len(data), name, consent
        )
        if self._writer is not None and not wait:
            self._writing.add(voice_id)
            self._writer.submit(lambda: self._persist_later(voice_id, data, meta, repair))
            return Registration(voice_id, prompt, built=cached is None, cache_hit=cached is not None)
        try:
            self._persist(voice_id, data, meta, overwrite=repair)
        except StorageError as e:
            return Registration(
                voice_id, prompt, built=cached is None, cache_hit=cached is not None, storage_error=e
            )
        self._unpersisted.discard(voice_id)
        log.info("registered voice %s (%d bytes)", voice_id, len(data))
        return Registration(voice_id, prompt, built=cached is None, cache_hit=cached is not None)

    def _persist_later(self, voice_id: str, data: bytes, meta: VoiceInfo, overwrite: bool) -> None:
        """The background writer's job: :meth:`_persist`, leaving the voice unpersisted on failure."""
        try:
            self._persist(voice_id, data, meta, overwrite=overwrite)
        except StorageError as e:
            log.warning("voice %s: writing it to the store failed (%s); its next use retries", voice_id, e)
        else:
            self._unpersisted.discard(voice_id)
            log.info("registered voice %s (%d bytes, written in the background)", voice_id, len(data))
        finally:
            self._writing.discard(voice_id)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the background writes queued so far (True at once without a background writer).

        Returns:
            False if ``timeout`` (s) passed first.
        """
        return True if self._writer is None else self._writer.flush(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Finish the queued background writes and stop the writer (before closing the store).

        Returns:
            False if ``timeout`` (s) passed first.
        """
        return True if self._writer is None else self._writer.close(timeout)

    def _persist(self, voice_id: str, data: bytes, meta: VoiceInfo, *, overwrite: bool) -> None:
        prompt_key, meta_key = voice_keys(self.model_identity, voice_id)
        tags = {"voxcast-kind": _KIND, "voxcast-schema": str(VOICE_SCHEMA), "voxcast-model": self._model_hash}
        # The prompt names its voice and its content hash: a prompt copied under another id, or
        # altered, is refused on load (_check_content).
        prompt_tags = {**tags, "voxcast-voice": voice_id, "voxcast-sha256": sha256_hex(data)}
        self.store.put_bytes(prompt_key, data, metadata=prompt_tags, if_none_match=not overwrite)
        sidecar = {**meta.to_dict(), "model_identity": self.model_identity, "schema": VOICE_SCHEMA}
        self.store.put_bytes(
            meta_key,
            json.dumps(sidecar, ensure_ascii=False, indent=1).encode(),
            content_type="application/json",
            metadata=tags,
            if_none_match=not overwrite,
        )

    def _remember(self, voice_id: str, prompt: P, serialized_size: int) -> None:
        self._lru.put(voice_id, prompt, max(serialized_size, _memory_size(prompt)))
        self._seen[voice_id] = self._clock()
        if len(self._seen) > 2 * len(self._lru) + 64:  # forget the times of voices the LRU let go
            self._seen = {k: t for k, t in self._seen.items() if k in self._lru}

    def _still_stored(self, voice_id: str) -> bool:
        """Whether a voice held in memory may be used: not yet due for a check, still being written
        by this process, or found in the store now (then trusted for ``recheck_s`` again)."""
        if self.recheck_s is None or voice_id in self._unpersisted or voice_id in self._writing:
            return True
        now, seen = self._clock(), self._seen.get(voice_id)
        if seen is not None and now - seen < self.recheck_s:
            return True
        if not self.store.exists(voice_keys(self.model_identity, voice_id)[0]):
            return False
        self._seen[voice_id] = now
        return True

    # -- lookup ----------------------------------------------------------------------------

    def get(self, voice_id: str) -> P:
        """The prompt of a registered voice (from memory, else from the store)."""
        return self.lookup(voice_id)[0]

    def lookup(self, voice_id: str) -> tuple[P, bool]:
        """(prompt, served from the in-memory LRU?).

        Raises:
            VoiceNotFound: not a registered voice of this model (field ``voice``).
            StorageError: the stored object is corrupt, foreign, or the store failed.
        """
        self._check_id(voice_id)
        cached = self._lru.get(voice_id)
        if cached is not None:
            if self._still_stored(voice_id):
                return cached, True
            self._lru.discard(voice_id)  # deleted through another worker
            self._seen.pop(voice_id, None)
            raise VoiceNotFound(f"voice {voice_id!r} is not registered (it was deleted)", field="voice")
        prompt_key, _ = voice_keys(self.model_identity, voice_id)
        try:
            with self.store.open_stream(prompt_key) as stream:
                tags = dict(stream.info.metadata)
                self._check_tags(voice_id, tags)
                data = stream.read()
        except BlobNotFound as e:
            raise VoiceNotFound(f"voice {voice_id!r} is not registered", field="voice") from e
        self._check_content(voice_id, tags, data)
        try:
            prompt = self._loader(data)
        except Exception as e:  # any parse failure of stored bytes is "corrupt", never a crash
            raise _CorruptVoice(f"voice {voice_id!r} is stored but corrupt: {type(e).__name__}: {e}") from e
        self._remember(voice_id, prompt, len(data))
        return prompt, False

    def _check_id(self, voice_id: str) -> None:
        if self.is_builtin(voice_id):
            raise InvalidRequest(f"{voice_id!r} is a built-in speaker, not a registered voice", field="voice")
        if not is_voice_id(voice_id):
            raise VoiceNotFound(f"unknown voice {voice_id!r}", field="voice")

    def _check_tags(self, voice_id: str, tags: dict[str, str]) -> None:
        if tags.get("voxcast-kind") != _KIND or tags.get("voxcast-model") != self._model_hash:
            raise _CorruptVoice(
                f"the object stored for voice {voice_id!r} is not a voice prompt of this model"
            )
        if tags.get("voxcast-schema") != str(VOICE_SCHEMA):
            raise _CorruptVoice(
                f"voice {voice_id!r} has schema {tags.get('voxcast-schema')!r}; this build reads {VOICE_SCHEMA}"
            )

    def _check_content(self, voice_id: str, tags: dict[str, str], data: bytes) -> None:
        """The prompt belongs to ``voice_id`` and is intact: by its tags, or for prompts stored
        before they carried them, by recomputing the id from the sidecar's recipe."""
        if "voxcast-voice" in tags or "voxcast-sha256" in tags:
            if tags.get("voxcast-voice") != voice_id:
                raise _CorruptVoice(
                    f"the prompt stored as voice {voice_id!r} belongs to {tags.get('voxcast-voice')!r}"
                )
            if tags.get("voxcast-sha256") != sha256_hex(data):
                raise _CorruptVoice(
                    f"voice {voice_id!r} is stored but corrupt: its content does not match its hash"
                )
            return
        info = self.info(voice_id)
        if (
            info.audio_sha256 is None
            or voice_id_for(self.model_identity, info.audio_sha256, info.ref_text, bool(info.x_vector_only))
            != voice_id
        ):
            raise _CorruptVoice(f"the metadata stored for voice {voice_id!r} does not give that id")

    def info(self, voice_id: str) -> VoiceInfo:
        """Provenance of a voice (built-in speakers: just the name).

        Raises:
            VoiceNotFound: unknown voice. StorageError: store failure or corrupt sidecar.
        """
        if self.is_builtin(voice_id):
            return VoiceInfo(self.builtin_name(voice_id), True)
        self._check_id(voice_id)
        prompt_key, meta_key = voice_keys(self.model_identity, voice_id)
        try:
            raw = json.loads(self.store.get_bytes(meta_key))
            fields = {
                k: raw.get(k)
                for k in (
                    "ref_text",
                    "x_vector_only",
                    "audio_sha256",
                    "created_at",
                    "nbytes",
                    "name",
                    "consent",
                )
            }
            return VoiceInfo(voice_id, False, **fields)
        except BlobNotFound:
            head = self.store.head(prompt_key)
            if head is None:
                raise VoiceNotFound(f"voice {voice_id!r} is not registered", field="voice") from None
            return VoiceInfo(voice_id, False, nbytes=head.size)
        except (ValueError, AttributeError, TypeError) as e:
            raise StorageError(f"metadata of voice {voice_id!r} is corrupt: {e}") from e

    def list_voices(self) -> list[VoiceInfo]:
        """Built-in speakers (sorted), then registered voices of this model (sorted by id), each with
        what its registration recorded (name, created_at, ...: one read of its sidecar; a voice whose
        sidecar cannot be read is listed by id alone)."""
        out = [VoiceInfo(name, True) for name in sorted(self._speakers.values())]
        for key in self.store.list_keys(voice_prefix(self.model_identity)):
            name = key.rsplit("/", 1)[-1]
            voice_id = name.removesuffix(".safetensors")
            if name.endswith(".safetensors") and is_voice_id(voice_id):
                try:
                    out.append(self.info(voice_id))
                except VoiceNotFound:  # deleted since it was listed
                    continue
                except StorageError as e:
                    log.warning("voice %s: its metadata could not be read (%s); listed by id", voice_id, e)
                    out.append(VoiceInfo(voice_id, False))
        return out

    def delete(self, voice_id: str) -> bool:
        """Remove a registered voice everywhere (store + this process's LRU).

        Other workers stop using it within ``recheck_s`` (they ask the store before using a voice
        held in memory longer than that).

        Returns:
            False if it was not registered.

        Raises:
            InvalidRequest: a built-in speaker. VoiceNotFound: not a voice id. StorageError: store failure.
        """
        self._check_id(voice_id)
        self.flush()  # a queued write of this voice must not bring it back
        prompt_key, meta_key = voice_keys(self.model_identity, voice_id)
        self._lru.discard(voice_id)
        self._seen.pop(voice_id, None)
        self._unpersisted.discard(voice_id)
        existed = self.store.exists(prompt_key)
        self.store.delete(prompt_key)
        self.store.delete(meta_key)
        return existed

    def drop_cached(self) -> None:
        """Forget the voice prompts held in memory (the engine unloaded: they hold its tensors); the
        store keeps every voice, and the next request of one loads it again."""
        self._lru.clear()
        self._seen.clear()

    @property
    def cached_bytes(self) -> int:
        """Bytes held by the in-memory LRU."""
        return self._lru.nbytes


def _memory_size(prompt: object) -> int:
    """Bytes held by a prompt's arrays: its ``nbytes``, else the sum over attributes that have one
    (torch tensors and numpy arrays do), e.g. int64 codes that are stored as int16."""
    own = getattr(prompt, "nbytes", None)
    if isinstance(own, int):
        return own
    fields = getattr(prompt, "__dict__", {})
    return sum(n for v in fields.values() if isinstance(n := getattr(v, "nbytes", None), int))
