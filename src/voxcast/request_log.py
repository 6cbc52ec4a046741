"""One log line per request at its end (logger ``voxcast.requests``, INFO), for every entry point.

Fields: ``request_id``, ``entry``, ``model``, ``voice`` (a speaker name or registered voice id; never
reference audio), ``text_chars`` and ``text_sha256`` (the first 16 hex digits; the text itself only with
``VOXCAST_LOG_TEXT=1``), ``outcome`` (as the metrics: ok, cache_hit, cancelled, runaway or an error
code) and the timing's figures. With ``VOXCAST_LOG_FORMAT=json`` the line is one JSON object carrying
these fields; as text it reads ``request <id> http ok ttfa_ms=.. total_ms=.. ...``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

__all__ = ["log_request"]

log = logging.getLogger("voxcast.requests")

_TIMING = (
    "ttfa_ms",
    "total_ms",
    "queue_wait_ms",
    "voice_ms",
    "prefill_ms",
    "frames",
    "chunks",
    "audio_s",
    "rtf",
    "stalls",
    "stall_ms",
    "cache_hit",
    "voice_cache_hit",
    "prefix_cache_hit",
    "finish_reason",
    "runaway",
    "pieces",
)


def request_fields(
    request_id: str, entry: str, model: str, request: Any, timing: Any, outcome: str
) -> dict[str, Any]:
    """The fields of one request's line (see the module docstring)."""
    text = getattr(request, "text", "") or ""
    fields: dict[str, Any] = {
        "event": "request",
        "request_id": request_id,
        "entry": entry,
        "model": model,
        "voice": getattr(request, "voice", None)
        or ("reference" if getattr(request, "ref_audio", None) else None),
        "text_chars": len(text),
        "text_sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16],
        "outcome": outcome,
    }
    if os.environ.get("VOXCAST_LOG_TEXT", "").strip().lower() in ("1", "true", "yes", "on"):
        fields["text"] = text
    if timing is not None:
        for name in _TIMING:
            value = getattr(timing, name, None)
            fields[name] = round(value, 2) if isinstance(value, float) else value
    return fields


def log_request(request_id: str, entry: str, model: str, request: Any, timing: Any, outcome: str) -> None:
    """Write the request's line (INFO on ``voxcast.requests``)."""
    if not log.isEnabledFor(logging.INFO):
        return
    fields = request_fields(request_id, entry, model, request, timing, outcome)
    figures = " ".join(f"{k}={fields[k]}" for k in ("ttfa_ms", "total_ms", "frames", "rtf") if k in fields)
    log.info("request %s %s %s %s", request_id, entry, outcome, figures, extra={"fields": fields})
