"""A prompt library while S3 is down: real redis-server, moto S3 behind a TCP proxy that a test cuts,
``python worker.py`` serving the tiny random-weight model.

The proxy starts each outage at an exact step (the first file a chunk writes, the manifest write),
so the outcome does not depend on how fast the machine renders. Each test fails on versions before
the store calls of library jobs were retried: the library failed at the first refused call. The worker's storage retry window
(``VOXCAST_STORAGE_RETRY_S``) is shortened so that each test takes seconds, not minutes.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fixtures.rq_worker import WorkerProcess
from tests.fixtures.s3 import DUMMY_ENV, MotoServer
from tests.fixtures.tcp_proxy import TcpProxy
from voxcast.serving.rq.client import JobFailed, QueueClient
from voxcast.serving.rq.config import QueueConfig
from voxcast.storage.s3 import S3BlobStore

QUEUE = "vx-lib-s3"
CFG = QueueConfig(queues=(QUEUE,))
PRESETS = ["mulaw8k", "wav24k"]
LIBRARY = "ivr"

pytestmark = pytest.mark.slow


def manifest(n: int, frames: int = 10) -> str:
    rows = [
        f"p{i:02d},Prompt number {i} of the library.,{'vivian' if i % 2 else 'ryan'},{frames}"
        for i in range(n)
    ]
    return "id,text,voice,max_frames\n" + "\n".join(rows) + "\n"


@pytest.fixture
def proxy(s3_server: MotoServer) -> Iterator[TcpProxy]:
    s3_server.start()  # a previous test may have stopped it
    with TcpProxy(s3_server.port) as p:
        yield p


@pytest.fixture
def bucket(s3_client: Any) -> str:
    name = f"vx-lib-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def worker(tiny_model_dir, tmp_path: Path, redis_url: str, proxy: TcpProxy, bucket: str) -> Iterator[Any]:
    """``start(retry_s) -> WorkerProcess`` on S3 through the proxy; stopped at the end."""
    started: list[WorkerProcess] = []

    def start(retry_s: float) -> WorkerProcess:
        env = {
            **DUMMY_ENV,
            "VOXCAST_S3_BUCKET": bucket,
            "VOXCAST_S3_ENDPOINT_URL": proxy.url,
            "VOXCAST_STORAGE_RETRY_S": str(retry_s),
            "VOXCAST_MAX_ACTIVE": "2",
        }
        w = WorkerProcess(
            redis_url,
            tiny_model_dir("custom_voice"),
            tmp_path / "unused",
            tmp_path / "worker.log",
            QUEUE,
            env,
        )
        started.append(w)
        return w

    yield start
    for w in started:  # killed: its warm shutdown is not under test (it takes ~20 s, as in the fan-out tests)
        if w.alive:
            w.kill()


def stored(s3_client: Any, bucket: str) -> dict[str, bytes]:
    store = S3BlobStore(s3_client, bucket, check_bucket=False)
    prefix = f"libraries/{LIBRARY}/"
    return {k[len(prefix) :]: store.get_bytes(k) for k in store.list_keys(prefix)}


def assert_complete(files: dict[str, bytes], n: int) -> None:
    """Every prompt's files and a manifest whose every entry records the stored bytes."""
    assert "manifest.json" in files, sorted(files)
    doc = json.loads(files["manifest.json"])
    assert sorted(doc["prompts"]) == [f"p{i:02d}" for i in range(n)] and not doc["errors"]
    for pid, entry in doc["prompts"].items():
        assert sorted(entry["objects"]) == sorted(PRESETS)
        for obj in entry["objects"].values():
            key = obj["key"].removeprefix(f"libraries/{LIBRARY}/")
            assert hashlib.sha256(files[key]).hexdigest() == obj["sha256"], pid
    assert len(files) == n * len(PRESETS) + 1


def run(client: QueueClient, text: str, timeout_s: float = 120) -> dict[str, Any]:
    job = client.prerender(text, library=LIBRARY, manifest_format="csv", presets=PRESETS, gate=False,
                           in_flight=2, chunk_prompts=3)  # fmt: skip
    return client.wait(job, timeout_s=timeout_s)


