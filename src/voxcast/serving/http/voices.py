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
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import APIRouter
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse

from voxcast.engine.request import SynthesisRequest
from voxcast.errors import InvalidRequest, VoiceNotFound
from voxcast.service import Service
from voxcast.serving.http.body import check_length, read_json
from voxcast.serving.http.errors import HttpError
from voxcast.voices.registry import VoiceInfo, VoiceLabel

__all__ = ["MAX_NAME_CHARS", "voice_routes"]

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}

MAX_NAME_CHARS = 128
"""Longest voice ``name`` and ``consent`` id (and the longest voice id a path may name)."""
_MAX_REF_TEXT = next(
    m.max_length for m in SynthesisRequest.model_fields["ref_text"].metadata if hasattr(m, "max_length")
)
"""Longest transcript: the speech request's ``ref_text`` limit (2000), so every later use of the
voice stays within what a request may carry."""
_AUDIO_FIELDS = ("audio", "audio_sample", "file")
"""The reference file's form field: voxcast's ``audio``, the ``openai`` SDK's ``audio_sample``."""


class _NotUtf8(MultiPartException):
    def __init__(self, field: str) -> None:
        super().__init__(f"{field} is not valid UTF-8")
        self.field = field


class _Utf8MultiPart(MultiPartParser):
    """Starlette's multipart parser, refusing a text field that is not UTF-8 (Starlette reads such
    a field as Latin-1, so ``name`` and ``ref_text`` were stored as mojibake where the JSON path
    refuses the same bytes)."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            try:
                bytes(part.data).decode("utf-8")
            except UnicodeDecodeError as e:
                raise _NotUtf8(part.field_name[:64] or "request") from e
        super().on_part_end()


def _bad(message: str, field: str) -> HttpError:
    return HttpError(400, message, code="invalid_request", field=field)


def _voice(info: VoiceInfo) -> dict[str, Any]:
    """A voice as OpenAI's API shows one (``object`` ``audio.voice``, ``name``, ``created_at``,
    ``type``), with voxcast's provenance fields besides."""
    out = info.to_dict()
    voice_id = out.pop("voice_id")
    out.pop("consent", None)
    return {
        "id": voice_id,
        "object": "audio.voice",
        "name": out.pop("name", voice_id),
        "created_at": int(out.pop("created_at", 0)),
        "type": "builtin" if info.builtin else "audio_sample",
        **out,
    }


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(f"{name} must be true or false", name)


def _text(value: Any, name: str, limit: int) -> str | None:
    """An optional text field: a string of at most ``limit`` characters, valid Unicode."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _bad(f"{name} must be a string", name)
    if len(value) > limit:
        raise _bad(f"{name} has {len(value)} characters; the limit is {limit}", name)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"{name} contains invalid Unicode (a lone surrogate)", name) from None
    return value


def _kind(value: Any) -> None:
    """OpenAI's ``type``: only ``audio_sample`` (a voice from a prompt needs a voice-design model)."""
    if value not in (None, "", "audio_sample"):
        raise _bad("type must be audio_sample (voices are made from an audio sample here)", "type")


def _b64_audio(raw: Any) -> bytes:
    """JSON's ``ref_audio``: base64, or a ``data:`` URI as speech requests accept it."""
    if not isinstance(raw, str) or not raw:
        raise _bad("ref_audio (base64 audio) is required", "ref_audio")
    payload = raw.split(",", 1)[1] if raw.startswith("data:") else raw
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("ref_audio is not valid base64 (or a data: URI)", "ref_audio") from None


@dataclass(frozen=True)
class _Upload:
    audio: bytes
    audio_field: str
    ref_text: str | None
    x_vector_only: bool
    label: VoiceLabel


def _fields(get: Callable[[str], Any], audio: bytes, audio_field: str) -> _Upload:
    """The upload's other fields, checked, from a form's or a JSON object's ``get``."""
    _kind(get("type"))
    return _Upload(
        audio,
        audio_field,
        _text(get("ref_text"), "ref_text", _MAX_REF_TEXT),
        _flag(get("x_vector_only") or False, "x_vector_only"),
        (_text(get("name"), "name", MAX_NAME_CHARS), _text(get("consent"), "consent", MAX_NAME_CHARS)),
    )


