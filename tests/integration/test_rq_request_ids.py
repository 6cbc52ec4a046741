"""Request ids under a retrying or careless client: a real redis-server and real worker processes
(``python worker.py``) serving the toy family (tests/toy_family), or the stream protocol alone.

The contract (docs/queue.md, "Request ids"): an id names one job while that job or its stream lives;
the identical request enqueued again is that job (nothing new runs), another request is refused with
``request_id_in_use``; cancelling a job that has ended leaves nothing behind; a follower reads one
run of a stream, never a mix of two.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.fixtures.models import build_cached_toy
from tests.fixtures.rq_worker import WorkerProcess
from tests.toy_family.family import MODULE, held_env
from voxcast.audio.formats import AudioFormat
from voxcast.engine.request import parse_request
from voxcast.errors import RequestIdInUse
from voxcast.service import EncodedChunk
from voxcast.serving.rq.claims import claim_key
from voxcast.serving.rq.client import JobFailed, QueueClient, StreamCapture
from voxcast.serving.rq.config import QueueConfig
from voxcast.serving.rq.names import cancel_key
from voxcast.serving.rq.stream import EntryType, StreamPublisher, new_run, read_all, stream_key
from voxcast.serving.runpod.mirror import RedisMirror

REPO = Path(__file__).resolve().parents[2]
QUEUE = "vx-ids"
CFG = QueueConfig(queues=(QUEUE,), retries=0)
FIRST = {"text": "First use.", "voice": "low", "seed": 3}
SECOND = {"text": "A longer and different sentence under the same id.", "voice": "high", "seed": 3}


def _voxcast(
    redis_url: str, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "voxcast.serving.cli.main", *argv, "--redis-url", redis_url],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})},
    )  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path, redis_client: redis.Redis, redis_url: str) -> Iterator[dict]:
    """A factory of toy-family worker processes on QUEUE (stopped at the end) and a client."""
    workers: list[WorkerProcess] = []

    def start(**extra: str) -> WorkerProcess:
        log = tmp_path / f"worker{len(workers)}.log"
        env = {"VOXCAST_FAMILIES": MODULE, **extra}
        w = WorkerProcess(redis_url, build_cached_toy(), tmp_path / "store", log, QUEUE, env)
        workers.append(w)
        return w

    yield {"start": start, "client": QueueClient(redis_client, CFG), "workers": workers}
    for w in workers:
        if w.alive:
            w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        w.stop()


def _starts(client: redis.Redis, job_id: str) -> int:
    return sum(e.type is EntryType.START for e in read_all(client, stream_key(job_id)))


def _followed(client: QueueClient, job_id: str) -> StreamCapture:
    capture = StreamCapture()
    for entry in client.follow(job_id, idle_timeout_s=60):
        capture.add(entry)
    return capture


def test_a_reused_id_is_refused_for_another_request_and_is_the_same_job_for_the_same(
    fleet, redis_client, redis_url, tmp_path
) -> None:
    """Before: the second enqueue ran a second job on the same stream, and its follower got the first
    job's audio (``start, chunks, eos, start, chunks, eos``; followers stop at the first ``eos``)."""
    fleet["start"]().wait_ready(redis_client)
    client: QueueClient = fleet["client"]
    first = client.enqueue({**FIRST, "request_id": "reuse-2"})
    result = client.wait(first, timeout_s=120)
    assert first == "reuse-2" and result["status"] == "finished"

    with pytest.raises(RequestIdInUse) as refused:
        client.enqueue({**SECOND, "request_id": "reuse-2"})
    assert refused.value.field == "request_id" and refused.value.code == "request_id_in_use"
    cli = _voxcast(
        redis_url, "enqueue", SECOND["text"], "--voice", "high", "--queue", QUEUE,
        "--request", '{"request_id": "reuse-2"}', "--out", str(tmp_path / "b.wav"),
    )  # fmt: skip
    assert cli.returncode == 2, cli.stderr
    assert json.loads(cli.stderr.strip().splitlines()[-1])["error"]["code"] == "request_id_in_use"
    assert not (tmp_path / "b.wav").exists()

    again = client.submit({**FIRST, "request_id": "reuse-2"})  # a client retrying its enqueue
    assert again.job_id == "reuse-2" and not again.created
    assert _starts(redis_client, "reuse-2") == 1  # nothing ran again
    assert _followed(client, "reuse-2").audio  # the one job's audio, replayed

    # a followed enqueue's stdout is the result's JSON alone (the job id goes to stderr)
    followed = _voxcast(
        redis_url, "enqueue", FIRST["text"], "--voice", "low", "--queue", QUEUE,
        "--request", '{"request_id": "cli-json"}', "--out", str(tmp_path / "c.wav"),
    )  # fmt: skip
    assert followed.returncode == 0, followed.stderr
    shown = json.loads(followed.stdout)
    assert (shown["job_id"], shown["status"]) == ("cli-json", "finished")
    assert followed.stderr.splitlines()[0] == "cli-json"

    # once the job and its stream are gone (expired), the id is free for another request
    redis_client.delete(stream_key("reuse-2"), "rq:job:reuse-2", "rq:results:reuse-2")
    redis_client.set(claim_key("reuse-2"), redis_client.get(claim_key("reuse-2")).split(b"|")[0] + b"|0")
    other = client.enqueue({**SECOND, "request_id": "reuse-2"})
    capture = _followed(client, other)
    assert capture.status == "eos" and capture.restarts == 0 and _starts(redis_client, other) == 1