def test_an_outage_shorter_than_the_retry_window_the_library_completes(
    worker, proxy: TcpProxy, redis_client: redis.Redis, s3_client: Any, bucket: str
) -> None:
    client = QueueClient(redis_client, CFG)
    w = worker(retry_s=20)
    w.wait_ready(redis_client)
    # S3 goes down for 4 s at each step in turn: the plan's read of the previous manifest, a chunk's
    # first file, the manifest write. Before, the plan failed at once, and each chunk's 2 immediate
    # retries and the final step's were spent within the outage.
    steps = [
        rb"GET /[^ ]*/libraries/ivr/manifest\.json",
        rb"PUT /[^ ]*/libraries/ivr/[^ ]*\.wav",
        rb"PUT /[^ ]*/libraries/ivr/manifest\.json",
    ]
    proxy.cut_on(steps[0], outage_s=4.0)
    job = client.prerender(manifest(6), library=LIBRARY, manifest_format="csv", presets=PRESETS,
                           gate=False, in_flight=2, chunk_prompts=3)  # fmt: skip
    for before, step in itertools.pairwise(steps):
        deadline = time.monotonic() + 60
        while (
            not proxy.triggered() and time.monotonic() < deadline and client.status(job)["status"] != "failed"
        ):
            time.sleep(0.02)
        assert proxy.triggered(), f"the library never sent {before!r}: {client.status(job)['error']}"
        proxy.cut_on(step, outage_s=4.0)
    summary = client.wait(job, timeout_s=90)
    assert len(proxy.outages) == 3, "the manifest write was not cut"
    print(f"three 4 s outages (plan read, a chunk's first file, the manifest): {proxy.refused} connections "
          f"reset; library {summary['status']}, {summary['rendered']} rendered in {summary['elapsed_s']:.1f} s")  # fmt: skip
    assert (summary["status"], summary["rendered"], summary["failed"]) == ("finished", 6, 0)
    assert summary["manifest_written"] and proxy.refused > 0
    assert_complete(stored(s3_client, bucket), 6)
    assert "retrying" in w.tail(400)  # the worker said it waited for the store


def test_an_outage_longer_than_the_window_ends_with_storage_error_and_a_rerun_completes(
    worker, proxy: TcpProxy, redis_client: redis.Redis, s3_client: Any, bucket: str
) -> None:
    client = QueueClient(redis_client, CFG)
    w = worker(retry_s=3)
    w.wait_ready(redis_client)
    proxy.cut_on(rb"PUT /[^ ]*/libraries/ivr/[^ ]*\.wav", outage_s=600.0)  # until restored
    text = manifest(9)
    job = client.prerender(text, library=LIBRARY, manifest_format="csv", presets=PRESETS, gate=False,
                           in_flight=2, chunk_prompts=3)  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as ei:
        client.wait(job, timeout_s=90)
    ended_s = time.monotonic() - t0
    error = ei.value.error
    print(f"S3 down from a chunk's first file on, window 3 s: library ended after {ended_s:.1f} s "
          f"({proxy.refused} connections reset): {json.dumps({k: v for k, v in error.items() if k != 'summary'})}")  # fmt: skip
    assert error["code"] == "storage_error" and "S3" in error["message"]
    summary = error["summary"]
    assert summary["status"] == "storage_error" and summary["manifest_written"] is False
    assert summary["total"] == 9 and summary["rendered"] + summary["not_rendered"] + summary["failed"] == 9
    assert client.status(job)["error"]["code"] == "storage_error"
    # one window for the chunk that met the outage, one for the manifest: the other chunks did not
    # each spend a window of their own
    assert ended_s < 3 * 3 + 20
    assert "manifest.json" not in stored_direct(s3_client, bucket)

    proxy.restore()
    again = run(client, text)
    assert (again["status"], again["rendered"] + again["skipped"], again["failed"]) == ("finished", 9, 0)
    assert_complete(stored(s3_client, bucket), 9)
    assert w.alive


def stored_direct(s3_client: Any, bucket: str) -> list[str]:
    """The library's keys, read past the proxy (while it is cut)."""
    resp = s3_client.list_objects_v2(Bucket=bucket, Prefix=f"libraries/{LIBRARY}/")
    return [o["Key"].rsplit("/", 1)[-1] for o in resp.get("Contents", [])]
