"""Key functions are pure and no user input can address a path outside the store."""

from __future__ import annotations

import pytest

from voxcast.errors import InvalidRequest
from voxcast.storage import keys


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a/./b",
        "a//b",
        "a/",
        ".hidden",
        "a/.tmp/x",
        "a\\b",
        "a b",
        "a\x00b",
        "voices/\u00e9",
        "~/x",
        "x" * 600,
    ],
)
def test_validate_key_rejects_unsafe(bad: str) -> None:
    with pytest.raises(InvalidRequest):
        keys.validate_key(bad)


@pytest.mark.parametrize("good", ["a", "audio/v1/ab/abc.wav", "voices/v1/0123/vx_00.json", "A-b_c=d.e"])
def test_validate_key_accepts_safe(good: str) -> None:
    assert keys.validate_key(good) == good


def test_voice_id_is_deterministic_and_depends_on_every_input() -> None:
    a = keys.voice_id_for("model-a", "00" * 32, "hello", False)
    assert a == keys.voice_id_for("model-a", "00" * 32, "hello", False)
    assert keys.is_voice_id(a)
    others = {
        keys.voice_id_for("model-b", "00" * 32, "hello", False),
        keys.voice_id_for("model-a", "11" * 32, "hello", False),
        keys.voice_id_for("model-a", "00" * 32, "hullo", False),
        keys.voice_id_for("model-a", "00" * 32, "hello", True),
    }
    assert a not in others and len(others) == 4


def test_x_vector_only_ignores_ref_text() -> None:
    assert keys.voice_id_for("m", "00" * 32, "hello", True) == keys.voice_id_for("m", "00" * 32, None, True)


def test_voice_keys_reject_non_ids() -> None:
    with pytest.raises(InvalidRequest) as ei:
        keys.voice_keys("m", "../../etc/passwd")
    assert ei.value.field == "voice"
    vid = keys.voice_id_for("m", "00" * 32, None, False)
    prompt, meta = keys.voice_keys("m", vid)
    assert prompt.startswith(f"voices/v{keys.VOICE_SCHEMA}/{keys.model_hash('m')}/")
    assert prompt.endswith(".safetensors") and meta.endswith(".json")


def test_audio_key_shape() -> None:
    k = "ab" + "0" * 62
    assert keys.audio_key(k) == f"audio/v{keys.AUDIO_SCHEMA}/ab/{k}"
    with pytest.raises(ValueError):
        keys.audio_key("../x")
