"""``--request JSON``: extra request fields given as one JSON object (``synth`` and ``enqueue``), merged
over the flags, so any field of the request schema (vLLM-Omni's and OpenAI's names included) can be
given on the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from voxcast.errors import InvalidRequest

__all__ = ["add_request_flag", "request_fields"]


def add_request_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--request",
        help='extra request fields as a JSON object, merged last (e.g. \'{"seed": 5, "task_type": '
        '"CustomVoice"}\'; docs/http.md lists every field)',
    )


def request_fields(value: str | None) -> dict[str, Any]:
    """The object ``--request`` holds ({} when not given).

    Raises:
        InvalidRequest: not JSON, or not an object (field ``request``).
    """
    if not value:
        return {}
    try:
        extra = json.loads(value)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"--request is not valid JSON: {e}", field="request") from e
    if not isinstance(extra, dict):
        raise InvalidRequest("--request must be a JSON object", field="request")
    return extra
