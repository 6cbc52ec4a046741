"""Which voice a request is spoken in: a built-in speaker, an alias, a registered voice, reference audio.

A request names a voice (an alias of :data:`Service.voice_aliases
<voxcast.service.service.Service.voice_aliases>`, a model speaker or a registered voice id), brings
reference audio (registered on the fly, idempotently), or neither (then the service's default voice,
if any). The outcome is what the engine needs (a voice prompt, or the speaker it speaks) and what
the cache key and the result need (the voice's cache-key part, its registered id). Errors name the
field and say what would work.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from voxcast.engine.engine import Engine
from voxcast.engine.request import SynthesisRequest, is_url
from voxcast.engine.timing import Timing
from voxcast.errors import InvalidRequest, VoiceNotFound
from voxcast.service.ref_audio_url import fetch_ref_audio
from voxcast.storage.keys import is_voice_id
from voxcast.voices import VoiceRegistry

__all__ = ["check_task_type", "default_voice", "resolve_voice"]

_TASK_NAMES = {
    ours: theirs
    for theirs, ours in {"Base": "base", "CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}.items()
}

Resolved = tuple[Any, str, str | None, str | None]
"""(voice prompt or None, the voice's cache-key part, registered voice id or None, the built-in
speaker the engine speaks or None)."""


def default_voice(configured: str | None, engine: Engine, aliases: Mapping[str, str]) -> str | None:
    """The voice of a request that names none: ``configured`` (``config.default_voice``); unset:
    ``alloy``'s speaker (when ``aliases`` has it) on a model with named speakers that clones no
    voices, whose requests need one."""
    if configured is not None:
        return configured
    if engine.speakers and not engine.clones_voices:
        return "alloy" if "alloy" in aliases else engine.speakers[0]
    return None


def check_task_type(req: SynthesisRequest, engine: Engine) -> None:
    """A request's ``task_type`` (vLLM-Omni's) must be what the loaded model serves: a Qwen3-TTS
    checkpoint its own variant, Chatterbox Turbo (which clones voices) ``Base``.

    Raises:
        InvalidRequest: naming ``task_type`` and what the model serves.
    """
    if req.task_type is None:
        return
    served = engine.model_type
    fits = req.task_type == served or (
        req.task_type == "base" and served not in _TASK_NAMES and engine.clones_voices
    )
    if not fits:
        serves = _TASK_NAMES.get(served, "Base" if engine.clones_voices else served)
        raise InvalidRequest(
            f"task_type {_TASK_NAMES[req.task_type]} does not fit the loaded {served} model (it serves "
            f"task_type {serves})",
            field="task_type",
        )


def resolve_voice(
    req: SynthesisRequest,
    timing: Timing,
    *,
    engine: Engine,
    voices: VoiceRegistry[Any],
    aliases: Mapping[str, str],
    default: str | None,
    url_hosts: Collection[str] = (),
) -> Resolved:
    """The voice ``req`` is spoken in (see :data:`Resolved`); the time it took is ``timing.voice_ms``.

    Args:
        req: the request (its ``voice``, or its reference audio).
        timing: the request's timing record (voice cache hit, alias or default used, storage error).
        engine: the engine (its speakers, whether it clones voices).
        voices: the voice registry (registered voices, reference audio registered on the fly).
        aliases: voice names, in lower case.
        default: the voice of a request that names none and brings no reference audio, or None.

    Raises:
        InvalidRequest: reference audio on a model that cannot clone, or no voice where one is needed.
        VoiceNotFound: an unknown speaker or voice id.
    """
    t0 = time.perf_counter()
    check_task_type(req, engine)
    try:
        name = req.voice
        if name is None and req.ref_audio is None:
            name = default
            if name is not None:
                timing.extra["voice_default"] = name
        if name is not None:
            return _named_voice(name, timing, engine, voices, aliases)
        audio = (
            fetch_ref_audio(req.ref_audio, url_hosts)
            if req.ref_audio is not None and is_url(req.ref_audio)
            else req.ref_audio_bytes()
        )
        if audio is not None:
            if engine.cloning_refusal is not None:
                raise InvalidRequest(engine.cloning_refusal, field="ref_audio")
            reg = voices.ensure(audio, ref_text=req.ref_text, x_vector_only=req.x_vector_only)
            timing.voice_cache_hit = reg.cache_hit
            if reg.storage_error is not None:  # the prompt is usable; only persisting it failed
                timing.extra["voice_storage_error"] = str(reg.storage_error)
            return reg.prompt, reg.voice_id, reg.voice_id, None
        if engine.clones_voices and not engine.speakers:
            raise InvalidRequest(
                f"voice: this {engine.model_type} model has no built-in speakers; give "
                "ref_audio, or a registered voice id (POST /v1/audio/voices), or set "
                "VOXCAST_DEFAULT_VOICE to one",
                field="voice",
            )
        return None, "", None, None
    finally:
        timing.voice_ms = (time.perf_counter() - t0) * 1000


def _named_voice(
    given: str, timing: Timing, engine: Engine, voices: VoiceRegistry[Any], aliases: Mapping[str, str]
) -> Resolved:
    """:func:`resolve_voice` of a voice named by the request: an alias, a speaker or a voice id."""
    name = aliases.get(given.lower(), given)
    if name != given:
        timing.extra["voice_alias"] = given
    if name.lower() in engine.speakers:
        return None, name.lower(), None, name.lower()
    alias = f" (an alias of {name!r})" if name != given else ""
    if not engine.clones_voices:
        raise VoiceNotFound(
            f"unknown speaker {given!r}{alias}; this model has {list(engine.speakers)}",
            field="voice",
        )
    try:
        prompt, lru_hit = voices.lookup(name)
    except VoiceNotFound as e:
        hint = ""
        if not engine.speakers and not alias and not is_voice_id(given):  # a name, not an id
            hint = (
                "; this model has no built-in speakers: register a voice (POST /v1/audio/voices) "
                f"and name it with VOXCAST_VOICE_ALIASES={given.lower()}=<voice id>"
            )
        raise VoiceNotFound(f"{e.message}{alias}{hint}", field="voice") from None
    timing.voice_cache_hit = lru_hit
    return prompt, name, name, None
