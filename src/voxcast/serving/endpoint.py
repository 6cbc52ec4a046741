"""One image, both RunPod endpoint types: ``handler.py`` picks the queue handler or the HTTP server.

``VOXCAST_ENDPOINT_TYPE``: ``queue`` (default: the RunPod serverless handler for queue endpoints) or
``http`` (the HTTP server for load-balancing endpoints, on ``PORT`` with ``/ping`` on ``PORT_HEALTH``,
listening on every interface unless ``VOXCAST_HOST`` says otherwise).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

__all__ = ["endpoint_type", "main"]

_TYPES = {"queue": "queue", "http": "http", "load_balancer": "http", "lb": "http"}


def endpoint_type(env: Mapping[str, str]) -> str:
    """``queue`` or ``http``.

    Raises:
        ValueError: an unknown ``VOXCAST_ENDPOINT_TYPE`` (named in the message).
    """
    raw = env.get("VOXCAST_ENDPOINT_TYPE", "").strip().lower() or "queue"
    if raw not in _TYPES:
        raise ValueError(f"VOXCAST_ENDPOINT_TYPE must be queue or http (load_balancer), not {raw!r}")
    return _TYPES[raw]


USAGE = """\
usage: python handler.py [RunPod's flags below]

voxcast's RunPod entrypoint. VOXCAST_ENDPOINT_TYPE picks what runs: queue (default; the serverless
handler of a queue endpoint) or http (the HTTP server of a load-balancing endpoint, on PORT with
/ping on PORT_HEALTH). Every other setting is a VOXCAST_* variable (docs/configuration.md).

Run in a shell (no RUNPOD_WEBHOOK_GET_JOB and no --rp_serve_api), it runs one job, from --test_input
or test_input.json, through the real handler and exits 0 (done), 1 (failed) or 2 (bad input);
--audio_out FILE writes its audio there. With --rp_serve_api it serves RunPod's local test API (every
local run is job local-test, mirrored to Redis when VOXCAST_REDIS_URL is set). Docs: docs/deployment.md.
"""


def _print_help() -> None:
    print(USAGE)
    try:
        from runpod.serverless import parser
    except ImportError:  # a client-only install
        print("(RunPod's own flags: install the serve extra to list them)")
        return
    print(parser.format_help())


def main() -> int:
    """Run the endpoint type the environment asks for; returns the exit code (``--help``: the
    usage, with RunPod's flags, and 0: nothing is loaded or run)."""
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        _print_help()
        return 0
    try:
        kind = endpoint_type(os.environ)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if kind == "http":
        from voxcast.serving.http.main import main as http_main

        # a container's entrypoint: listen on every interface unless told otherwise
        os.environ.setdefault("VOXCAST_HOST", "0.0.0.0")
        # callers reach it by the endpoint's name (<ENDPOINT_ID>.api.runpod.ai) through RunPod's load
        # balancer, which asks for the RunPod API key; no browser shares the worker's loopback
        os.environ.setdefault("VOXCAST_ALLOWED_HOSTS", "*")
        return http_main([])
    from voxcast.logs import setup_logging
    from voxcast.serving.runpod.main import main as queue_main

    setup_logging()  # VOXCAST_LOG_LEVEL, default INFO; credentials in URLs redacted
    return queue_main()