async def _upload(request: Request, limit: int) -> _Upload:
    """The reference audio and its fields, from a multipart form (voxcast's fields or the ``openai``
    SDK's ``audio_sample``, ``name``, ``consent``) or a JSON body (``ref_audio`` base64)."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        if not request.headers.get("content-length", "").isdigit():  # file parts have no size cap
            raise HttpError(411, "a multipart upload needs a Content-Length", code="length_required")
        check_length(request, limit)
        parser = _Utf8MultiPart(
            request.headers, request.stream(), max_files=1, max_fields=8, max_part_size=limit
        )
        try:
            form = await parser.parse()
        except _NotUtf8 as e:
            raise _bad(f"{e.field}: not valid UTF-8 text", e.field) from e
        except MultiPartException as e:
            raise _bad(f"the multipart body is malformed: {e.message}", "request") from e
        try:
            field = next((f for f in _AUDIO_FIELDS if isinstance(form.get(f), UploadFile)), None)
            if field is None:
                raise _bad("upload the reference as the file field 'audio' (or 'audio_sample')", "audio")
            upload = form[field]
            assert isinstance(upload, UploadFile)
            return _fields(form.get, await upload.read(), field)
        finally:
            await form.close()
    body = await read_json(request, limit)
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", "request")
    return _fields(body.get, _b64_audio(body.get("ref_audio")), "ref_audio")


def _path_id(voice_id: str) -> str:
    """A voice id from the path, bounded before any message quotes it."""
    if len(voice_id) > MAX_NAME_CHARS:
        raise VoiceNotFound(
            f"unknown voice: the id has {len(voice_id)} characters (at most {MAX_NAME_CHARS})",
            field="voice_id",
        )
    return voice_id


def voice_routes(get_service: Callable[[], Service], max_body_bytes: int) -> APIRouter:
    """The voice routes, answering from the service ``get_service`` returns (503 while it loads)."""
    router = APIRouter()

    @router.get("/audio/voices")
    async def list_voices() -> dict[str, Any]:
        service = get_service()
        voices = await anyio.to_thread.run_sync(service.voices.list_voices)
        aliases = [
            {"id": alias, "object": "audio.voice", "name": alias, "type": "alias", "alias_of": voice}
            for alias, voice in sorted(service.voice_aliases.items())
        ]
        # what each registration recorded (name, created_at), but not its transcript: that is read
        # one voice at a time (GET /audio/voices/{id})
        listed = [{k: v for k, v in _voice(info).items() if k != "ref_text"} for info in voices]
        return {"object": "list", "data": listed + aliases}

    @router.post("/audio/voices", status_code=201)
    async def register(request: Request) -> JSONResponse:
        service = get_service()
        if service.engine.cloning_refusal is not None:
            raise _bad(service.engine.cloning_refusal, "audio")
        up = await _upload(request, max_body_bytes)
        if not up.audio:
            raise _bad("the reference audio is empty", up.audio_field)
        try:
            voice_id = await anyio.to_thread.run_sync(
                service.register_voice, up.audio, up.ref_text, up.x_vector_only, up.label
            )
        except InvalidRequest as e:  # the audio's problems, named by the field it came in
            if e.field == "ref_audio":
                e.field = up.audio_field
            raise
        info = await anyio.to_thread.run_sync(service.voices.info, voice_id)
        return JSONResponse(_voice(info), status_code=201)

    @router.get("/audio/voices/{voice_id}")
    async def show(voice_id: str) -> dict[str, Any]:
        service = get_service()
        try:
            return _voice(await anyio.to_thread.run_sync(service.voices.info, _path_id(voice_id)))
        except VoiceNotFound as e:
            raise VoiceNotFound(e.message, field="voice_id") from None

    @router.delete("/audio/voices/{voice_id}")
    async def delete(voice_id: str) -> dict[str, Any]:
        service = get_service()
        if service.voices.is_builtin(voice_id):
            raise _bad(f"{voice_id!r} is a built-in speaker", "voice_id")
        try:
            existed = await anyio.to_thread.run_sync(service.voices.delete, _path_id(voice_id))
        except VoiceNotFound as e:  # not a voice id at all
            raise VoiceNotFound(e.message, field="voice_id") from None
        if not existed:
            raise HttpError(
                404, f"voice {voice_id!r} is not registered", code="voice_not_found", field="voice_id"
            )
        return {"id": voice_id, "object": "audio.voice.deleted", "deleted": True}

    return router
