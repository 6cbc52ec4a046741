"""Service.check_voice (a WebSocket config's voice, checked before any text): an unknown voice is
refused as the request would be; a store that does not answer now is no reason to refuse it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from voxcast.engine.request import parse_request
from voxcast.errors import StorageError, VoiceNotFound
from voxcast.service import service as service_module
from voxcast.service.service import Service


def _check(monkeypatch: pytest.MonkeyPatch, error: Exception | None, **fields: Any) -> list[str]:
    seen: list[str] = []

    def resolve(request: Any, timing: Any, **_: Any) -> None:
        seen.append(request.voice)
        if error is not None:
            raise error

    monkeypatch.setattr(service_module, "resolve_voice", resolve)
    stub = SimpleNamespace(
        engine=None, voices=None, voice_aliases={}, default_voice=lambda: None,
        config=SimpleNamespace(ref_audio_url_hosts=frozenset()),
    )  # fmt: skip
    Service.check_voice(stub, parse_request({"text": "x", **fields}))  # type: ignore[arg-type]
    return seen


def test_an_unknown_voice_is_refused_and_a_silent_store_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(VoiceNotFound):
        _check(monkeypatch, VoiceNotFound("no voice 'vx_1'", field="voice"), voice="vx_1")
    assert _check(monkeypatch, StorageError("S3: read timed out"), voice="vx_1") == ["vx_1"]
    assert _check(monkeypatch, None, voice="ryan") == ["ryan"]
