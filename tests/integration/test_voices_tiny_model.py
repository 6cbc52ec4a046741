"""VoiceRegistry wired to a real (tiny, random-weight) Base model's make_voice_prompt."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.reference import SAMPLE_RATE, load_reference_audio
from voxcast.errors import InvalidRequest
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt
from voxcast.storage import BlobStore
from voxcast.voices import VoiceRegistry

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_model(tiny_model_dir) -> Qwen3TTS:  # type: ignore[no-untyped-def]
    return Qwen3TTS.from_pretrained(str(tiny_model_dir("base")))


def _wav(seconds: float = 2.0) -> bytes:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    pcm = 0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    sf.write(buf, pcm.astype(np.float32), SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _registry(store: BlobStore, model: Qwen3TTS) -> VoiceRegistry[VoicePrompt]:
    def build(audio: bytes, ref_text: str | None, x_vector_only: bool) -> VoicePrompt:
        return model.make_voice_prompt(load_reference_audio(audio), SAMPLE_RATE, ref_text, x_vector_only)

    return VoiceRegistry(
        store,
        model.identity,
        build,
        lambda data: VoicePrompt.from_bytes(data, expected_identity=model.identity),
        speakers=model.speakers or (),
    )


def test_register_and_reload_real_prompt(blob_store: BlobStore, base_model: Qwen3TTS) -> None:
    reg = _registry(blob_store, base_model)
    vid = reg.register(_wav(), "A short reference sentence.")
    xvid = reg.register(_wav(), None, x_vector_only=True)
    assert vid != xvid
    fresh = _registry(blob_store, base_model)
    loaded, hit = fresh.lookup(vid)
    assert not hit and loaded == reg.get(vid) and loaded.ref_codes is not None
    assert fresh.get(xvid).x_vector_only


def test_bad_reference_audio_is_an_invalid_request(blob_store: BlobStore, base_model: Qwen3TTS) -> None:
    reg = _registry(blob_store, base_model)
    with pytest.raises(InvalidRequest):
        reg.register(b"not audio at all", "text")
    with pytest.raises(InvalidRequest):
        reg.register(_wav(), None)  # ICL mode needs a transcript
    assert list(blob_store.list_keys()) == []
