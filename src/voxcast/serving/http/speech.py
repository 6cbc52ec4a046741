"""OpenAI's ``POST /v1/audio/speech`` body -> voxcast's request schema (and the stream format).

OpenAI's fields: ``model`` (any name: one model per server), ``input`` (the text), ``voice`` (a name,
or ``{"id": ...}`` for a registered voice), ``instructions`` (voxcast's ``instruct``) are the
request schema's own (:class:`voxcast.engine.request.SynthesisRequest`, at every entry point); this
adds OpenAI's defaults: ``response_format`` (OpenAI's default ``mp3``; every OpenAI format, each streamed), ``speed``
(0.25-4.0: the audio is time-stretched with its pitch kept, :mod:`voxcast.audio.stretch`, since the
models have no rate control) and ``stream_format`` (``audio`` or ``sse``). Every other
field of voxcast's schema (``seed``, ``language``, ``sample_rate``, ``cache``...) is accepted as an
extension and validated by the schema, which names the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxcast.errors import InvalidRequest

__all__ = ["STREAM_FORMATS", "speech_request"]

STREAM_FORMATS = ("audio", "sse")


def speech_request(body: Any) -> tuple[dict[str, Any], str]:
    """``(voxcast request mapping, stream format)`` for an OpenAI speech request body.

    Raises:
        InvalidRequest: naming the OpenAI field at fault (the schema checks the rest later).
    """
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object", field="request")
    out = dict(body)
    stream_format = out.pop("stream_format", "audio")
    if stream_format not in STREAM_FORMATS:
        raise InvalidRequest(
            f"stream_format must be audio or sse, not {stream_format!r}", field="stream_format"
        )
    out.setdefault("response_format", "mp3")
    return out, stream_format
