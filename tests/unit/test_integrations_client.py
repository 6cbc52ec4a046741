"""What the agent-framework plug-ins share (voxcast.integrations.client): pure, no framework."""

from __future__ import annotations

from voxcast.integrations.client import error_text, language_name, socket_url, unspaced


def test_language_codes_and_names_map_to_voxcasts_names() -> None:
    assert [language_name(c) for c in ("en", "en-US", "pt_BR", "ZH", "english", "Japanese")] == [
        "english", "english", "portuguese", "chinese", "english", "japanese",
    ]  # fmt: skip
    assert language_name("sw") == "auto"  # a language the model does not speak


def test_socket_url_and_error_text() -> None:
    assert socket_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/v1/audio/speech/stream"
    assert socket_url("https://tts.example") == "wss://tts.example/v1/audio/speech/stream"
    assert error_text({"message": "unknown voice", "param": "voice"}) == "voice: unknown voice"
    assert error_text({"message": "voice: unknown voice", "param": "voice"}) == "voice: unknown voice"
    assert error_text({"message": "over capacity", "param": None}) == "over capacity"


def test_cjk_words_are_unspaced() -> None:
    assert unspaced("今日") and unspaced("す。") and not unspaced("Hello") and not unspaced("")
