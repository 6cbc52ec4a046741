"""The watermark on stored renders (VOXCAST_WATERMARK=perth, the packaged Perth weights) through the
service on both storage backends: the live stream goes out unmarked, the stored copy (and a file
kept whole) is the live audio marked, the cache keeps marked and unmarked renders apart, a failed
mark stores nothing and fails nothing, and a prerendered library's files carry a mark the detector
finds. (The tiny random model's output is not speech, on which Perth's detector was not trained: for
it the tests check the stored audio against the watermarker's output instead.)"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from tests.integration.test_prerender_quality import ScriptedService
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.prerender.library import PrerenderJob, prerender
from voxcast.service import Service, ServiceConfig
from voxcast.serving.runpod.config import RunpodConfig
from voxcast.serving.runpod.handler import RunpodHandler
from voxcast.storage.base import BlobStore
from voxcast.watermark import mark
from voxcast.watermark.perth import PerthWatermarker, find_perth_weights

pytestmark = pytest.mark.skipif(find_perth_weights() is None, reason="resemble-perth is not installed")

LSB = 1 / 32768
TEXT = {"text": "Thank you for calling Acme.", "voice": "ryan"}


@pytest.fixture(scope="module")
def perth() -> PerthWatermarker:
    return PerthWatermarker.load()


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Callable[[str], Path]) -> Iterator[Engine]:
    eng = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    yield eng
    eng.close()


def _run(service: Service, **kw: Any) -> tuple[bytes, Any]:
    """(streamed bytes, the result's fields plus the stream's kept ``file``)."""
    options = {k: kw.pop(k) for k in ("watermark", "keep_file") if k in kw}
    stream = service.synthesize({**TEXT, **kw}, **options)
    data = b"".join(c.data for c in stream)
    result = {f.name: getattr(stream.result, f.name) for f in fields(stream.result)}  # type: ignore[arg-type]
    return data, SimpleNamespace(**result, file=stream.file)


def _pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768


def test_stored_renders_are_marked_and_live_streams_are_not(
    engine: Engine, blob_store: BlobStore, perth: PerthWatermarker
) -> None:
    marked = Service.assemble(ServiceConfig(watermark="perth"), engine, blob_store)
    plain = Service.assemble(ServiceConfig(), engine, blob_store)
    data, result = _run(marked, seed=3, max_frames=40, response_format="pcm", keep_file=True)
    live = _pcm(data)
    assert result.timing.cache_hit is False and result.timing.extra["watermark"] == "perth"
    assert result.timing.extra["watermark_ms"] > 0
    stored = _pcm(blob_store.get_bytes(result.audio_key))
    assert result.file == blob_store.get_bytes(result.audio_key)  # the file kept is the one stored
    assert len(stored) == len(live)  # the mark keeps the length (and the reported duration)
    np.testing.assert_allclose(stored, mark(perth, live, 24000), atol=4 * LSB)  # the live audio, marked
    assert np.sqrt(np.mean((stored - live) ** 2)) > 1e-3  # a mark, not a round trip's rounding

    unmarked, plain_result = _run(plain, seed=3, max_frames=40, response_format="pcm")
    assert unmarked == data  # the same model output either way
    assert plain_result.timing.cache_hit is False  # another cache entry: an unmarked one
    assert plain_result.audio_key != result.audio_key and "watermark" not in plain_result.timing.extra
    assert blob_store.get_bytes(plain_result.audio_key) == data

    hit, again = _run(marked, seed=3, max_frames=40, response_format="pcm", keep_file=True)
    assert again.timing.cache_hit and again.audio_key == result.audio_key
    assert again.timing.extra["watermark"] == "perth"  # a hit says its audio is marked
    assert _pcm(hit).tobytes() == stored.tobytes() and again.file == result.file

    # a caller that marks its own audio shares the unmarked entry
    own, shared = _run(marked, seed=3, max_frames=40, response_format="pcm", watermark=False)
    assert shared.timing.cache_hit and shared.audio_key == plain_result.audio_key and own == data


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_stored_files_of_other_formats_are_marked(
    engine: Engine, blob_store: BlobStore, perth: PerthWatermarker, fmt: str
) -> None:
    service = Service.assemble(ServiceConfig(watermark="perth"), engine, blob_store)
    plain = Service.assemble(ServiceConfig(), engine, blob_store)
    live, _ = _run(plain, seed=8, max_frames=30, response_format="pcm", cache=False)
    _, result = _run(service, seed=8, max_frames=30, response_format=fmt, cache=False)
    assert result.audio_key.startswith("renders/") and result.audio_key.endswith(f".{fmt}")
    stored, sr = sf.read(io.BytesIO(blob_store.get_bytes(result.audio_key)), dtype="float32")
    assert sr == 24000 and len(stored) == len(_pcm(live))
    np.testing.assert_allclose(stored, mark(perth, _pcm(live), 24000), atol=4 * LSB)


class _Broken:
    name = identity = "broken"

    def apply(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        raise RuntimeError("out of memory")


def test_a_failed_mark_stores_nothing_and_the_request_stands(engine: Engine, blob_store: BlobStore) -> None:
    service = Service.assemble(ServiceConfig(watermark="perth"), engine, blob_store, watermarker=_Broken())  # type: ignore[arg-type]
    data, result = _run(service, seed=2, max_frames=20, response_format="pcm", keep_file=True)
    assert len(data) > 0 and result.timing.frames == 20
    assert result.audio_key is None and result.file is None
    assert "watermark failed" in result.cache_error
    # neither a render nor a cache entry (the request is seeded: one would be under audio/)
    assert not [k for k in blob_store.list_keys("") if k.startswith(("renders/", "audio/"))]


def test_from_env_builds_a_service_that_marks(engine: Engine, blob_store: BlobStore) -> None:
    config = ServiceConfig.from_env({"VOXCAST_WATERMARK": "perth"})
    assert (config.watermark, config.watermark_model) == ("perth", None)
    assert Service.assemble(config, engine, blob_store).watermarker is not None
    assert Service.assemble(ServiceConfig.from_env({}), engine, blob_store).watermarker is None
    with pytest.raises(ValueError, match="watermark='Perth'"):
        ServiceConfig(watermark="Perth")


MANIFEST = "id,text,seed\nwelcome,Welcome to Acme.,10\nhold,Please hold the line.,20\n"


def test_a_prerendered_library_is_marked_after_its_post_processing(
    local_store: BlobStore, perth: PerthWatermarker
) -> None:
    payload = {"library": "acme", "manifest": MANIFEST, "presets": ["pcm16k"], "gate": False}
    service = ScriptedService(local_store)
    service.watermarker = perth
    summary = prerender(service, PrerenderJob.from_payload(payload))  # type: ignore[arg-type]
    assert summary["rendered"] == 2 and service.watermark_args == [False, False]  # marked once, here
    doc = json.loads(local_store.get_bytes("libraries/acme/manifest.json"))
    for entry in doc["prompts"].values():
        assert entry["watermark"] == "perth"
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
        assert "watermark" not in entry
        pcm, sr = sf.read(
            io.BytesIO(local_store.get_bytes(entry["objects"]["pcm16k"]["key"])), dtype="float32"
        )
        assert perth.detect(pcm, sr) < 0.5


def test_a_runpod_job_returned_whole_carries_the_stored_marked_file(
    engine: Engine, blob_store: BlobStore, perth: PerthWatermarker
) -> None:
    service = Service.assemble(ServiceConfig(watermark="perth"), engine, blob_store)
    handler = RunpodHandler(service, RunpodConfig())
    job = {**TEXT, "seed": 4, "max_frames": 20, "stream": False, "response_format": "wav"}

    async def run(job_id: str) -> list[dict[str, Any]]:
        return [m async for m in handler.handle({"id": job_id, "input": job})]

    for job_id in ("miss", "hit"):  # rendered, then from the cache: the same marked file both times
        (final,) = asyncio.run(run(job_id))
        inline = base64.b64decode(final["audio"])
        assert inline == blob_store.get_bytes(final["audio_key"])
        assert final["timing"]["extra"]["watermark"] == "perth"
        assert final["timing"]["cache_hit"] is (job_id == "hit")
    plain, _ = _run(
        Service.assemble(ServiceConfig(), engine, blob_store), **{**job, "response_format": "pcm"}
    )
    marked, _ = sf.read(io.BytesIO(inline), dtype="float32")
    np.testing.assert_allclose(marked, mark(perth, _pcm(plain), 24000), atol=4 * LSB)