def test_the_same_id_enqueued_at_once_runs_one_job(fleet, redis_client, redis_url) -> None:
    """Two workers, four clients enqueueing one id at the same moment (a client retrying its
    enqueue). Before: every enqueue ran, on both workers, and the stream interleaved their runs."""
    for w in [fleet["start"](), fleet["start"]()]:
        w.wait_ready(redis_client)
    clients = [QueueClient(redis.Redis.from_url(redis_url), CFG) for _ in range(4)]
    barrier = threading.Barrier(len(clients))
    outcomes: list[object] = []

    def enqueue(c: QueueClient, request: dict) -> None:
        barrier.wait()
        try:
            outcomes.append(c.submit(request))
        except RequestIdInUse as e:
            outcomes.append(e)

    threads = [threading.Thread(target=enqueue, args=(c, {**FIRST, "request_id": "twice"})) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.created for o in outcomes) == [False, False, False, True]  # type: ignore[attr-defined]
    assert fleet["client"].wait("twice", timeout_s=120)["status"] == "finished"
    _settle(redis_client)
    assert _starts(redis_client, "twice") == 1

    # different requests under one id at once: one is enqueued, the others are refused
    barrier.reset()
    outcomes.clear()
    requests = [{**FIRST, "text": f"Sentence number {i}.", "request_id": "contested"} for i in range(4)]
    threads = [threading.Thread(target=enqueue, args=(c, r)) for c, r in zip(clients, requests, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(o, RequestIdInUse) for o in outcomes) == 3
    capture = _followed(fleet["client"], "contested")
    _settle(redis_client)
    assert capture.status == "eos" and capture.restarts == 0 and _starts(redis_client, "contested") == 1


def _settle(client: redis.Redis, timeout_s: float = 60.0) -> None:
    """Until nothing waits on QUEUE and no job runs (every enqueued run has run)."""
    from rq import Queue

    queue = Queue(QUEUE, connection=client)
    deadline = time.monotonic() + timeout_s
    while queue.count or queue.started_job_registry.count:
        assert time.monotonic() < deadline, "jobs still queued or running"
        time.sleep(0.1)


def test_cancelling_a_finished_job_leaves_no_flag(fleet, redis_client, redis_url, tmp_path) -> None:
    """Before: ``cancel`` on a finished job printed ``finished`` and set ``voxcast:cancel:<id>`` for an
    hour, so a later job under that id ended ``cancelled before start``."""
    fleet["start"]().wait_ready(redis_client)
    client: QueueClient = fleet["client"]
    job = client.enqueue({**FIRST, "request_id": "done-then-cancel"})
    client.wait(job, timeout_s=120)
    cancel = _voxcast(redis_url, "cancel", job)
    assert (cancel.returncode, cancel.stdout.strip()) == (0, "finished"), cancel.stderr
    assert not redis_client.exists(cancel_key(job))

    # a running job is cancelled; once it has ended, its flag is gone too
    hold = tmp_path / "hold"
    held = fleet["start"](**held_env(hold))
    held.wait_ready(redis_client)
    fleet["workers"][0].stop()  # only the held worker serves the queue now
    hold.touch()  # its streams get no frame after their first while this exists
    running = client.enqueue({**FIRST, "text": "Held after its first frame.", "request_id": "running"})
    stream = client.follow(running, idle_timeout_s=60)
    assert next(stream).type is EntryType.START
    assert client.cancel(running) == "cancelling"
    hold.unlink()
    assert [e.type for e in stream][-1] is EntryType.CANCELLED
    assert client.wait(running, timeout_s=60)["status"] == "cancelled"
    assert not redis_client.exists(cancel_key(running))


def test_a_follower_reads_one_run_never_a_mix(redis_client) -> None:
    """Two publishers on one stream (two processes under one job id, or a stalled attempt that wakes
    after its retry started), their entries interleaved. Before: the follower collected both runs'
    chunks and stopped at the first run's ``eos``."""
    key = stream_key("mixed")
    a = StreamPublisher(redis_client, key, run=new_run())
    b = StreamPublisher(redis_client, key, run=new_run())
    a.start({"attempt": 1})
    b.start({"attempt": 2})
    for seq in range(3):
        a.chunk(seq, b"A" * 4, format="pcm", sample_rate=24000, t_ms=0.0)
        b.chunk(seq, b"B" * 4, format="pcm", sample_rate=24000, t_ms=0.0)
    a.eos({"run": "a"})
    b.chunk(3, b"B" * 4, format="pcm", sample_rate=24000, t_ms=0.0)
    b.eos({"run": "b"})
    capture = StreamCapture()
    for entry in QueueClient(redis_client, CFG).follow("mixed", idle_timeout_s=5):
        capture.add(entry)
    assert capture.audio == b"B" * 16 and capture.result == {"run": "b"}


def test_a_runpod_job_id_run_again_replaces_its_stream(redis_client) -> None:
    """Every local one-shot RunPod run is job ``local-test``, mirrored to Redis. Before: the second
    run appended to the first's stream, and a listener replayed the first run's audio."""
    request = parse_request({"text": "hello", "response_format": "pcm"})
    for text in (b"first run", b"second run"):
        mirror = RedisMirror(redis_client, "local-test")
        mirror.start(request)
        mirror.chunk(EncodedChunk(0, text, AudioFormat.PCM, 24000, frames=1, t_ms=0.0))
        mirror.eos({"bytes": len(text)})
    capture = StreamCapture()
    for entry in QueueClient(redis_client, CFG).follow("local-test", idle_timeout_s=5):
        capture.add(entry)
    assert capture.audio == b"second run" and _starts(redis_client, "local-test") == 1


@pytest.mark.parametrize("suffix", [".wav", ".pcm"])
def test_listen_on_a_stream_that_lost_its_start_writes_a_playable_file_and_fails(
    redis_client, redis_url, tmp_path, suffix
) -> None:
    """A stream whose first entries are gone (a Redis restart without persistence, a trim). Before:
    ``listen --out x.wav`` wrote headerless PCM named .wav, warned nothing and exited 0."""
    import numpy as np
    import soundfile as sf

    from voxcast.audio.encode import StreamEncoder

    fmt = "wav" if suffix == ".wav" else "pcm"
    encoder = StreamEncoder(fmt, 24000)  # type: ignore[arg-type]
    tone = (0.3 * np.sin(np.arange(24000) / 10)).astype(np.float32)
    chunks = [encoder.encode(part) for part in np.split(tone, 10)]
    pub = StreamPublisher(redis_client, stream_key("lost-start"), run=new_run())
    pub.start({"format": fmt, "sample_rate": 24000})
    for seq, audio in enumerate(chunks):
        pub.chunk(seq, audio, format=fmt, sample_rate=24000, t_ms=0.0)
    pub.eos({"chunks": 10})
    for entry_id, _ in redis_client.xrange(stream_key("lost-start"), count=5):  # start + 4 chunks lost
        redis_client.xdel(stream_key("lost-start"), entry_id)

    out = tmp_path / f"x{suffix}"
    listen = _voxcast(redis_url, "listen", "lost-start", "--out", str(out))
    assert listen.returncode == 1, listen.stderr
    assert "incomplete: 4 of 10 chunks missing (it lost its start)" in listen.stderr
    kept = 6 * 2400
    if suffix == ".wav":
        audio, rate = sf.read(out, dtype="int16")
        assert rate == 24000 and len(audio) == kept
    else:
        assert out.stat().st_size == kept * 2


def test_listen_on_a_lost_start_in_a_compressed_format_refuses(redis_client, redis_url, tmp_path) -> None:
    """An MP3 stream cut at its start cannot be written whole: nothing is written, exit 1."""
    key = stream_key("lost-mp3")
    pub = StreamPublisher(redis_client, key, run=new_run())
    pub.start({"format": "mp3", "sample_rate": 24000})
    for seq in range(3):
        pub.chunk(seq, b"\xff\xfb" + bytes(100), format="mp3", sample_rate=24000, t_ms=0.0)
    pub.eos({"chunks": 3})
    for entry_id, _ in redis_client.xrange(key, count=2):
        redis_client.xdel(key, entry_id)
    out = tmp_path / "x.mp3"
    listen = _voxcast(redis_url, "listen", "lost-mp3", "--out", str(out))
    assert listen.returncode == 1 and not out.exists(), listen.stderr
    assert "mp3 cannot be written from part of a stream" in listen.stderr


def test_status_and_wait_give_the_structured_error_of_a_timed_out_job(fleet, redis_client, tmp_path) -> None:
    """Before: ``client.status()`` said ``error: None`` (and ``JobFailed.error`` was ``{}``) for a job
    failed by its time limit: the code was only in the stream's terminal entry."""
    hold = tmp_path / "hold"
    fleet["start"](**held_env(hold)).wait_ready(redis_client)
    hold.touch()
    client: QueueClient = fleet["client"]
    job = client.enqueue({**FIRST, "text": "Held until its time limit."}, timeout_s=2)
    with pytest.raises(JobFailed) as failed:
        client.wait(job, timeout_s=60)
    assert failed.value.error["code"] == "timeout"
    assert client.status(job)["error"]["code"] == "timeout"


def test_a_waiting_prerender_prints_the_summary_of_a_cancelled_library(capsys) -> None:
    """Before: ``{"status": "cancelled", "error": null}`` and nothing of what was done."""
    from voxcast.serving.cli.queue import _print_summary

    summary = {"library": "acme", "status": "cancelled", "rendered": 3, "not_rendered": 7, "errors": []}
    status = {"status": "cancelled", "result": summary, "error": None, "exc": None}
    assert _print_summary(status) == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == {k: v for k, v in summary.items() if k != "errors"}
    assert "7 prompts not rendered" in err
