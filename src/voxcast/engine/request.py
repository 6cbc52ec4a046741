"""The one request schema shared by every entry point (CLI, RunPod handler, RQ jobs).

:func:`parse_request` turns a JSON-like mapping into a :class:`SynthesisRequest` or raises
:class:`~voxcast.errors.InvalidRequest` naming the offending field. Model-dependent checks (is this
speaker known, can this model clone a voice) happen in the engine, which knows the model.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import unicodedata
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from voxcast.audio.formats import NATIVE_SAMPLE_RATE, SUPPORTED_SAMPLE_RATES, AudioFormat, check_format_rate
from voxcast.audio.stretch import check_speed
from voxcast.errors import InvalidRequest
from voxcast.ids import REQUEST_ID_RE, REQUEST_ID_RULE, check_request_id, request_id_for
from voxcast.models.sampling import SamplingParams
from voxcast.text.normalize import normalize_text

__all__ = [
    "LANGUAGE_CODES",
    "MAX_TEXT_CHARS",
    "REQUEST_ID_RE",
    "TASK_TYPES",
    "SamplingParams",
    "SynthesisRequest",
    "check_request_id",
    "parse_open_request",
    "parse_request",
    "request_id_for",
]

MAX_TEXT_CHARS = 5000
"""Longest accepted text (characters). Longer input should be split by the caller (a prompt library, or one request per part)."""

MAX_REF_AUDIO_BYTES = 20 * 1024 * 1024
"""Largest inline reference audio (decoded bytes)."""

LANGUAGE_CODES = {
    "en": "english",
    "zh": "chinese",
    "de": "german",
    "es": "spanish",
    "fr": "french",
    "it": "italian",
    "ja": "japanese",
    "ko": "korean",
    "pt": "portuguese",
    "ru": "russian",
}
"""ISO 639-1 codes of the languages the models speak, read as their names (``"en"`` is ``english``)."""

TASK_TYPES = {"base": "base", "customvoice": "custom_voice", "voicedesign": "voice_design"}
"""vLLM-Omni's ``task_type`` values (any case, ``_`` and ``-`` ignored) -> the checkpoint variant."""

#: vLLM-Omni's names of voxcast's fields (a migrating client's body works unchanged).
_VLLM_OMNI_NAMES = {
    "non_streaming_mode": "non_streaming_text",
    "x_vector_only_mode": "x_vector_only",
    "max_new_tokens": "max_frames",
    "initial_codec_chunk_frames": "first_chunk_frames",
    "speaker": "voice",
}

G711_SAMPLE_RATE = 8000
"""The ``sample_rate`` of ``mulaw`` and ``alaw`` when a request names none (a telephone line's)."""
_G711 = frozenset({AudioFormat.MULAW.value, AudioFormat.ALAW.value})


