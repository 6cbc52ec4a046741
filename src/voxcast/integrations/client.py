"""What every agent-framework plug-in needs to know about a voxcast server, with no framework imported:
the output rates it produces, its language names, its error objects, its socket's address and how
its word timestamps join back into text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SAMPLE_RATES", "STREAM_PATH", "error_text", "language_name", "socket_url", "unspaced"]

#: Output rates the server produces (it resamples from the model's 24 kHz).
SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)

STREAM_PATH = "/v1/audio/speech/stream"
"""The WebSocket that takes text as an LLM writes it (docs/http.md)."""

_LANGUAGES = {
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


def language_name(code: str) -> str:
    """A language code (``en``, ``en-US``, ``pt_BR``) or one of voxcast's names -> voxcast's name
    (``english``); a language the model does not speak: ``auto``."""
    lowered = code.strip().lower()
    if lowered in _LANGUAGES.values():
        return lowered
    return _LANGUAGES.get(lowered.replace("_", "-").split("-")[0], "auto")


def error_text(error: Mapping[str, Any]) -> str:
    """An OpenAI-style error object as one line naming its field (once: the server's messages
    often start with it already)."""
    message = str(error.get("message"))
    param = error.get("param")
    if not param or message.startswith(f"{param}:"):
        return message
    return f"{param}: {message}"


def socket_url(base_url: str, path: str = STREAM_PATH) -> str:
    """The server's ``base_url`` (``http(s)://host:port``, without ``/v1``) -> the WebSocket's
    ``ws(s)://`` address."""
    url = base_url.rstrip("/") + path
    return "ws" + url[len("http") :] if url.startswith("http") else url


def unspaced(word: str) -> bool:
    """Whether ``word`` is of a script written without spaces (CJK: one character a word), so it
    joins its neighbours without one."""
    return bool(word) and ord(word[0]) >= 0x2E80
