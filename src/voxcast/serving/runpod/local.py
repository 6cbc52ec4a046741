"""Local one-shot runs of the RunPod handler: ``python handler.py [--test_input JSON] [--audio_out F]``.

runpod 1.12's own local mode (no ``RUNPOD_WEBHOOK_GET_JOB``, no ``--rp_serve_api``) does not iterate
generator handlers: it prints the generator object and exits 0. Here the job (``--test_input`` or
``./test_input.json``) is run through the real handler instead; every message is summarised on
stderr, the final message (without audio) is printed as JSON on stdout, and ``--audio_out`` writes
the concatenated audio. Exit code 0 on success, 1 on an error message.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from voxcast.serving.runpod.handler import RunpodHandler

__all__ = ["is_local", "load_job", "run_local"]

log = logging.getLogger(__name__)


def is_local(env: Mapping[str, str], argv: Sequence[str]) -> bool:
    """True when the SDK would run its (generator-blind) local test mode."""
    serving = "--rp_serve_api" in argv or bool(env.get("RUNPOD_REALTIME_PORT"))
    return not serving and not env.get("RUNPOD_WEBHOOK_GET_JOB")


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="handler.py", add_help=False)
    p.add_argument("--test_input", default=None, help="job JSON ({'input': {...}})")
    p.add_argument("--audio_out", default=None, help="write the concatenated audio here")
    args, _ = p.parse_known_args(list(argv))
    return args


def load_job(test_input: str | None, cwd: Path) -> dict[str, Any]:
    """The job to run: ``--test_input`` JSON, else ``cwd/test_input.json``.

    Raises:
        ValueError: no job, unparsable JSON, or no ``input`` key.
    """
    if test_input is None:
        path = cwd / "test_input.json"
        if not path.exists():
            raise ValueError("no --test_input given and no test_input.json here")
        test_input = path.read_text(encoding="utf-8")
    try:
        job = json.loads(test_input)
    except json.JSONDecodeError as e:
        raise ValueError(f"test input is not JSON: {e}") from e
    if not isinstance(job, dict) or "input" not in job:
        raise ValueError('test input must be a JSON object with an "input" key')
    job.setdefault("id", "local-test")
    return job


async def _drive(handler: RunpodHandler, job: Mapping[str, Any], audio_out: Path | None) -> int:
    parts: list[bytes] = []
    async for message in handler.handle(job):
        if "error" in message:
            print(json.dumps(message), file=sys.stdout)
            return 1
        audio = message.get("audio")
        if audio:
            parts.append(base64.b64decode(audio))
        if message.get("done"):
            print(json.dumps({k: v for k, v in message.items() if k != "audio"}, indent=2))
        elif "seq" in message:
            log.info("message %d: %d bytes at t=%.1f ms", message["seq"], len(parts[-1]), message["t_ms"])
        else:
            print(json.dumps(message, indent=2))
    if audio_out is not None and parts:
        audio_out.write_bytes(b"".join(parts))
        log.info("wrote %s (%d bytes)", audio_out, sum(map(len, parts)))
    return 0


def run_local(handler: RunpodHandler, argv: Sequence[str], cwd: Path) -> int:
    """Run one job from the command line through ``handler``; returns the process exit code."""
    args = _args(argv)
    try:
        job = load_job(args.test_input, cwd)
    except ValueError as e:
        log.error("%s", e)
        return 2
    return asyncio.run(_drive(handler, job, Path(args.audio_out) if args.audio_out else None))
