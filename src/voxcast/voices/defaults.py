"""Voices out of the box: OpenAI's voice names mapped to a model's speakers, and the default voice.

Every OpenAI client sends one of OpenAI's voice names (``alloy``, ``nova``, ...), so a model with
named speakers answers them without any configuration: each name is an alias of one of the model's
speakers (:func:`openai_aliases`). The deployment's own aliases (``VOXCAST_VOICE_ALIASES``) replace
these for the names they give; ``VOXCAST_OPENAI_VOICES=off`` drops them.

The mapping is fixed and documented (docs/configuration.md): OpenAI's voices described as female go
round-robin over the model's female speakers, the others over its male speakers, each in the order
below; a model whose speakers are not in those lists (e.g. Chatterbox Turbo's ``default``) gets
its speakers round-robin in its own order. A name that is itself one of the model's speakers is left
to the speaker. A model without named speakers (a Base model) gets no mapping: it speaks registered
voices, which a deployment names with ``VOXCAST_VOICE_ALIASES``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["OPENAI_VOICES", "effective_aliases", "openai_aliases"]

_OPENAI_FEMALE = ("nova", "shimmer", "coral", "sage", "marin")
_OPENAI_OTHER = ("alloy", "echo", "onyx", "fable", "ash", "ballad", "verse", "cedar")
OPENAI_VOICES: tuple[str, ...] = tuple(sorted(_OPENAI_FEMALE + _OPENAI_OTHER))
"""OpenAI's built-in voice names (as the ``openai`` SDK documents them for ``audio.speech``)."""

_FEMALE_SPEAKERS = ("vivian", "serena", "ono_anna", "sohee")
"""Qwen3-TTS CustomVoice's female speakers, in the order OpenAI's female voices take them."""
_MALE_SPEAKERS = ("ryan", "aiden", "uncle_fu", "dylan", "eric")
"""Qwen3-TTS CustomVoice's male speakers (English first), in the order the other voices take them."""


def _round_robin(names: Sequence[str], speakers: Sequence[str]) -> dict[str, str]:
    return {name: speakers[i % len(speakers)] for i, name in enumerate(names)} if speakers else {}


def openai_aliases(speakers: Sequence[str]) -> dict[str, str]:
    """``{OpenAI voice name: speaker}`` for a model's speakers (lower case); empty without speakers."""
    own = [s.lower() for s in speakers]
    if not own:
        return {}
    female = [s for s in _FEMALE_SPEAKERS if s in own]
    male = [s for s in _MALE_SPEAKERS if s in own]
    if female and male:
        out = {**_round_robin(_OPENAI_FEMALE, female), **_round_robin(_OPENAI_OTHER, male)}
    else:
        out = _round_robin(OPENAI_VOICES, own)
    return {name: speaker for name, speaker in out.items() if name not in own}


def effective_aliases(
    configured: Mapping[str, str], speakers: Sequence[str], openai_voices: bool = True
) -> dict[str, str]:
    """The aliases a service answers: OpenAI's names (``openai_voices``) under the configured ones.

    Args:
        configured: ``VOXCAST_VOICE_ALIASES`` (keys lower case).
        speakers: the model's named speakers.
        openai_voices: map OpenAI's voice names to the speakers (``VOXCAST_OPENAI_VOICES``).
    """
    defaults = openai_aliases(speakers) if openai_voices else {}
    # a configured alias may name an OpenAI name (support=alloy): it means that name's speaker
    return {**defaults, **{k: defaults.get(v.lower(), v) for k, v in configured.items()}}
