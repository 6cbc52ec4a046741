"""The JSON messages a RunPod job yields: audio chunks, the final summary, and errors.

Chunk protocol (one message per ``yield``; every value JSON-able, nothing binary):

``{"seq": 0, "audio": "<base64>", "format": "wav", "sample_rate": 24000, "t_ms": 212.4, "frames": 1,
"ts": 1767225600.123456}``
    ``seq`` counts messages from 0 without gaps; ``audio`` is a piece of the file in the requested
    format (the first WAV piece carries a streaming header), so base64-decoding and concatenating
    every ``audio`` in ``seq`` order gives the complete file; ``t_ms`` is when the engine emitted the
    chunk, in ms from the start of the request; ``frames`` the codec frames it holds (80 ms each;
    0 on the extra pieces of a chunk that was split to respect the size bound); ``ts`` the worker's
    wall clock (Unix s) when the message was yielded. A worker that fell behind merges chunks that
    are already waiting into one message (then ``t_ms`` is the newest one's and ``frames`` the sum).
``{"done": true, "seq": N, "audio_key": ..., "audio_url": ..., "timing": {...}, ...}``
    the last message: the synthesis result (request id, format, sample rate, content type, blob key
    and URL of the complete file, bytes, duration, timing, ``messages`` = chunk messages sent,
    ``t0_unix`` = wall clock of the ``t_ms`` origin, ``handler`` = the adapter's own timing), and
    for small non-streaming requests the whole file as base64 ``audio``.
``{"error": {"code": "invalid_request", "message": "...", "field": "text"}}``
    ends the job; in production the SDK sends ``{"error": str(value)}`` as its result and the platform
    marks it FAILED (runpod 1.12's local API server reports a generator's job COMPLETED regardless,
    with this message as the last output).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from voxcast.errors import VoxcastError

__all__ = ["ErrorPayload", "audio_messages", "error_message", "final_message"]


class ErrorPayload(dict[str, Any]):
    """A structured error whose ``str()`` is JSON.

    runpod 1.12 turns a yielded ``{"error": value}`` into ``{"error": str(value)}`` before POSTing it
    (``rp_job.handle_job``). For a plain dict that would be a Python repr; with this class the platform
    stores a JSON string that clients can parse, while in-process callers still get a dict.
    """

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)


def error_message(error: VoxcastError | Mapping[str, Any]) -> dict[str, Any]:
    """``{"error": {"code", "message", "field"?}}`` for a voxcast error (or an equivalent mapping)."""
    payload = error.to_dict() if isinstance(error, VoxcastError) else dict(error)
    return {"error": ErrorPayload(payload)}


def audio_messages(
    data: bytes,
    *,
    first_seq: int,
    format: str,
    sample_rate: int,
    t_ms: float,
    frames: int,
    max_bytes: int,
) -> list[dict[str, Any]]:
    """Messages carrying ``data``, split into pieces of at most ``max_bytes`` raw bytes.

    Pieces are cut at multiples of 4 bytes so that every piece of 16-bit PCM holds whole samples.

    Args:
        data: one encoded chunk (bytes in the response format).
        first_seq: ``seq`` of the first message.
        format: response format name.
        sample_rate: output sample rate.
        t_ms: the chunk's emit time from request start.
        frames: codec frames in the chunk (reported on its first piece).
        max_bytes: raw-byte bound per message (>= 4).

    Returns:
        zero messages for empty data, else ``ceil(len(data) / piece)`` messages.
    """
    piece = max(4, max_bytes - max_bytes % 4)
    out: list[dict[str, Any]] = []
    for i, start in enumerate(range(0, len(data), piece)):
        out.append(
            {
                "seq": first_seq + i,
                "audio": base64.b64encode(data[start : start + piece]).decode("ascii"),
                "format": format,
                "sample_rate": sample_rate,
                "t_ms": round(t_ms, 3),
                "frames": frames if i == 0 else 0,
            }
        )
    return out


def final_message(
    result: Mapping[str, Any],
    *,
    seq: int,
    messages: int,
    inline_audio: bytes | None = None,
    inline_content_type: str | None = None,
) -> dict[str, Any]:
    """The last message of a successful job.

    Args:
        result: the JSON-able synthesis result (``SynthesisResult.to_dict()``).
        seq: ``seq`` of this message (= number of chunk messages before it).
        messages: chunk messages sent before it.
        inline_audio: the complete file (as stored under ``audio_key``: WAV-wrapped for mulaw/alaw),
            for small non-streaming requests only.
        inline_content_type: its MIME type (``audio_content_type`` in the message).
    """
    out: dict[str, Any] = {"done": True, "seq": seq, **result, "messages": messages}
    if inline_audio is not None:
        out["audio"] = base64.b64encode(inline_audio).decode("ascii")
        out["audio_content_type"] = inline_content_type
    return out
