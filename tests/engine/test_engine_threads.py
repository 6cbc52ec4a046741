"""One-off torch work runs on short-lived threads (voxcast.engine.threads), so the scheduler thread
keeps the only lasting OpenMP team."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf

from voxcast.audio.reference import synthetic_reference_audio
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.engine.threads import on_fresh_thread

Factory = Callable[[str], Path]


def test_returns_the_result_from_another_thread_that_has_ended() -> None:
    seen: list[threading.Thread] = []

    def work() -> int:
        seen.append(threading.current_thread())
        return 42

    assert on_fresh_thread(work) == 42
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()


def test_reraises_the_exception() -> None:
    def boom() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        on_fresh_thread(boom)


def test_engine_builds_voices_off_the_callers_thread(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from voxcast.models.qwen3_tts.model import Qwen3TTS

    loaded_on: list[str] = []
    real_load = Qwen3TTS.from_pretrained

    def load(*a: Any, **kw: Any) -> Any:
        loaded_on.append(threading.current_thread().name)
        return real_load(*a, **kw)

    monkeypatch.setattr(Qwen3TTS, "from_pretrained", load)
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("base")), device="cpu", warmup=False))
    try:
        assert loaded_on == ["voxcast-oneoff"]
        built_on: list[str] = []
        real_make = engine.model.make_voice_prompt

        def make(*a: Any, **kw: Any) -> Any:
            built_on.append(threading.current_thread().name)
            return real_make(*a, **kw)

        monkeypatch.setattr(engine.model, "make_voice_prompt", make)
        buf = io.BytesIO()
        sf.write(buf, synthetic_reference_audio(engine.sample_rate), engine.sample_rate, format="WAV")
        voice = engine.create_voice(buf.getvalue(), "This is a reference recording.")
        assert voice is not None and built_on == ["voxcast-oneoff"]
    finally:
        engine.close()
