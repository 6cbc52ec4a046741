"""VoiceRegistry with the model package's real VoicePrompt type (safetensors + JSON), no model needed."""

from __future__ import annotations

import hashlib

import pytest
import torch

from voxcast.errors import StorageError
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt
from voxcast.storage import BlobStore
from voxcast.storage.keys import voice_keys
from voxcast.voices import VoiceRegistry

MODEL = "tiny-base@0000"


def _builder(identity: str):  # type: ignore[no-untyped-def]
    def build(audio: bytes, ref_text: str | None, x_vector_only: bool) -> VoicePrompt:
        g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(audio).digest()[:4], "little"))
        xvec = torch.randn(64, generator=g)
        if x_vector_only:
            return VoicePrompt(xvec, None, None, None, True, identity)
        codes = torch.randint(0, 2048, (25, 16), generator=g)
        return VoicePrompt(xvec, codes, ref_text, torch.arange(5), False, identity)

    return build


def _registry(store: BlobStore, identity: str = MODEL) -> VoiceRegistry[VoicePrompt]:
    return VoiceRegistry(
        store,
        identity,
        _builder(identity),
        lambda data: VoicePrompt.from_bytes(data, expected_identity=identity),
    )


@pytest.mark.parametrize("x_vector_only", [False, True])
def test_round_trip_through_the_store(blob_store: BlobStore, x_vector_only: bool) -> None:
    reg = _registry(blob_store)
    vid = reg.register(b"audio-bytes", "reference words", x_vector_only)
    original = reg.get(vid)
    loaded, hit = _registry(blob_store).lookup(vid)
    assert not hit and loaded == original and loaded.x_vector_only is x_vector_only
    assert reg.cached_bytes >= original.x_vector.nbytes


def test_prompt_of_another_model_under_our_key(blob_store: BlobStore) -> None:
    reg = _registry(blob_store)
    vid = reg.register(b"audio-bytes", "words")
    key, _ = voice_keys(MODEL, vid)
    tags = dict(blob_store.head(key).metadata)  # type: ignore[union-attr]
    foreign = _builder("other-model")(b"audio-bytes", "words", False).to_bytes()
    blob_store.put_bytes(key, foreign, metadata=tags)
    with pytest.raises(StorageError, match="corrupt"):
        _registry(blob_store).get(vid)
