"""``voxcast prerender`` ends as the README says: a manifest it cannot use is refused before anything is
enqueued (exit 2, naming ``manifest``); a library job that a worker failed on its input prints that
error, not the worker's traceback, and exits 2. A real redis-server, and the RQ adapter's in-process
worker around its stand-in service (``test_rq_jobs.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.integration.test_rq_jobs import QCFG, FakeService, run_worker
from voxcast.serving.cli import queue as cli_queue
from voxcast.serving.cli.main import main
from voxcast.serving.rq.client import QueueClient
from voxcast.storage.local import LocalBlobStore


@pytest.fixture
def service(tmp_path: Path) -> FakeService:
    return FakeService(LocalBlobStore(tmp_path / "store", fsync=False))


@pytest.mark.parametrize("text", ["id,text\n", "[]", ""])
def test_an_empty_manifest_is_refused_before_it_is_enqueued(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, redis_url: str, tmp_path: Path, text: str
) -> None:
    manifest = tmp_path / ("e.json" if text == "[]" else "e.csv")
    manifest.write_text(text)
    code = main(["prerender", str(manifest), "--library", "e", "--redis-url", redis_url, "--no-wait"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert json.loads(err)["error"]["field"] == "manifest"
    assert not redis_client.keys("rq:job:*")  # nothing enqueued, nothing for a worker to fail


def test_a_job_failed_on_its_input_prints_the_error_and_exits_2(
    capsys: pytest.CaptureFixture[str], redis_client: redis.Redis, service: FakeService
) -> None:
    client = QueueClient(redis_client, QCFG)
    job_id = client.prerender("id,text\n", library="e", manifest_format="csv")  # no check by the client
    run_worker(redis_client, service)
    capsys.readouterr()
    assert cli_queue._prerender_progress(client, job_id, poll_s=0.01) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    shown = json.loads(err)
    assert shown["status"] == "failed" and "exc" not in shown
    assert (shown["error"]["code"], shown["error"]["field"]) == ("invalid_request", "manifest")


def test_a_row_error_names_its_field_once(
    capsys: pytest.CaptureFixture[str],
    redis_client: redis.Redis,
    redis_url: str,
    service: FakeService,
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "p.csv"
    manifest.write_text("id,text,voice\nhi,Hello.,ryan\nbare,,ryan\n")
    argv = ["prerender", str(manifest), "--library", "p", "--presets", "pcm8k", "--no-wait"]
    assert main([*argv, "--redis-url", redis_url, "--queue", QCFG.queues[0]]) == 0
    job_id = capsys.readouterr().out.strip()
    run_worker(redis_client, service)
    assert cli_queue._prerender_progress(QueueClient(redis_client, QCFG), job_id, poll_s=0.01) == 3
    assert "row 2 (bare): text: Field required\n" in capsys.readouterr().err
