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


def main() -> int:
    """Run the endpoint type the environment asks for; returns the exit code."""
    try:
        kind = endpoint_type(os.environ)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if kind == "http":
        from voxcast.serving.http.main import main as http_main

        # a container's entrypoint: listen on every interface unless told otherwise
        os.environ.setdefault("VOXCAST_HOST", "0.0.0.0")
        return http_main([])
    from voxcast.logs import setup_logging
    from voxcast.serving.runpod.main import main as queue_main

    setup_logging()  # VOXCAST_LOG_LEVEL, default INFO; credentials in URLs redacted
    return queue_main()
