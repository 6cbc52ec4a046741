"""The RunPod queue worker's process: load and warm the service, then run the SDK's worker loop.

``handler.py`` at the repository root calls :func:`main`. Without ``RUNPOD_WEBHOOK_GET_JOB`` and
``--rp_serve_api`` (a developer's shell) one job from ``--test_input`` / ``test_input.json`` is run
through the real handler instead (:mod:`voxcast.serving.runpod.local`).

Graceful stop: on SIGTERM/SIGINT the SDK stops taking jobs (its own handler, which ours runs after)
and the process reports ``draining`` (``/metrics``); jobs in flight may finish within
``VOXCAST_DRAIN_S`` (30), then end with the error ``shutdown``. Once none is left and the SDK has
posted their results, the service is closed (queued voice writes reach the store) and the process
exits 0, without waiting for the SDK's job-take long-poll (up to 90 s) to return. The SDK installs its
signal handlers when its loop starts, after this module's code ran, so voxcast's are chained in front
of them when the first job arrives (a signal before any job has nothing to drain; the SDK's handler
alone then stops the worker).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voxcast.errors import InvalidRequest
from voxcast.serving.drain import Drain, drain_seconds
from voxcast.serving.exit import die, ends_process
from voxcast.serving.metrics_port import serve_metrics
from voxcast.serving.runpod.config import RunpodConfig
from voxcast.serving.runpod.handler import RunpodHandler
from voxcast.serving.runpod.local import check_local_job, is_local, run_local

__all__ = ["main", "service_env"]

log = logging.getLogger(__name__)

ENGINE_FAILURE_EXIT_DELAY_S = 2.0
RESULTS_GRACE_S = 10.0
"""After the drain, how long the SDK may take to post the last jobs' results before the process exits."""


# ------------------------------------------------------------------------ main
def _exit_soon() -> None:
    """Schedule the worker's exit (exit code 3) once the failed job's result had time to go out."""
    asyncio.get_running_loop().call_later(ENGINE_FAILURE_EXIT_DELAY_S, die, 3)


def _redis_client(url: str) -> Any:
    import redis

    client = redis.Redis.from_url(url, decode_responses=False, socket_timeout=5, socket_connect_timeout=5)
    client.ping()
    return client


def service_env(env: Mapping[str, str], config: RunpodConfig) -> dict[str, str]:
    """The environment the worker's service is built from: ``env`` with ``VOXCAST_MAX_ACTIVE``
    defaulting to the jobs the worker runs at once (the engine runs at most as many streams as the
    SDK runs jobs, so warm-up records those batch sizes only: 1 by default)."""
    return {**env, "VOXCAST_MAX_ACTIVE": env.get("VOXCAST_MAX_ACTIVE") or str(config.concurrency)}


@ends_process
def main(env: Mapping[str, str] | None = None) -> int:
    """Load and warm the service, then run the RunPod worker loop.

    Without ``RUNPOD_WEBHOOK_GET_JOB`` and ``--rp_serve_api`` (a developer's shell) one job from
    ``--test_input`` / ``test_input.json`` is run instead (:mod:`voxcast.serving.runpod.local`).

    Returns:
        the process exit code (the SDK's worker loop itself only returns on shutdown).
    """
    env = os.environ if env is None else env
    local = is_local(env, sys.argv[1:])
    if local:  # a developer's one-shot run: its job is checked before minutes of loading
        try:
            check_local_job(sys.argv[1:], Path.cwd())
        except InvalidRequest as e:
            log.error("bad test input: %s: %s", e.field, e.message)
            return 2
        except ValueError as e:
            log.error("%s", e)
            return 2
    try:
        from voxcast.service import Service, ServiceConfig

        config = RunpodConfig.from_env(env)
        service = Service.load(ServiceConfig.from_env(service_env(env, config)), serve_metrics(env))
        redis_client = _redis_client(config.redis_url) if config.redis_url else None
    except Exception:
        log.exception("voxcast runpod worker: start-up failed; exiting")
        die(1)
        return 1  # only reached when die is patched out in tests
    handler = RunpodHandler(service, config, redis_client)
    handler.on_engine_failure = _exit_soon

    def draining() -> None:
        service.metrics.phase = "draining"
        threading.Thread(target=_exit_after_drain, args=(handler,), name="voxcast-drain", daemon=True).start()

    handler.drain = Drain(drain_seconds(env), on_begin=draining)
    handler.on_job = lambda: _chain_signals(handler.drain)
    if local:
        return run_local(handler, sys.argv[1:], Path.cwd())
    _start_sdk(handler, config)
    service.close()  # the SDK stopped on a signal that came before any job (no drain thread ran)
    return 0


def _chain_signals(drain: Drain | None) -> None:
    """Put ``drain.begin`` in front of the SDK's SIGTERM/SIGINT handlers (once; main thread only)."""
    if drain is None or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if getattr(previous, "voxcast_drain", False):
            continue

        def on_signal(signum: int, frame: Any, previous: Any = previous) -> None:
            drain.begin()
            if callable(previous):
                previous(signum, frame)

        on_signal.voxcast_drain = True  # type: ignore[attr-defined]
        signal.signal(sig, on_signal)


def _exit_after_drain(handler: RunpodHandler) -> None:
    """Wait for the jobs in flight (cancelled at the drain deadline) and for the SDK to post their
    results, close the service, exit 0."""
    from runpod.serverless.modules.worker_state import JobsProgress

    drain = handler.drain
    assert drain is not None
    drain.wait_idle(drain.deadline_s + 30.0)
    deadline = time.monotonic() + RESULTS_GRACE_S
    while JobsProgress().get_job_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    log.info("voxcast runpod worker: drained; closing the service")
    handler.service.close()
    die(0)


def _start_sdk(handler: RunpodHandler, config: RunpodConfig) -> None:
    import runpod
    from runpod.serverless.modules.rp_logger import RunPodLogger

    RunPodLogger().set_level(config.sdk_log_level)

    @runpod.serverless.register_fitness_check
    def voxcast_engine_ready() -> None:
        """Production start-up check (runs before the first job-take)."""
        if not handler.service.engine.alive:
            raise RuntimeError("the voxcast engine thread is not running")

    log.info(
        "voxcast runpod worker: starting SDK (concurrency=%d, aggregate=%s)",
        config.concurrency,
        config.aggregate,
    )
    runpod.serverless.start(
        {
            "handler": handler.handle,
            "return_aggregate_stream": config.aggregate,
            "concurrency_modifier": config.concurrency_modifier,
        }
    )
