"""RQ adapter mechanics in-process: a real redis-server and a real VoxcastWorker (burst mode) around a
small deterministic stand-in for the Service (the contract's shape: lazy chunk stream, cancel, result).

What is checked here is the adapter: stream protocol per job, allow-list, JSON-only payloads,
structured errors, cancellation, failure callback, prerender bookkeeping. The same paths with the
real (tiny) model in a worker subprocess are in test_rq_reliability.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import redis
from rq import Queue, Worker
from rq.exceptions import AbandonedJobError
from rq.job import Callback, Job, Retry

from voxcast.engine.request import parse_request
from voxcast.engine.timing import Timing
from voxcast.errors import VoiceNotFound
from voxcast.metrics import Metrics
from voxcast.serving.rq.client import JobFailed, QueueClient, StreamCapture
from voxcast.serving.rq.config import QueueConfig
from voxcast.serving.rq.dead_letter import read_dead_letters
from voxcast.serving.rq.jobs import SYNTHESIZE, on_failure
from voxcast.serving.rq.stream import EntryType, StreamPublisher, read_all, stream_key
from voxcast.serving.rq.worker import VoxcastWorker
from voxcast.storage.local import LocalBlobStore

# -- a deterministic stand-in for voxcast.service.Service ------------------------------------------


@dataclass
class FakeResult:
    request_id: str
    format: str
    sample_rate: int
    timing: Timing
    bytes: int = 0
    duration_s: float = 0.0
    audio_key: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "format": self.format,
            "sample_rate": self.sample_rate,
            "bytes": self.bytes,
            "duration_s": self.duration_s,
            "audio_key": self.audio_key,
            "timing": self.timing.to_dict(),
        }


class FakeStream:
    """Chunks: n = len(text) // 4 + 1, each 80 ms of int16 PCM (a tone between two silences)."""

    def __init__(self, service: FakeService, req: Any, delay_s: float) -> None:
        self.service, self.req, self.delay_s = service, req, delay_s
        self.result: FakeResult | None = None
        self.cancelled = False

    def __iter__(self) -> Iterator[Any]:
        if self.req.voice == "nobody":
            raise VoiceNotFound("unknown speaker 'nobody'", field="voice")
        pcm = self.service.audio_for(self.req.text)
        step = 1920  # 80 ms at 24 kHz
        timing = Timing(request_id=self.req.request_id or "")
        n = 0
        for n, start in enumerate(range(0, len(pcm), step)):
            if self.cancelled:
                break
            if self.service.hold is not None and n == self.service.hold[0]:
                self.service.hold[1].wait(10)
            time.sleep(self.delay_s)
            data = pcm[start : start + step].tobytes()
            yield SimpleNamespace(
                seq=n, data=data, format=self.req.response_format, sample_rate=24000, frames=1, t_ms=80.0 * n
            )
        key = self.service.cache_key(self.req)
        timing.cache_hit = key in self.service.cache
        self.service.cache.add(key)
        timing.chunks = n + 1
        timing.total_ms = 1.0
        timing.finish_reason = "cancelled" if self.cancelled else "eos"
        self.result = FakeResult(
            self.req.request_id or "",
            str(self.req.response_format),
            24000,
            timing,
            len(pcm) * 2,
            len(pcm) / 24000,
            "renders/x",
        )

    def cancel(self) -> None:
        self.cancelled = True
        self.service.cancels += 1