class SynthesisRequest(BaseModel):
    """One text-to-speech request.

    Exactly one voice source applies: ``voice`` (a named speaker of a CustomVoice model, or a
    registered voice id), ``ref_audio`` (+ optional ``ref_text``) for cloning on a Base model, or
    neither (VoiceDesign models, which take ``instruct``).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    text: str = Field(..., alias="input", description="text to speak (OpenAI alias: input)")
    voice: str | None = Field(None, max_length=128)
    ref_audio: str | None = Field(
        None, description="reference audio file: base64, a data: URI, or an http(s) URL the server allows"
    )
    ref_text: str | None = Field(None, max_length=2000)
    x_vector_only: bool = Field(False, description="clone from the speaker vector only (no ICL)")
    instruct: str | None = Field(None, max_length=2000)
    language: str = Field("auto", max_length=32)
    response_format: AudioFormat = AudioFormat.WAV
    sample_rate: int = Field(NATIVE_SAMPLE_RATE, description="Hz (default 24000; 8000 for mulaw and alaw)")
    speed: float = Field(1.0, description="speaking rate, 0.25-4.0 (pitch kept: voxcast.audio.stretch)")
    stream: bool = True
    first_chunk_frames: int | None = Field(None, ge=1, le=64)
    chunk_frames: int | None = Field(None, ge=1, le=256)
    non_streaming_text: bool | None = Field(
        None, description="put the whole text in the prefill (default: the model's default per mode)"
    )
    max_frames: int | None = Field(None, ge=2, le=8192)
    sampling: SamplingParams = SamplingParams()
    cache: bool = True
    word_timestamps: bool = Field(
        False, description="report each word's estimated start and end (voxcast.audio.word_times)"
    )
    request_id: str | None = None
    task_type: str | None = Field(
        None,
        description="vLLM-Omni's task_type (base, custom_voice, voice_design): checked against the model",
    )

    @model_validator(mode="before")
    @classmethod
    def _vllm_omni_fields(cls, data: Any) -> Any:
        """vLLM-Omni's speech fields under their own names, at every entry point: each is voxcast's
        field of the same meaning (``non_streaming_mode`` is ``non_streaming_text``,
        ``x_vector_only_mode`` ``x_vector_only``, ``max_new_tokens`` ``max_frames`` (one codec frame
        per token, as vLLM-Omni counts them), ``initial_codec_chunk_frames`` ``first_chunk_frames``,
        ``speaker`` ``voice``), and ``stream_format`` (``audio`` or ``sse``: what an HTTP response
        streams; elsewhere it changes nothing). Both names with different values are refused."""
        if not isinstance(data, Mapping) or not (_VLLM_OMNI_NAMES.keys() | {"stream_format"}) & data.keys():
            return data
        out = dict(data)
        if "stream_format" in out:
            fmt = out.pop("stream_format")
            if fmt is not None and fmt not in ("audio", "sse"):
                raise PydanticCustomError(
                    "stream_format",
                    f"stream_format must be audio or sse, not {fmt!r}",
                    {"field": "stream_format"},
                )
        for theirs, ours in _VLLM_OMNI_NAMES.items():
            if theirs not in out:
                continue
            value = out.pop(theirs)
            if value is None:
                continue
            if ours in out and out[ours] is not None and out[ours] != value:
                raise PydanticCustomError(
                    "duplicate",
                    f"{theirs} ({value!r}) and {ours} ({out[ours]!r}) say different things: give one",
                    {"field": theirs},
                )
            if theirs == "max_new_tokens" and (
                isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= 8192
            ):
                raise PydanticCustomError(
                    "max_new_tokens",
                    f"max_new_tokens must be an integer 2-8192 (codec frames, 12.5 a second); got {value!r}",
                    {"field": "max_new_tokens"},
                )
            out[ours] = value
        return out

    @model_validator(mode="before")
    @classmethod
    def _lift_flat_sampling(cls, data: Any) -> Any:
        """Accept sampling fields at the top level too (``{"seed": 1}`` as well as nested)."""
        if not isinstance(data, Mapping):
            return data
        flat = {k: data[k] for k in SamplingParams.model_fields if k in data}
        if not flat:
            return data
        out = {k: v for k, v in data.items() if k not in flat}
        if not isinstance(out.get("sampling") or {}, Mapping):
            raise PydanticCustomError(
                "sampling", "sampling must be an object when sampling fields are also given at the top level",
                {"field": "sampling"},
            )  # fmt: skip
        nested = dict(out.get("sampling") or {})
        for key in flat.keys() & nested.keys():
            if not _same(flat[key], nested[key]):
                raise PydanticCustomError(
                    "sampling",
                    f"{key} is given twice with different values (top level and in sampling): give it once",
                    {"field": key},
                )
        nested.update({k: v for k, v in flat.items() if v is not None or k not in nested})
        out["sampling"] = nested
        return out

    @model_validator(mode="before")
    @classmethod
    def _openai_fields(cls, data: Any) -> Any:
        """OpenAI's speech fields, at every entry point (an OpenAI body works as a RunPod input, a
        WebSocket config or a queued job): ``model`` (any name: one model per server),
        ``instructions`` (``instruct``) and ``voice`` as ``{"id": "<voice id>"}``."""
        if not isinstance(data, Mapping):
            return data
        if "model" not in data and "instructions" not in data and not isinstance(data.get("voice"), Mapping):
            return data
        out = dict(data)
        model = out.pop("model", None)
        if model is not None and not isinstance(model, str):
            raise PydanticCustomError("model", "model must be a string (any name)", {"field": "model"})
        if "instructions" in out:
            if out.get("instruct") is not None:
                raise PydanticCustomError(
                    "instructions", "give instructions or instruct, not both", {"field": "instructions"}
                )
            out["instruct"] = out.pop("instructions")
        voice = out.get("voice")
        if isinstance(voice, Mapping):
            if set(voice) != {"id"} or not isinstance(voice["id"], str):
                raise PydanticCustomError(
                    "voice", 'voice as an object must be {"id": "<voice id>"}', {"field": "voice.id"}
                )
            out["voice"] = voice["id"]
        return out

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        """Text the codecs cannot carry (a lone surrogate), in any top-level field (``model`` and the
        others read before the fields are), named before it reaches them. Defined last: pydantic runs
        the last ``before`` validator first."""
        if isinstance(data, Mapping):
            for key, value in data.items():
                if isinstance(value, str) and not _is_utf8(value):
                    raise PydanticCustomError(
                        "unicode", "contains invalid Unicode (a lone surrogate)", {"field": str(key)}
                    )
        return data

    @model_validator(mode="before")
    @classmethod
    def _telephone_rate(cls, data: Any) -> Any:
        """G.711 (``mulaw``, ``alaw``) is a telephone line's 8 kHz unless ``sample_rate`` is given."""
        g711 = isinstance(data, Mapping) and str(data.get("response_format", "")) in _G711
        if g711 and "sample_rate" not in data:
            return {**data, "sample_rate": G711_SAMPLE_RATE}
        return data

    @field_validator("text")
    @classmethod
    def _text(cls, v: str) -> str:
        """The text as spoken and as keyed in the audio cache: :func:`voxcast.text.normalize_text`."""
        if len(v) > MAX_TEXT_CHARS:
            raise ValueError(f"text has {len(v)} characters; the limit is {MAX_TEXT_CHARS}")
        v = normalize_text(v)
        if not any(unicodedata.category(ch)[0] in "LNPS" for ch in v):  # ZWJ/ZWNJ and marks alone say nothing
            raise ValueError("text has nothing to speak (empty, whitespace or invisible characters only)")
        return v

    @field_validator("request_id")
    @classmethod
    def _request_id(cls, v: str | None) -> str | None:
        if v is not None and not REQUEST_ID_RE.match(v):
            raise ValueError(f"must be {REQUEST_ID_RULE}")
        return v

    @field_validator("language")
    @classmethod
    def _language(cls, v: str) -> str:
        """Any case (``English``, ``english``), or the ISO 639-1 code (``en``)."""
        v = v.strip().lower() or "auto"
        return LANGUAGE_CODES.get(v.split("-")[0] if len(v) in (2, 5) else v, v)

    @field_validator("task_type")
    @classmethod
    def _task_type(cls, v: str | None) -> str | None:
        if v is None:
            return None
        kind = TASK_TYPES.get(v.strip().lower().replace("_", "").replace("-", ""))
        if kind is None:
            raise ValueError(f"task_type must be Base, CustomVoice or VoiceDesign, not {v!r}")
        return kind

    @field_validator("voice", "ref_text")
    @classmethod
    def _blank_is_none(cls, v: str | None) -> str | None:
        return v if v is None or v.strip() else None

    @field_validator("instruct")
    @classmethod
    def _instruct(cls, v: str | None) -> str | None:
        return None if v is None else normalize_text(v) or None

    @field_validator("sample_rate")
    @classmethod
    def _sample_rate(cls, v: int) -> int:
        if v not in SUPPORTED_SAMPLE_RATES:
            raise ValueError(f"sample_rate {v} is not one of {list(SUPPORTED_SAMPLE_RATES)}")
        return v

    @field_validator("speed", mode="before")
    @classmethod
    def _speed(cls, v: Any) -> float:
        if isinstance(v, str):  # a CSV manifest's cell, as the other numeric fields take it
            with contextlib.suppress(ValueError):
                v = float(v.strip())
        return check_speed(v)

    @field_validator("ref_audio")
    @classmethod
    def _ref_audio(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if is_url(v):  # fetched by the service where its settings allow the host
            if len(v) > 2048:
                raise ValueError("ref_audio URL is longer than 2048 characters")
            return v.strip()
        payload = v.split(",", 1)[1] if v.startswith("data:") else v
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError("ref_audio is not valid base64") from e
        if not raw:
            raise ValueError("ref_audio is empty")
        if len(raw) > MAX_REF_AUDIO_BYTES:
            raise ValueError(f"ref_audio is larger than {MAX_REF_AUDIO_BYTES} bytes")
        return payload

    @model_validator(mode="after")
    def _format_rate(self) -> SynthesisRequest:
        try:
            check_format_rate(self.response_format, self.sample_rate)
        except ValueError as e:
            raise PydanticCustomError("format_rate", str(e), {"field": "sample_rate"}) from e
        return self

    @model_validator(mode="after")
    def _one_voice_source(self) -> SynthesisRequest:
        if self.voice is not None and self.ref_audio is not None:
            raise PydanticCustomError(
                "voice_source", "give either voice or ref_audio, not both", {"field": "voice"}
            )
        if self.ref_text is not None and self.ref_audio is None:
            raise PydanticCustomError("ref_text", "ref_text needs ref_audio", {"field": "ref_text"})
        return self

    def ref_audio_bytes(self) -> bytes | None:
        """The decoded reference audio file, if any.

        Raises:
            InvalidRequest: ``ref_audio`` is a URL (the service fetches those where allowed:
                :mod:`voxcast.service.ref_audio_url`).
        """
        if self.ref_audio is not None and is_url(self.ref_audio):
            raise InvalidRequest(
                "ref_audio: a URL is fetched only by a server whose VOXCAST_REF_AUDIO_URL_HOSTS names its host",
                field="ref_audio",
            )
        return None if self.ref_audio is None else base64.b64decode(self.ref_audio)


def is_url(value: str) -> bool:
    """Whether a ``ref_audio`` value is an http(s) URL (not base64 or a data: URI)."""
    head = value.lstrip()[:8].lower()
    return head.startswith("http://") or head.startswith("https://")


def _same(a: Any, b: Any) -> bool:
    """Whether a sampling field given twice says the same (None: not given; ``"0.5"`` is ``0.5``)."""
    if a is None or b is None or a == b:
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _field_of(err: Mapping[str, Any]) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    return ".".join(loc) if loc else "request"


def parse_request(data: Mapping[str, Any] | SynthesisRequest) -> SynthesisRequest:
    """Validate ``data`` into a request.

    Raises:
        InvalidRequest: with ``field`` set to the first offending field (dotted path).
    """
    if isinstance(data, SynthesisRequest):
        return data
    if not isinstance(data, Mapping):
        raise InvalidRequest("request must be a JSON object", field="request")
    try:
        return SynthesisRequest.model_validate(dict(data))
    except ValidationError as e:
        first = e.errors()[0]
        field = str((first.get("ctx") or {}).get("field") or _field_of(first))
        if field == "input":
            field = "text"
        head, _, rest = field.partition(".")
        if head == "sampling" and "sampling" not in data and rest.split(".")[0] in data:
            field = rest  # sent at the top level (the flat form): name it as sent
        msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise InvalidRequest(f"{field}: {msg}", field=field) from e


def parse_open_request(data: Mapping[str, Any] | SynthesisRequest) -> tuple[SynthesisRequest, str]:
    """Validate the settings of a stream whose text arrives in pieces (``Engine.open``).

    ``text`` may be missing or empty there. Returns the request, whose ``text`` stays ``""`` (the
    stream's text feed holds the text), and the text given up front, as given (raw, possibly "").

    Raises:
        InvalidRequest: as :func:`parse_request`.
    """
    if isinstance(data, SynthesisRequest):
        return data.model_copy(update={"text": ""}), data.text
    if not isinstance(data, Mapping):
        raise InvalidRequest("request must be a JSON object", field="request")
    given = dict(data)
    text = given.pop("text", None)
    alias = given.pop("input", None)
    initial = text if text is not None else alias
    if initial is not None and not isinstance(initial, str):
        raise InvalidRequest("text: must be a string", field="text")
    req = parse_request({**given, "text": "-"})
    return req.model_copy(update={"text": ""}), initial or ""
