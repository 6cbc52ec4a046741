"""Local one-shot runs of the RunPod handler: ``python handler.py [--test_input JSON] [--audio_out F]``.

runpod 1.12's own local mode (no ``RUNPOD_WEBHOOK_GET_JOB``, no ``--rp_serve_api``) does not iterate
generator handlers: it prints the generator object and exits 0. Here the job (``--test_input`` or
``./test_input.json``) is run through the real handler instead; every message is summarised on
stderr, the final message (without audio) is printed as JSON on stdout, and ``--audio_out`` writes
the concatenated audio.

The job is read and checked before the model loads (:func:`check_local_job`): no job, a job that is
not JSON, a synthesis request that does not validate or an ``--audio_out`` in a missing directory
ends the run at once with exit code 2. (The SDK itself, in this mode without ``test_input.json``,
logs ``test_input.json not found, exiting.`` and exits 1, after voxcast has loaded and warmed.)
Exit codes: 0 success; 2 bad input (found before loading, or an error message whose code blames the
input: ``invalid_request``, ``voice_not_found``, ...); 1 any other error message.
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

from voxcast.engine.request import parse_request
from voxcast.errors import INPUT_ERROR_CODES, InvalidRequest
from voxcast.serving.runpod.handler import RunpodHandler

__all__ = ["check_local_job", "is_local", "load_job", "run_local"]

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
            raise ValueError(
                f"nothing to run: no --test_input given and no test_input.json in {cwd} (a one-shot local "
                "run; RunPod sets RUNPOD_WEBHOOK_GET_JOB in production, --rp_serve_api starts a local API)"
            )
        test_input = path.read_text(encoding="utf-8")
    try:
        job = json.loads(test_input)
    except json.JSONDecodeError as e:
        raise ValueError(f"test input is not JSON: {e}") from e
    if not isinstance(job, dict) or "input" not in job:
        raise ValueError('test input must be a JSON object with an "input" key')
    job.setdefault("id", "local-test")
    return job


def check_local_job(argv: Sequence[str], cwd: Path) -> dict[str, Any]:
    """The job of a one-shot run, read and checked before anything loads.

    A synthesis request is validated with the shared schema (what needs the model, such as whether a
    speaker exists, is checked when it runs); ``--audio_out`` must be in an existing directory.

    Raises:
        ValueError: no job, unparsable JSON, no ``input`` key, or an ``--audio_out`` that cannot be written.
        InvalidRequest: the synthesis request does not validate (naming the field).
    """
    args = _args(argv)
    job = load_job(args.test_input, cwd)
    data = job["input"]
    if not isinstance(data, Mapping):
        raise InvalidRequest("input must be a JSON object", field="input")
    if data.get("action", "synthesize") == "synthesize":
        parse_request({k: v for k, v in data.items() if k != "action"})
    if args.audio_out is not None:
        parent = (cwd / args.audio_out).parent
        if not parent.is_dir():
            raise ValueError(f"--audio_out: no such directory: {parent}")
    return job


async def _drive(handler: RunpodHandler, job: Mapping[str, Any], audio_out: Path | None) -> int:
    parts: list[bytes] = []
    async for message in handler.handle(job):
        if "error" in message:
            print(json.dumps(message), file=sys.stdout)
            error = message["error"]
            return 2 if isinstance(error, Mapping) and error.get("code") in INPUT_ERROR_CODES else 1
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