@dataclass
class FakeService:
    store: LocalBlobStore
    delay_s: float = 0.0
    hold: tuple[int, threading.Event] | None = None
    """``(n, event)``: a stream's chunk n waits (10 s at most) until the event is set."""
    engine: Any = field(
        default_factory=lambda: SimpleNamespace(identity="fake-model@1", load_ms=0.0, warmup_ms=0.0)
    )
    calls: int = 0
    cancels: int = 0
    cache: set[str] = field(default_factory=set)
    metrics: Metrics = field(default_factory=Metrics)
    watermarker: Any = None

    def synthesize(
        self,
        request: Any,
        store: bool = True,
        entry: str = "python",
        watermark: bool = True,
        realtime: bool | None = None,
    ) -> FakeStream:
        self.calls += 1
        return FakeStream(self, parse_request(request), self.delay_s)

    def register_voice(self, audio: bytes, ref_text: str | None = None, x_vector_only: bool = False) -> str:
        return "vx_" + hashlib.sha256(audio + (ref_text or "").encode()).hexdigest()[:32]

    @staticmethod
    def audio_for(text: str) -> np.ndarray:
        sr = 24000
        t = np.arange(int(0.08 * sr * (len(text) // 4 + 1))) / sr
        tone = (0.2 * np.sin(2 * np.pi * 200 * t) * 32767).astype("<i2")
        silence = np.zeros(int(0.3 * sr), dtype="<i2")
        return np.concatenate([silence, tone, silence])

    @staticmethod
    def cache_key(req: Any) -> str:
        return json.dumps([req.text, req.voice, req.sampling.seed, str(req.response_format)])

    def close(self) -> None:
        pass


# -- fixtures ---------------------------------------------------------------------------------------
QCFG = QueueConfig(queues=("vx-test",), heartbeat_ttl_s=10, heartbeat_interval_s=0.5)


@pytest.fixture
def service(tmp_path: Path) -> FakeService:
    return FakeService(LocalBlobStore(tmp_path / "store", fsync=False))


@pytest.fixture
def client(redis_client: redis.Redis) -> QueueClient:
    return QueueClient(redis_client, QCFG)


def run_worker(redis_client: redis.Redis, service: FakeService) -> VoxcastWorker:
    worker = VoxcastWorker(list(QCFG.queues), connection=redis_client, service=service, queue_config=QCFG)
    worker.work(burst=True, logging_level="WARNING")
    return worker


def capture(client: QueueClient, job_id: str) -> StreamCapture:
    cap = StreamCapture()
    for e in client.follow(job_id, idle_timeout_s=5, block_ms=100):
        cap.add(e)
    return cap


# -- synthesize -------------------------------------------------------------------------------------
def test_synthesize_streams_every_chunk_and_a_late_reader_replays_it(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    job_id = client.enqueue({"text": "Hello there, caller.", "voice": "vivian", "response_format": "pcm"})
    run_worker(redis_client, service)
    result = client.wait(job_id, timeout_s=5)
    assert result["status"] == "finished" and result["job_id"] == job_id and result["attempt"] == 1
    assert result["stream_key"] == stream_key(job_id) and result["timing"]["queue_wait_ms"] > 0
    cap = capture(client, job_id)  # after the fact: a late reader
    assert cap.status == "eos" and cap.gaps == 0 and cap.start["request_id"] == job_id
    assert cap.audio == FakeService.audio_for("Hello there, caller.").tobytes()
    assert cap.result["audio_key"] == "renders/x"
    assert 0 < redis_client.ttl(stream_key(job_id)) <= QCFG.stream.ttl_s


def test_invalid_requests_fail_with_a_structured_error_and_no_retry(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    q = client.queue()
    bad = [
        q.enqueue(SYNTHESIZE, {"text": "   "}, retry=Retry(max=3)).id,
        q.enqueue(SYNTHESIZE, ["not", "an", "object"]).id,
        q.enqueue(SYNTHESIZE, {"text": "hi", "colour": "red"}).id,
        q.enqueue(SYNTHESIZE, {"text": "hi", "voice": "nobody"}).id,  # model-level: raised while iterating
    ]
    good = client.enqueue({"text": "still serving"})
    run_worker(redis_client, service)
    fields = []
    for job_id in bad:
        with pytest.raises(JobFailed) as e:
            client.wait(job_id, timeout_s=5)
        assert e.value.status == "failed" and e.value.error
        fields.append(e.value.error.get("field"))
        last = read_all(redis_client, stream_key(job_id))[-1]
        assert last.type is EntryType.ERROR and last.info["code"] in ("invalid_request", "voice_not_found")
    assert fields == ["text", "request", "colour", "voice"]
    assert client.job(bad[0]).retries_left == 0
    assert client.wait(good, timeout_s=5)["status"] == "finished"


def test_not_allow_listed_functions_and_callbacks_never_run(
    client: QueueClient, redis_client: redis.Redis, service: FakeService, tmp_path: Path
) -> None:
    q = client.queue()
    target = tmp_path / "pwned"
    evil = q.enqueue("os.makedirs", str(target)).id
    evil_cb = q.enqueue(SYNTHESIZE, {"text": "hi"}, on_success=Callback("os.abort")).id
    good = client.enqueue({"text": "after the bad ones"})
    run_worker(redis_client, service)
    for job_id, needle in [
        (evil, "'os.makedirs' is not allowed"),
        (evil_cb, "callback 'os.abort' is not allowed"),
    ]:
        with pytest.raises(JobFailed) as e:
            client.wait(job_id, timeout_s=5)
        assert needle in (e.value.exc or "")
    assert not target.exists()
    assert client.wait(good, timeout_s=5)["status"] == "finished"


def test_pickled_payloads_are_refused_with_a_clear_error(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    pickled = Queue("vx-test", connection=redis_client).enqueue(SYNTHESIZE, {"text": "pickled"}).id  # pickle
    good = client.enqueue({"text": "json"})
    run_worker(redis_client, service)
    with pytest.raises(JobFailed) as e:
        client.wait(pickled, timeout_s=5)
    assert "not valid JSON" in (e.value.exc or "")
    assert client.wait(good, timeout_s=5)["status"] == "finished"


def test_garbage_job_hash_does_not_kill_the_worker(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    redis_client.hset("rq:job:garbage", mapping={"data": b"x", "created_at": b"not a date", "status": b"??"})
    redis_client.rpush("rq:queue:vx-test", b"garbage")
    good = client.enqueue({"text": "after garbage"})
    run_worker(redis_client, service)
    assert client.wait(good, timeout_s=5)["status"] == "finished"
    [record] = read_dead_letters(redis_client, "vx-test")
    assert record["entry"] == "garbage" and "cannot be restored" in record["reason"]


@pytest.mark.parametrize("entry", [b"../../x", b"a:b", b"a b", b"\xff\xfe", b"", b"x" * 300 + b"/"])
def test_an_entry_with_an_invalid_id_is_dead_lettered_and_the_worker_keeps_serving(
    client: QueueClient, redis_client: redis.Redis, service: FakeService, entry: bytes
) -> None:
    """Before: RQ's dequeue raised ValueError on such an id and the worker exited (status 0), and its
    intermediate-queue cleanup raised again at every restart."""
    good = client.enqueue({"text": "before"})  # valid id, so "a:b" cannot alias a real job
    redis_client.rpush("rq:queue:vx-test", entry)
    after = client.enqueue({"text": "after the bad entry"})
    worker = run_worker(redis_client, service)
    assert client.wait(good, timeout_s=5)["status"] == "finished"
    assert client.wait(after, timeout_s=5)["status"] == "finished"
    [record] = read_dead_letters(redis_client, "vx-test")
    assert (
        record["entry"] == entry.decode("utf-8", "backslashreplace")
        and "not a valid RQ job id" in record["reason"]
    )
    assert redis_client.llen("rq:queue:vx-test") == 0
    assert redis_client.llen("rq:queue:vx-test:intermediate") == 0
    assert worker.get_state() != "busy"


def test_a_bad_id_left_in_the_intermediate_list_is_cleaned_not_raised(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    """An entry a worker died on (the old crash) waits in the intermediate list: maintenance drops it."""
    redis_client.rpush("rq:queue:vx-test:intermediate", b"../../x")
    good = client.enqueue({"text": "still serving"})
    run_worker(redis_client, service)  # burst mode runs maintenance (clean_registries) first
    assert client.wait(good, timeout_s=5)["status"] == "finished"
    assert redis_client.llen("rq:queue:vx-test:intermediate") == 0


def test_a_worker_registers_again_after_redis_forgets_it(
    redis_client: redis.Redis, service: FakeService
) -> None:
    """Redis restarted without persistence: the worker's key and set memberships are gone."""
    worker = VoxcastWorker(list(QCFG.queues), connection=redis_client, service=service, queue_config=QCFG)
    worker.register_birth()
    redis_client.flushdb()
    assert not Worker.all(connection=redis_client)
    worker.heartbeat()
    assert [w.name for w in Worker.all(connection=redis_client)] == [worker.name]
    assert [w.name for w in Worker.all(queue=Queue("vx-test", connection=redis_client))] == [worker.name]
    worker.register_death()


# -- cancellation -----------------------------------------------------------------------------------
def test_cancel_a_queued_job(client: QueueClient, redis_client: redis.Redis, service: FakeService) -> None:
    job_id = client.enqueue({"text": "never spoken"})
    assert client.cancel(job_id) == "cancelled"
    run_worker(redis_client, service)
    assert service.calls == 0
    assert capture(client, job_id).status == "cancelled"
    assert client.status(job_id)["status"] == "cancelled"  # RQ says canceled; one word for both ways
    assert client.wait(job_id, timeout_s=2)["status"] == "cancelled"
    assert client.cancel(job_id) == "cancelled"  # already ended: says so
    assert client.cancel("no-such-job") == "unknown"


def test_cancel_a_running_job_between_chunks(
    client: QueueClient, redis_client: redis.Redis, redis_url: str, service: FakeService
) -> None:
    asked = threading.Event()
    service.hold = (5, asked)  # the job is still running when the cancel lands, however fast the host
    job_id = client.enqueue({"text": "a long text " * 30})  # 91 chunks
    outcomes: list[str] = []

    def cancel_after_first_chunks() -> None:
        other = QueueClient(redis.Redis.from_url(redis_url), QCFG)  # another process's view
        for e in other.follow(job_id, block_ms=50, idle_timeout_s=10):
            if e.type is EntryType.CHUNK and (e.seq or 0) >= 3:
                outcomes.append(other.cancel(job_id))
                asked.set()
                return

    t = threading.Thread(target=cancel_after_first_chunks)
    t.start()
    run_worker(redis_client, service)
    t.join(timeout=5)
    cap = capture(client, job_id)
    # chunks 0-3 were out before the cancel: it is seen with the XADD of chunk 4, or of chunk 5 (held)
    assert cap.status == "cancelled" and len(cap.chunks) in (5, 6) and outcomes == ["cancelling"]
    assert client.wait(job_id, timeout_s=2)["status"] == "cancelled"
    assert client.status(job_id)["status"] == "cancelled"  # RQ says finished
    assert service.cancels >= 1


# -- failure callback -------------------------------------------------------------------------------
def test_failure_callback_ends_an_abandoned_stream(client: QueueClient, redis_client: redis.Redis) -> None:
    job_id = client.enqueue({"text": "worker dies"})
    pub = StreamPublisher(redis_client, stream_key(job_id))
    pub.start({"attempt": 1})
    pub.chunk(0, b"ab", format="pcm", sample_rate=24000, t_ms=0)
    job = Job.fetch(job_id, connection=redis_client, serializer=client.queue().serializer)
    on_failure(job, redis_client, AbandonedJobError, AbandonedJobError(), None)
    on_failure(job, redis_client, AbandonedJobError, AbandonedJobError(), None)  # idempotent
    entries = read_all(redis_client, stream_key(job_id))
    assert [e.type for e in entries] == [EntryType.START, EntryType.CHUNK, EntryType.ERROR]
    assert entries[-1].info["code"] == "worker_lost"


# -- register_voice ---------------------------------------------------------------------------------
def test_register_voice_inline_and_from_the_store(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    service.store.put_bytes("uploads/ref.wav", b"RIFF....fake")
    inline = client.register_voice(b"RIFF....fake")
    stored = client.register_voice(audio_key="uploads/ref.wav")
    missing = client.register_voice(audio_key="uploads/none.wav")
    bad = client.queue().enqueue("voxcast.serving.rq.jobs.register_voice", {"audio_b64": "%%%"}).id
    run_worker(redis_client, service)
    assert client.wait(inline)["voice_id"] == client.wait(stored)["voice_id"]
    for job_id, fld in [(missing, "audio_key"), (bad, "audio_b64")]:
        with pytest.raises(JobFailed) as e:
            client.wait(job_id)
        assert e.value.error["field"] == fld


# -- prerender --------------------------------------------------------------------------------------
MANIFEST = "id,text,voice,seed\nwelcome,Welcome to Acme.,vivian,\nhold,Please hold.,ryan,5\n,no id,vivian,\nghost,Boo.,nobody,\n"


def test_prerender_renders_good_rows_reports_bad_ones_and_reruns_render_nothing(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    job_id = client.prerender(
        MANIFEST, library="acme", manifest_format="csv", presets=["mulaw8k", "wav24k", "mp3"]
    )
    run_worker(redis_client, service)
    summary = client.wait(job_id, timeout_s=30)
    assert (summary["rendered"], summary["skipped"], summary["failed"]) == (2, 0, 2)
    assert {(e["row"], e["field"]) for e in summary["errors"]} == {(3, "id"), (4, "voice")}
    keys = set(service.store.list_keys("libraries/acme/"))
    assert keys == {
        "libraries/acme/manifest.json",
        *(
            f"libraries/acme/{p}/{i}.{x}"
            for i in ("welcome", "hold")
            for p, x in [("mulaw8k", "wav"), ("wav24k", "wav"), ("mp3", "mp3")]
        ),
    }
    doc = json.loads(service.store.get_bytes("libraries/acme/manifest.json"))
    hold = doc["prompts"]["hold"]
    assert hold["sampling"]["seed"] == 5 and hold["voice"] == "ryan" and hold["model"] == "fake-model@1"
    obj = hold["objects"]["mulaw8k"]
    assert obj["sha256"] == hashlib.sha256(service.store.get_bytes(obj["key"])).hexdigest()
    assert hold["duration_s"] < hold["source_duration_s"]
    assert hold["quality"]["passed"] and hold["quality"]["attempt"] == 1 and hold["quality"]["seed"] == 5
    for o in hold["objects"].values():  # the level set and measured on each stored file
        assert o["loudness_lufs"] == pytest.approx(-19, abs=1.0) and o["true_peak_dbtp"] <= -0.9
    progress = client.progress(job_id)
    assert progress["done"] == progress["total"] == 4

    calls = service.calls
    again = client.prerender(
        MANIFEST, library="acme", manifest_format="csv", presets=["mulaw8k", "wav24k", "mp3"]
    )
    run_worker(redis_client, service)
    summary = client.wait(again, timeout_s=30)
    assert (summary["rendered"], summary["skipped"]) == (
        0,
        2,
    ) and service.calls == calls + 1  # only the bad voice row

    edited = MANIFEST.replace("Please hold.", "Please hold the line.")
    third = client.prerender(
        edited, library="acme", manifest_format="csv", presets=["mulaw8k", "wav24k", "mp3"]
    )
    other = client.prerender(MANIFEST, library="acme2", manifest_format="csv", presets=["pcm8k"])
    run_worker(redis_client, service)
    assert (client.wait(third)["rendered"], client.wait(third)["skipped"]) == (1, 1)
    assert client.wait(other)["cache_hits"] == 2  # same prompts in another library: served from the cache


def test_one_prerender_per_library_at_a_time(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    # the lock names a library job that is still waiting: that run is in progress
    holder = client.queue("vx-elsewhere").enqueue(SYNTHESIZE, {"text": "x"}, job_id="other-job")
    redis_client.set("voxcast:lock:library:busy", b"other-job")
    job_id = client.prerender("id,text\na,Hi.\n", library="busy", manifest_format="csv", presets=["pcm8k"])
    run_worker(redis_client, service)
    with pytest.raises(JobFailed) as e:
        client.wait(job_id)
    assert e.value.error["code"] == "library_busy" and service.calls == 0
    assert redis_client.get("voxcast:lock:library:busy") == b"other-job"  # not released by the loser

    holder.delete()  # a holder that ended or vanished (its worker died) is stale: the next run takes over
    again = client.prerender("id,text\na,Hi.\n", library="busy", manifest_format="csv", presets=["pcm8k"])
    run_worker(redis_client, service)
    assert client.wait(again)["rendered"] == 1 and service.calls == 1
    assert not redis_client.exists("voxcast:lock:library:busy")  # the final step released it


def test_job_timeout_ends_the_stream_with_an_error(
    client: QueueClient, redis_client: redis.Redis, service: FakeService
) -> None:
    service.delay_s = 0.05
    job_id = client.enqueue({"text": "a long text " * 30}, timeout_s=1)  # 91 chunks, ~4.5 s
    run_worker(redis_client, service)
    with pytest.raises(JobFailed) as e:
        client.wait(job_id, timeout_s=5)
    assert "JobTimeoutException" in (e.value.exc or "")
    last = read_all(redis_client, stream_key(job_id))[-1]
    assert last.type is EntryType.ERROR and last.info["code"] == "timeout"
    assert service.cancels == 1  # the engine stream was stopped too


def test_rq_cli_style_construction_gets_voxcast_settings(
    redis_client: redis.Redis, service: FakeService
) -> None:
    from rq.defaults import DEFAULT_MAINTENANCE_TASK_INTERVAL, DEFAULT_WORKER_TTL
    from rq.serializers import JSONSerializer

    from voxcast.serving.rq.worker import VoxcastJob

    # what `rq worker -w voxcast.serving.rq.worker.VoxcastWorker` passes (pickle queues, RQ defaults)
    worker = VoxcastWorker(
        [Queue("vx-test", connection=redis_client)],
        connection=redis_client,
        default_worker_ttl=DEFAULT_WORKER_TTL,
        worker_ttl=DEFAULT_WORKER_TTL,
        maintenance_interval=DEFAULT_MAINTENANCE_TASK_INTERVAL,
        job_class="rq.job.Job",
        serializer=None,
        service=service,
        queue_config=QCFG,
    )
    assert (
        worker.worker_ttl == QCFG.worker_ttl_s and worker.maintenance_interval == QCFG.maintenance_interval_s
    )
    assert worker.serializer is JSONSerializer and worker.job_class is VoxcastJob
    assert all(q.serializer is JSONSerializer and q.job_class is VoxcastJob for q in worker.queues)
    assert worker.get_heartbeat_ttl(Job(connection=redis_client)) == QCFG.heartbeat_ttl_s
