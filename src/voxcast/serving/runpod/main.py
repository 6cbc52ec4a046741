"""The RunPod queue worker's process: load and warm the service, then run the SDK's worker loop.

``handler.py`` at the repository root calls :func:`main`. Without ``RUNPOD_WEBHOOK_GET_JOB`` and
``--rp_serve_api`` (a developer's shell) one job from ``--test_input`` / ``test_input.json`` is run
through the real handler instead (:mod:`voxcast.serving.runpod.local`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voxcast.serving.exit import die
from voxcast.serving.metrics_port import serve_metrics
from voxcast.serving.runpod.config import RunpodConfig
from voxcast.serving.runpod.handler import RunpodHandler
from voxcast.serving.runpod.local import is_local, run_local

__all__ = ["main"]

log = logging.getLogger(__name__)

ENGINE_FAILURE_EXIT_DELAY_S = 2.0


# ------------------------------------------------------------------------ main
def _exit_soon() -> None:
    """Schedule the worker's exit (exit code 3) once the failed job's result had time to go out."""
    asyncio.get_running_loop().call_later(ENGINE_FAILURE_EXIT_DELAY_S, die, 3)


def _redis_client(url: str) -> Any:
    import redis

    client = redis.Redis.from_url(url, decode_responses=False, socket_timeout=5, socket_connect_timeout=5)
    client.ping()
    return client


def main(env: Mapping[str, str] | None = None) -> int:
    """Load and warm the service, then run the RunPod worker loop.

    Without ``RUNPOD_WEBHOOK_GET_JOB`` and ``--rp_serve_api`` (a developer's shell) one job from
    ``--test_input`` / ``test_input.json`` is run instead (:mod:`voxcast.serving.runpod.local`).

    Returns:
        the process exit code (the SDK's worker loop itself only returns on shutdown).
    """
    env = os.environ if env is None else env
    try:
        from voxcast.service import Service, ServiceConfig

        config = RunpodConfig.from_env(env)
        service = Service.load(ServiceConfig.from_env(env), serve_metrics(env))
        redis_client = _redis_client(config.redis_url) if config.redis_url else None
    except Exception:
        log.exception("voxcast runpod worker: start-up failed; exiting")
        die(1)
        return 1  # only reached when die is patched out in tests
    handler = RunpodHandler(service, config, redis_client)
    handler.on_engine_failure = _exit_soon
    if is_local(env, sys.argv[1:]):
        return run_local(handler, sys.argv[1:], Path.cwd())
    _start_sdk(handler, config)
    return 0


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
