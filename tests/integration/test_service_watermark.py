"""The watermark on stored renders (VOXCAST_WATERMARK=perth, the packaged Perth weights) through the
service on both storage backends: the live stream goes out unmarked, the stored copy is the live audio
marked, the cache keeps marked and unmarked renders apart, and a prerendered library's files carry a
mark the detector finds. (The tiny random model's output is not speech, on which Perth's detector
was not trained: for it the test checks the stored audio against the watermarker's output instead.)"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from tests.integration.test_prerender_quality import ScriptedService
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.prerender.library import PrerenderJob, prerender
from voxcast.service import Service, ServiceConfig
from voxcast.storage.base import BlobStore
from voxcast.watermark.perth import PerthWatermarker, find_perth_weights

pytestmark = pytest.mark.skipif(find_perth_weights() is None, reason="resemble-perth is not installed")


@pytest.fixture(scope="module")
def perth() -> PerthWatermarker:
    return PerthWatermarker.load()


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Callable[[str], Path]) -> Iterator[Engine]:
    eng = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    yield eng
    eng.close()


def _run(service: Service, **req: Any) -> tuple[np.ndarray, Any]:
    stream = service.synthesize({"text": "Thank you for calling Acme.", "voice": "ryan", **req})
    data = b"".join(c.data for c in stream)
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768, stream.result


def _stored(store: BlobStore, key: str) -> np.ndarray:
    """A stored ``pcm`` render (raw 16-bit, 24 kHz) as float."""
    return np.frombuffer(store.get_bytes(key), dtype="<i2").astype(np.float32) / 32768


def test_stored_renders_are_marked_and_live_streams_are_not(
    engine: Engine, blob_store: BlobStore, perth: PerthWatermarker
) -> None:
    marked = Service.assemble(ServiceConfig(watermark="perth"), engine, blob_store)
    plain = Service.assemble(ServiceConfig(), engine, blob_store)
    live, result = _run(marked, seed=3, max_frames=40, response_format="pcm")
    assert result.timing.cache_hit is False and result.timing.extra["watermark"] == "perth"
    assert result.timing.extra["watermark_ms"] > 0
    stored = _stored(blob_store, result.audio_key)
    want = perth.apply(live, 24000)
    assert len(stored) == len(want) and not np.array_equal(stored[: len(live)], live[: len(stored)])
    np.testing.assert_allclose(stored, want, atol=4 / 32768)  # the live audio, marked (int16 rounding)

    unmarked, plain_result = _run(plain, seed=3, max_frames=40, response_format="pcm")
    assert np.array_equal(unmarked, live)  # the same model output either way
    assert plain_result.timing.cache_hit is False  # another cache entry: an unmarked one
    assert plain_result.audio_key != result.audio_key
    assert np.array_equal(_stored(blob_store, plain_result.audio_key), live)

    hit, again = _run(marked, seed=3, max_frames=40, response_format="pcm")
    assert again.timing.cache_hit and again.audio_key == result.audio_key
    assert np.array_equal(hit, stored)  # a cache hit streams the stored, marked copy


def test_renders_without_a_cache_key_are_stored_marked(
    engine: Engine, blob_store: BlobStore, perth: PerthWatermarker
) -> None:
    service = Service.assemble(ServiceConfig(watermark="perth"), engine, blob_store)
    live, result = _run(service, max_frames=30, response_format="pcm")  # unseeded: stored under renders/
    assert result.audio_key.startswith("renders/")
    np.testing.assert_allclose(
        _stored(blob_store, result.audio_key), perth.apply(live, 24000), atol=4 / 32768
    )


def test_from_env_builds_a_service_that_marks(engine: Engine, blob_store: BlobStore) -> None:
    config = ServiceConfig.from_env({"VOXCAST_WATERMARK": "perth"})
    assert (config.watermark, config.watermark_model) == ("perth", None)
    assert Service.assemble(config, engine, blob_store).watermarker is not None
    assert Service.assemble(ServiceConfig.from_env({}), engine, blob_store).watermarker is None


MANIFEST = "id,text,seed\nwelcome,Welcome to Acme.,10\nhold,Please hold the line.,20\n"


def test_a_prerendered_library_is_marked_after_its_post_processing(
    local_store: BlobStore, perth: PerthWatermarker
) -> None:
    payload = {"library": "acme", "manifest": MANIFEST, "presets": ["pcm16k"], "gate": False}
    service = ScriptedService(local_store)
    service.watermarker = perth
    summary = prerender(service, PrerenderJob.from_payload(payload))  # type: ignore[arg-type]
    assert summary["rendered"] == 2
    doc = json.loads(local_store.get_bytes("libraries/acme/manifest.json"))
    for entry in doc["prompts"].values():
        pcm, sr = sf.read(
            io.BytesIO(local_store.get_bytes(entry["objects"]["pcm16k"]["key"])), dtype="float32"
        )
        assert sr == 16000 and perth.detect(pcm, sr) > 0.9
    hashes = {k: e["render_hash"] for k, e in doc["prompts"].items()}

    service.watermarker = None  # the watermark turned off: every prompt renders again, unmarked
    again = prerender(service, PrerenderJob.from_payload(payload))  # type: ignore[arg-type]
    assert (again["rendered"], again["skipped"]) == (2, 0)
    doc = json.loads(local_store.get_bytes("libraries/acme/manifest.json"))
    assert all(doc["prompts"][k]["render_hash"] != h for k, h in hashes.items())
    for entry in doc["prompts"].values():
        pcm, sr = sf.read(
            io.BytesIO(local_store.get_bytes(entry["objects"]["pcm16k"]["key"])), dtype="float32"
        )
        assert perth.detect(pcm, sr) < 0.5
