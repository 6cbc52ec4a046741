"""Prometheus metrics, scraped from each process type and parsed with prometheus_client's own parser:
the HTTP server (``/metrics`` on its port), the RunPod queue handler and the RQ worker
(``VOXCAST_METRICS_PORT``), each with the same names."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.http_server import loading_holder, running
from tests.fixtures.polling import wait_until
from tests.fixtures.procs import free_port, stop_process
from tests.fixtures.runpod_control_plane import FakeControlPlane, running_worker
from voxcast.config import EngineConfig
from voxcast.errors import InvalidRequest
from voxcast.service import Service, ServiceConfig
from voxcast.serving.http.app import ServiceHolder, create_app
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.rq.client import QueueClient
from voxcast.serving.rq.config import QueueConfig

REPO = Path(__file__).resolve().parents[2]
Factory = Callable[[str], Path]
SAY = {"input": "Hello there.", "voice": "ryan", "response_format": "pcm"}


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of one scrape."""
    return scrape_text(httpx.get(url, timeout=10).content)


def scrape_text(data: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = data.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def service(tiny_service: Service) -> Service:
    return tiny_service


def test_http_server_metrics_count_every_outcome(service: Service) -> None:
    model = service.engine.identity
    with (
        running(create_app(ServiceHolder(service), HttpConfig())) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        before = scrape(url + "/metrics")
        assert http.post("/v1/audio/speech", json={**SAY, "seed": 1, "max_frames": 5}).status_code == 200
        assert (
            http.post("/v1/audio/speech", json={**SAY, "seed": 1, "max_frames": 5}).status_code == 200
        )  # hit
        assert http.post("/v1/audio/speech", json={**SAY, "voice": "nobody"}).status_code == 400
        assert http.post("/v1/audio/speech", json={**SAY, "sample_rate": 5}).status_code == 400
        with http.stream("POST", "/v1/audio/speech", json={**SAY, "max_frames": 3000}) as r:
            next(r.iter_raw())  # then hang up: cancelled
        wait_until(
            lambda: (
                value(
                    scrape(url + "/metrics"),
                    "voxcast_requests_total",
                    entry="http",
                    model=model,
                    outcome="cancelled",
                )
                > 0
            )
        )
        after = scrape(url + "/metrics")

    def delta(outcome: str) -> float:
        key = {"entry": "http", "model": model, "outcome": outcome}
        return value(after, "voxcast_requests_total", **key) - value(before, "voxcast_requests_total", **key)

    assert delta("ok") == 1 and delta("cache_hit") == 1 and delta("voice_not_found") == 1
    assert delta("invalid_request") == 1 and delta("cancelled") == 1
    ttfa = value(after, "voxcast_time_to_first_audio_seconds_count", entry="http") - value(
        before, "voxcast_time_to_first_audio_seconds_count", entry="http"
    )
    assert ttfa == 3  # ok, hit, cancelled each had a first chunk
    assert (
        value(after, "voxcast_frames_generated_total") - value(before, "voxcast_frames_generated_total") >= 5
    )
    assert value(after, "voxcast_audio_cache_lookups_total", result="hit") >= 1
    assert value(after, "voxcast_engine_state", state="ready") == 1
    assert value(after, "voxcast_engine_state", state="loading") == 0
    assert ("voxcast_streams_active", ()) in after and ("voxcast_streams_waiting", ()) in after
    steps = value(after, "voxcast_engine_steps_total")
    assert steps > 0 and value(after, "voxcast_engine_step_rows_total") >= steps
    assert value(after, "voxcast_chunk_frames_count") > 0


def _hang_up_mid_upload(url: str) -> None:
    """A request head announcing 1000 body bytes, 10 of them, then the socket closes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"input": '
        )


def test_http_requests_refused_before_the_schema_are_counted(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad JSON, a body over the limit, a client gone mid-upload and 503 while loading reach
    ``voxcast_requests_total`` as ``/health`` counts them; the hang-up is ``cancelled``, not an
    ``internal_error`` with an ERROR traceback."""
    model = service.engine.identity
    app = create_app(ServiceHolder(service), HttpConfig(max_body_bytes=4096))
    with running(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        before = scrape(url + "/metrics")
        json_type = {"Content-Type": "application/json"}
        assert http.post("/v1/audio/speech", content=b'{"input": ', headers=json_type).status_code == 400
        assert http.post("/v1/audio/speech", content=b" " * 5000, headers=json_type).status_code == 413
        _hang_up_mid_upload(url)
        wait_until(lambda: app.state.counters.disconnected == 1, what="the hang-up counted")
        after = scrape(url + "/metrics")

    def delta(outcome: str) -> float:
        key = {"entry": "http", "model": model, "outcome": outcome}
        return value(after, "voxcast_requests_total", **key) - value(before, "voxcast_requests_total", **key)

    by_code = app.state.counters.by_code
    assert delta("invalid_request") == by_code["invalid_request"] == 1
    assert delta("request_too_large") == by_code["request_too_large"] == 1
    assert delta("cancelled") == 1 and "internal_error" not in by_code and delta("internal_error") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    holder, release = loading_holder(service)
    try:
        with running(create_app(holder, HttpConfig())) as url:
            assert httpx.post(url + "/v1/audio/speech", json=SAY, timeout=30).status_code == 503
            loading = scrape(url + "/metrics")
    finally:
        release.set()
    assert value(loading, "voxcast_requests_total", entry="http", model="", outcome="engine_unavailable") == 1


def test_http_metrics_report_loading_before_the_model_is_ready(service: Service) -> None:
    holder, release = loading_holder(service)
    with running(create_app(holder, HttpConfig())) as url:
        assert value(scrape(url + "/metrics"), "voxcast_engine_state", state="loading") == 1
        release.set()
        assert holder.wait(30)
        # the holder's metrics were made before the service: the service keeps its own here
        assert value(scrape(url + "/metrics"), "voxcast_engine_state", state="ready") == 1


def test_runpod_handler_serves_metrics_on_its_port(tiny_model_dir: Factory, tmp_path: Path) -> None:
    port = free_port()
    env = {
        "VOXCAST_MODEL": str(tiny_model_dir("custom_voice")),
        "VOXCAST_STORAGE_DIR": str(tmp_path / "store"),
        "VOXCAST_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "VOXCAST_METRICS_PORT": str(port),
        "VOXCAST_METRICS_HOST": "127.0.0.1",
        "VOXCAST_LOG_FORMAT": "json",
    }
    with FakeControlPlane() as plane, running_worker(plane, env, tmp_path / "worker.log") as worker:
        ok = plane.submit({"text": "Hello there.", "voice": "ryan", "max_frames": 4})
        bad = plane.submit({"text": "Hello there.", "voice": "nobody"})
        plane.wait_done(ok, 120)
        plane.wait_done(bad, 120)
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
        log = worker.log()
    for job in (ok, bad):  # every line a job's handling logs carries its id, the request line included
        lines = _json_lines_naming(log, job)
        assert len(lines) >= 2 and {x.get("request_id") for x in lines} == {job}, lines
        assert any(x["logger"] == "voxcast.requests" for x in lines)
    models = {dict(k[1]).get("model") for k in samples if k[0] == "voxcast_requests_total"}
    (model,) = models
    assert value(samples, "voxcast_requests_total", entry="runpod", model=model, outcome="ok") == 1
    assert (
        value(samples, "voxcast_requests_total", entry="runpod", model=model, outcome="voice_not_found") == 1
    )
    assert value(samples, "voxcast_engine_state", state="ready") == 1
    assert value(samples, "voxcast_load_seconds") > 0


@pytest.mark.slow
def test_rq_worker_serves_metrics_on_its_port(
    tiny_model_dir: Factory, tmp_path: Path, redis_client: redis.Redis, redis_url: str
) -> None:
    port, queue = free_port(), "vx-metrics"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "VOXCAST_MODEL": str(tiny_model_dir("custom_voice")),
        "VOXCAST_STORAGE_DIR": str(tmp_path / "store"),
        "VOXCAST_THREADS": "1",
        "VOXCAST_WARMUP": "0",
        "VOXCAST_METRICS_PORT": str(port),
        "VOXCAST_METRICS_HOST": "127.0.0.1",
        "VOXCAST_LOG_FORMAT": "json",
    }
    cmd = [sys.executable, str(REPO / "worker.py"), "--queues", queue, "--redis-url", redis_url]
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = QueueClient(redis_client, QueueConfig(queues=(queue,), retries=0))
        job = client.enqueue({"text": "Hello there.", "voice": "ryan", "max_frames": 4})
        result = client.wait(job, timeout_s=120)
        assert result["timing"]["frames"] == 4, result
        # the process's first request reports its cold start, split into its parts
        startup = result["timing"]["extra"]["startup"]
        assert startup["ready_ms"] >= startup["before_load_ms"] + startup["load_ms"] > 0
        assert startup["warmup_ms"] == 0  # VOXCAST_WARMUP=0
        later = client.wait(
            client.enqueue({"text": "Again.", "voice": "ryan", "max_frames": 2}), timeout_s=60
        )
        assert "startup" not in later["timing"]["extra"]
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop_process(proc, timeout_s=20)
    models = {dict(k[1]).get("model") for k in samples if k[0] == "voxcast_requests_total"}
    (model,) = models
    assert value(samples, "voxcast_requests_total", entry="rq", model=model, outcome="ok") == 2
    assert value(samples, "voxcast_frames_generated_total") == 6
    assert value(samples, "voxcast_startup_seconds", part="ready") == pytest.approx(
        startup["ready_ms"] / 1000, abs=1e-3
    )
    assert value(samples, "voxcast_startup_seconds", part="load") > 0
    lines = _json_lines_naming((tmp_path / "worker.log").read_text(), job)
    # every line from the job's start to its end (RQ names the job once before, when it dequeues it)
    during = [x for x in lines if not x["msg"].endswith(f": {queue}: {job}")]
    assert len(during) == len(lines) - 1 and {x.get("request_id") for x in during} == {job}, lines
    assert {"voxcast.requests", "voxcast.serving.rq.jobs", "rq.worker"} <= {x["logger"] for x in during}
    assert value(samples, "voxcast_engine_state", state="ready") == 1


def _json_lines_naming(log: str, request_id: str) -> list[dict[str, Any]]:
    """The JSON log lines whose message names ``request_id``."""
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    return [x for x in lines if request_id in x["msg"]]


def test_one_log_line_per_request_in_json_without_the_text(
    service: Service, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from voxcast.logs import JsonFormatter

    monkeypatch.delenv("VOXCAST_LOG_TEXT", raising=False)
    text = "A secret account number is 12345."
    with caplog.at_level(logging.INFO, logger="voxcast.requests"):
        stream = service.synthesize(
            {"text": text, "voice": "ryan", "max_frames": 3, "request_id": "req-42"}, entry="rq"
        )
        list(stream)
        with pytest.raises(InvalidRequest):
            service.synthesize({"text": text, "sample_rate": 5}, entry="http")
    records = [r for r in caplog.records if r.name == "voxcast.requests"]
    assert len(records) == 2
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["event"] == "request" and line["request_id"] == "req-42" and line["entry"] == "rq"
    assert line["outcome"] == "ok" and line["frames"] == 3 and line["voice"] == "ryan"
    assert line["text_chars"] == len(text) and len(line["text_sha256"]) == 16
    assert line["ts"].endswith("Z") and line["level"] == "INFO" and line["model"] == service.engine.identity
    assert all(text not in json.dumps(json.loads(JsonFormatter().format(r))) for r in records)
    assert json.loads(JsonFormatter().format(records[1]))["outcome"] == "invalid_request"
    monkeypatch.setenv("VOXCAST_LOG_TEXT", "1")
    with caplog.at_level(logging.INFO, logger="voxcast.requests"):
        list(service.synthesize({"text": text, "voice": "ryan", "max_frames": 2}))
    assert json.loads(JsonFormatter().format(caplog.records[-1]))["text"] == text


def test_log_format_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from voxcast.logs import setup_logging

    monkeypatch.setenv("VOXCAST_LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="VOXCAST_LOG_FORMAT"):
        setup_logging()


_LOG_PROGRAM = """
import contextvars, logging, threading
from voxcast.logs import bind_request_id, setup_logging
setup_logging()
log = logging.getLogger("voxcast.x")
log.info("hello %s", "there")
log.warning("redis://:hunter2@host/0 failed")
with bind_request_id("job-7"):
    log.info("inside")
    t = threading.Thread(target=contextvars.copy_context().run, args=(log.info, "on a thread"))
    t.start(); t.join()
    log.info("named", extra={"request_id": "req-9"})
log.info("after")
"""


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_log_lines_in_a_process_carry_the_bound_request_id(fmt: str) -> None:
    env = {**os.environ, "VOXCAST_LOG_FORMAT": fmt}
    out = subprocess.run(
        [sys.executable, "-c", _LOG_PROGRAM], env=env, capture_output=True, text=True, check=True
    ).stderr
    if fmt == "text":
        tails = [line.split(" ", 3)[3] for line in out.splitlines()]  # after date, time and level
        assert tails == [
            "voxcast.x: hello there",
            "voxcast.x: redis://:***@host/0 failed",
            "voxcast.x [job-7]: inside",
            "voxcast.x [job-7]: on a thread",
            "voxcast.x [req-9]: named",
            "voxcast.x: after",
        ]
        return
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(x["level"], x["logger"], x["msg"], x.get("request_id")) for x in lines] == [
        ("INFO", "voxcast.x", "hello there", None),
        ("WARNING", "voxcast.x", "redis://:***@host/0 failed", None),
        ("INFO", "voxcast.x", "inside", "job-7"),
        ("INFO", "voxcast.x", "on a thread", "job-7"),
        ("INFO", "voxcast.x", "named", "req-9"),
        ("INFO", "voxcast.x", "after", None),
    ]


def test_a_loading_process_reports_loading_then_warming_then_ready(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    from voxcast.metrics import Metrics
    from voxcast.storage.config import StorageConfig

    seen: list[str] = []

    class Spy(Metrics):
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "phase":
                seen.append(value)
            super().__setattr__(name, value)

    config = ServiceConfig(
        engine=EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=True),
        storage=StorageConfig(local_dir=str(tmp_path / "store"), local_fsync=False),
    )
    service = Service.load(config, Spy())
    try:
        assert seen == ["loading", "warming", "ready"]
        assert value(scrape_text(service.metrics.exposition()), "voxcast_warmup_seconds") > 0
    finally:
        service.close()


def test_a_cache_hit_reports_the_duration_of_its_audio(service: Service) -> None:
    req = {"text": "Cached words.", "voice": "ryan", "seed": 21, "max_frames": 5}
    first = service.synthesize(req)
    list(first)
    hit = service.synthesize(req)
    list(hit)
    assert first.result is not None and hit.result is not None
    assert hit.result.timing.cache_hit and not first.result.timing.cache_hit
    assert hit.result.timing.audio_s == pytest.approx(first.result.timing.audio_s) == pytest.approx(0.4)
    assert hit.result.duration_s == pytest.approx(0.4)
