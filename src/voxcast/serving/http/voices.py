"""``/v1/audio/voices``: register reference audio as a voice, list, show and delete voices.

A voice is registered from an upload (``multipart/form-data``: ``audio`` file, optional
``ref_text`` transcript and ``x_vector_only``) or from JSON (``{"ref_audio": base64, "ref_text"}``);
the answer carries its id, which requests then name as ``voice`` (or ``{"id": ...}``). Voices live in
the voice registry (the blob store), so every worker on the same store sees them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import APIRouter
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse

from voxcast.errors import VoiceNotFound
from voxcast.service import Service
from voxcast.serving.http.body import check_length, read_json
from voxcast.serving.http.errors import HttpError
from voxcast.voices.registry import VoiceInfo

__all__ = ["voice_routes"]

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}


def _voice(info: VoiceInfo) -> dict[str, Any]:
    out = info.to_dict()
    return {"id": out.pop("voice_id"), "object": "voice", **out}


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise HttpError(400, f"{name} must be true or false", code="invalid_request", field=name)


def _text(value: Any, name: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise HttpError(400, f"{name} must be a string", code="invalid_request", field=name)
    return value


async def _upload(request: Request, limit: int) -> tuple[bytes, str | None, bool]:
    """(audio bytes, transcript, x_vector_only) from a multipart form or a JSON body."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        if not request.headers.get("content-length", "").isdigit():  # file parts have no size cap
            raise HttpError(411, "a multipart upload needs a Content-Length", code="length_required")
        check_length(request, limit)
        form = await request.form(max_files=1, max_fields=8, max_part_size=limit)
        audio = form.get("audio") or form.get("file")
        if not isinstance(audio, UploadFile):
            raise HttpError(
                400, "upload the reference as the file field 'audio'", code="invalid_request", field="audio"
            )
        data = await audio.read()
        return (
            data,
            _text(form.get("ref_text"), "ref_text"),
            _flag(form.get("x_vector_only", ""), "x_vector_only"),
        )
    body = await read_json(request, limit)
    if not isinstance(body, dict):
        raise HttpError(
            400, "the request body must be a JSON object", code="invalid_request", field="request"
        )
    raw = body.get("ref_audio")
    if not isinstance(raw, str) or not raw:
        raise HttpError(
            400, "ref_audio (base64 audio) is required", code="invalid_request", field="ref_audio"
        )
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise HttpError(
            400, "ref_audio is not valid base64", code="invalid_request", field="ref_audio"
        ) from None
    return (
        data,
        _text(body.get("ref_text"), "ref_text"),
        _flag(body.get("x_vector_only", False), "x_vector_only"),
    )


def voice_routes(get_service: Callable[[], Service], max_body_bytes: int) -> APIRouter:
    """The voice routes, answering from the service ``get_service`` returns (503 while it loads)."""
    router = APIRouter()

    @router.get("/audio/voices")
    async def list_voices() -> dict[str, Any]:
        service = get_service()
        voices = await anyio.to_thread.run_sync(service.voices.list_voices)
        aliases = [
            {"id": alias, "object": "voice", "alias_of": voice}
            for alias, voice in sorted(service.config.voice_aliases.items())
        ]
        return {"object": "list", "data": [_voice(v) for v in voices] + aliases}

    @router.post("/audio/voices", status_code=201)
    async def register(request: Request) -> JSONResponse:
        service = get_service()
        if service.engine.cloning_refusal is not None:
            raise HttpError(400, service.engine.cloning_refusal, code="invalid_request", field="audio")
        audio, ref_text, x_vector_only = await _upload(request, max_body_bytes)
        if not audio:
            raise HttpError(400, "the reference audio is empty", code="invalid_request", field="audio")
        voice_id = await anyio.to_thread.run_sync(service.register_voice, audio, ref_text, x_vector_only)
        info = await anyio.to_thread.run_sync(service.voices.info, voice_id)
        return JSONResponse(_voice(info), status_code=201)

    @router.get("/audio/voices/{voice_id}")
    async def show(voice_id: str) -> dict[str, Any]:
        service = get_service()
        try:
            return _voice(await anyio.to_thread.run_sync(service.voices.info, voice_id))
        except VoiceNotFound as e:
            raise VoiceNotFound(e.message, field="voice_id") from None

    @router.delete("/audio/voices/{voice_id}")
    async def delete(voice_id: str) -> dict[str, Any]:
        service = get_service()
        if service.voices.is_builtin(voice_id):
            raise HttpError(
                400, f"{voice_id!r} is a built-in speaker", code="invalid_request", field="voice_id"
            )
        try:
            existed = await anyio.to_thread.run_sync(service.voices.delete, voice_id)
        except VoiceNotFound as e:  # not a voice id at all
            raise VoiceNotFound(e.message, field="voice_id") from None
        if not existed:
            raise HttpError(
                404, f"voice {voice_id!r} is not registered", code="voice_not_found", field="voice_id"
            )
        return {"id": voice_id, "object": "voice", "deleted": True}

    return router
