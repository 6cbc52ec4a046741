"""Chatterbox Turbo through the real entry points, unchanged: ``python handler.py`` as a RunPod SDK
worker against the fake control plane, and ``python worker.py`` as an RQ worker on a real Redis
(a synthesis job streamed on Redis Streams, a prerender job). Same schema, timing record and storage
as Qwen3-TTS; fields Turbo cannot honour fail naming the field and the worker serves on."""

from __future__ import annotations

import io
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import soundfile as sf

from tests.fixtures.rq_worker import WorkerProcess as RqWorker
from tests.fixtures.runpod_control_plane import FakeControlPlane, running_worker
from voxcast.serving.rq.client import JobFailed, QueueClient, StreamCapture
from voxcast.serving.rq.config import QueueConfig
from voxcast.storage.local import LocalBlobStore

pytest.importorskip("runpod")
pytestmark = pytest.mark.slow

TEXT = "Thanks for calling [chuckle] we will be right with you."
QUEUE = "vx-turbo"


def test_runpod_worker_streams_turbo_and_refuses_what_it_cannot_honour(
    turbo_model_dir: Path, tmp_path: Path
) -> None:
    env = {
        "VOXCAST_MODEL": str(turbo_model_dir),
        "VOXCAST_STORAGE_DIR": str(tmp_path / "store"),
        "VOXCAST_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    with FakeControlPlane() as plane, running_worker(plane, env, tmp_path / "worker.log"):
        speaker = plane.submit({"text": "hi", "voice": "ryan"})
        instruct = plane.submit({"text": "hi", "instruct": "whisper"})
        good = plane.submit({"text": TEXT, "seed": 3, "max_frames": 40})
        for job, field in ((speaker, "voice"), (instruct, "instruct")):
            rec = plane.wait_done(job, 120)
            assert set(rec.done) == {"error"} and json.loads(rec.done["error"])["field"] == field
        *chunks, final = plane.wait_done(good, 120).outputs
    assert final["done"] is True and final["timing"]["frames"] == sum(c["frames"] for c in chunks)
    assert 0 < final["timing"]["frames"] <= 40 and final["timing"]["ttfa_ms"] > 0
    assert [c["seq"] for c in chunks] == list(range(len(chunks))) and len(chunks) >= 2
    stored = LocalBlobStore(tmp_path / "store").get_bytes(final["audio_key"])
    with sf.SoundFile(io.BytesIO(stored)) as f:
        assert f.samplerate == 24000 and f.frames == round(final["duration_s"] * 24000)


@pytest.fixture
def rq_worker(
    turbo_model_dir: Path, tmp_path: Path, redis_client: redis.Redis, redis_url: str
) -> Iterator[tuple[RqWorker, QueueClient]]:
    w = RqWorker(redis_url, turbo_model_dir, tmp_path / "store", tmp_path / "worker.log", QUEUE)
    try:
        yield w, QueueClient(redis_client, QueueConfig(queues=(QUEUE,), retries=0))
    finally:
        if w.alive:
            w.proc.send_signal(signal.SIGTERM)
        w.stop()


def test_rq_worker_streams_turbo_on_redis_and_prerenders_a_library(
    rq_worker: tuple[RqWorker, QueueClient], redis_client: redis.Redis, tmp_path: Path
) -> None:
    w, client = rq_worker
    bad = client.enqueue({"text": "Hallo", "language": "german"})
    job = client.enqueue({"text": TEXT, "seed": 5, "max_frames": 30})
    w.wait_ready(redis_client, timeout_s=300)
    with pytest.raises(JobFailed) as e:
        client.wait(bad, timeout_s=120)
    assert e.value.error["field"] == "language"
    result = client.wait(job, timeout_s=120)
    cap = StreamCapture()
    for entry in client.follow(job, idle_timeout_s=10):
        cap.add(entry)
    assert (
        cap.status in ("eos", "max_frames")
        and cap.gaps == 0
        and len(cap.chunks) == result["timing"]["chunks"]
    )
    with sf.SoundFile(io.BytesIO(cap.audio)) as f:  # the streamed WAV, as for Qwen3-TTS
        assert f.samplerate == 24000 and f.read().shape[0] == round(result["duration_s"] * 24000)

    manifest = "id,text,seed,max_frames\nwelcome,Welcome to Acme.,8,30\nhold,Please hold.,9,30\n"
    lib = client.prerender(manifest, library="turbo", manifest_format="csv", presets=["mulaw8k"], gate=False)
    summary = client.wait(lib, timeout_s=300)
    assert (summary["rendered"], summary["failed"]) == (2, 0), summary["errors"]
    store = LocalBlobStore(tmp_path / "store")
    doc = json.loads(store.get_bytes("libraries/turbo/manifest.json"))
    for prompt in ("welcome", "hold"):
        data = store.get_bytes(doc["prompts"][prompt]["objects"]["mulaw8k"]["key"])
        assert data[:4] == b"RIFF" and data[20] == 7  # a G.711 mu-law WAV
        assert doc["prompts"][prompt]["model"] == doc["prompts"]["welcome"]["model"] != ""
    assert w.alive
