"""Voices out of the box and the settings that change them, without a model: OpenAI's names mapped to
speakers, configured aliases over them, the default-voice and exposure settings."""

from __future__ import annotations

import pytest

from voxcast.service import ServiceConfig
from voxcast.serving.http.config import HttpConfig
from voxcast.serving.http.exposure import Exposure
from voxcast.voices.defaults import OPENAI_VOICES, effective_aliases, openai_aliases

QWEN = ("serena", "vivian", "uncle_fu", "ryan", "aiden", "ono_anna", "sohee", "eric", "dylan")


def test_openai_names_cover_every_name_and_only_the_models_speakers() -> None:
    mapping = openai_aliases(QWEN)
    assert set(mapping) == set(OPENAI_VOICES) and set(mapping.values()) <= set(QWEN)
    assert (mapping["alloy"], mapping["nova"], mapping["shimmer"], mapping["echo"]) == (
        "ryan",
        "vivian",
        "serena",
        "aiden",
    )
    assert set(openai_aliases(("default",)).values()) == {"default"}  # Chatterbox Turbo's one voice
    assert openai_aliases(()) == {}  # a Base model: no speakers, no names
    assert "echo" not in openai_aliases(("echo", "ryan"))  # a model's own speaker stays the speaker


def test_configured_aliases_replace_the_defaults_and_may_name_them() -> None:
    aliases = effective_aliases({"alloy": "sohee", "support": "nova"}, QWEN)
    assert aliases["alloy"] == "sohee" and aliases["support"] == "vivian" and aliases["nova"] == "vivian"
    assert effective_aliases({"support": "vx_" + "0" * 32}, QWEN, openai_voices=False) == {
        "support": "vx_" + "0" * 32
    }


def test_service_settings_for_voices() -> None:
    config = ServiceConfig.from_env({"VOXCAST_OPENAI_VOICES": "off", "VOXCAST_DEFAULT_VOICE": " nova "})
    assert config.openai_voices is False and config.default_voice == "nova"
    assert ServiceConfig.from_env({}).default_voice is None and ServiceConfig.from_env({}).openai_voices
    with pytest.raises(ValueError, match="VOXCAST_DEFAULT_VOICE"):
        ServiceConfig.from_env({"VOXCAST_DEFAULT_VOICE": "../ryan"})


def test_exposure_settings() -> None:
    safe = HttpConfig.from_env({}).exposure
    assert safe.cors_origins == () and safe.docs is None and safe.metrics_auth
    assert safe.docs_on(api_key=None) and not safe.docs_on(api_key="k")
    opened = Exposure.from_env(
        {
            "VOXCAST_CORS_ORIGINS": "https://app.example.com/, http://localhost:3000",
            "VOXCAST_HTTP_DOCS": "on",
            "VOXCAST_METRICS_AUTH": "off",
        }
    )
    assert opened.cors_origins == ("https://app.example.com", "http://localhost:3000")
    assert opened.docs_on(api_key="k") and not opened.metrics_auth
    assert opened.allows("http://localhost:3000", "127.0.0.1:8000")
    assert not opened.allows("http://evil.example", "127.0.0.1:8000")
    assert safe.allows("http://127.0.0.1:8000", "127.0.0.1:8000")  # the server's own pages
    with pytest.raises(ValueError, match="VOXCAST_CORS_ORIGINS"):
        Exposure.from_env({"VOXCAST_CORS_ORIGINS": "https://app.example.com/path"})
