"""Idle unload (``idle_unload_s``): the weights go after a quiet spell, the next request loads them
again (once, however many arrive together) and reports itself cold; a long stream is never unloaded
under it; the service drops its voice prompts and reports the phase.

An engine may also unload between its construction and a test's first request (a slow machine):
every count is taken while the engine is unloaded, when nothing but a request can change it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fixtures.polling import wait_until
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.errors import EngineUnavailable
from voxcast.service import Service, ServiceConfig
from voxcast.storage.local import LocalBlobStore

Factory = Callable[[str], Path]


def _say(engine: Engine, seed: int = 5, frames: int = 6) -> tuple[np.ndarray, Any]:
    stream = engine.synthesize({"text": "Hello there.", "voice": "ryan", "seed": seed, "max_frames": frames})
    pcm = np.concatenate([c.pcm for c in stream])
    return pcm, stream.timing


def test_unload_after_idle_then_reload_cold_with_the_same_audio(tiny_model_dir: Factory) -> None:
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, idle_unload_s=1.0)
    )
    phases: list[str] = []
    engine.on_phase = phases.append
    try:
        first, _ = _say(engine)
        unloads = engine.unloads  # the model is loaded now, and stays so for a second at least
        wait_until(lambda: engine.unloads == unloads + 1)
        assert not engine.loaded and phases[-1] == "unloaded"
        phases.clear()
        loads = engine.loads
        assert engine.last_unload is not None and engine.last_unload["rss_loaded_mb"] > 0
        with pytest.raises(EngineUnavailable, match="unloaded"):
            _ = engine.model
        assert engine.identity and engine.speakers  # constants stay known while unloaded
        again, t2 = _say(engine)
        assert t2.cold and t2.load_ms > 0 and engine.loads == loads + 1 and engine.loaded
        assert phases[:2] == ["loading", "ready"]
        assert np.array_equal(first, again)  # the same weights, the same seed: the same audio
    finally:
        engine.close()


def test_no_unload_during_a_warm_up_longer_than_the_idle_limit(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warm-up pauses between its requests (here 2.5 s in one step, more than ``idle_unload_s``): the
    model must not be unloaded under it (it was, on a GPU: the load then failed)."""
    from voxcast.models.qwen3_tts.model import Qwen3TTS

    fill = Qwen3TTS.fill_speaker_prefixes

    def slow_fill(self: Qwen3TTS) -> None:
        fill(self)
        time.sleep(2.5)

    monkeypatch.setattr(Qwen3TTS, "fill_speaker_prefixes", slow_fill)
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", idle_unload_s=1.0)
    )
    try:
        # the load returned (an unload under warm-up made it raise) and never had to load again
        assert engine.warmup_ms >= 2500 and engine.loads == 1
    finally:
        engine.close()


def test_requests_arriving_together_after_an_unload_load_it_once(tiny_model_dir: Factory) -> None:
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, idle_unload_s=1.0)
    )
    try:
        _say(engine)
        wait_until(lambda: not engine.loaded and engine.unloads >= 1)
        loads = engine.loads
        results: list[Any] = [None] * 4
        barrier = threading.Barrier(4)

        def one(i: int) -> None:
            barrier.wait()
            results[i] = _say(engine, seed=i)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert engine.loads == loads + 1  # one reload for the four
        assert all(r is not None and r[1].cold and r[1].frames == 6 for r in results)
    finally:
        engine.close()


def test_a_long_stream_is_never_unloaded_under_it(tiny_model_dir: Factory) -> None:
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, idle_unload_s=0.5)
    )
    phases: list[tuple[float, str]] = []
    engine.on_phase = lambda phase: phases.append((time.monotonic(), phase))
    try:  # 400 frames: ~2.8 s on a 2-core Zen 4, several times the idle limit on any CPU it runs on
        stream = engine.synthesize({"text": "Hello there.", "voice": "ryan", "seed": 1, "max_frames": 400})
        frames, t_first, t_last = 0, 0.0, 0.0
        for chunk in stream:
            t_first = t_first or time.monotonic()
            frames += chunk.frames
        t_last = time.monotonic()
        assert frames == 400 and stream.timing.finish_reason == "max_frames"
        assert t_last - t_first > 0.5, "the stream must outlast the idle limit for this test to mean anything"
        assert not [p for t, p in phases if p == "unloaded" and t_first <= t <= t_last]
        # and the idle clock starts when the stream ends, not when it started (a late check is
        # possible under load, an early one is not)
        wait_until(lambda: time.monotonic() > t_last + 0.25)
        assert not [t for t, p in phases if p == "unloaded" and t < t_last + 0.4]
    finally:
        engine.close()


def test_the_service_reports_the_phases_and_drops_voice_prompts(
    tiny_model_dir: Factory, tmp_path: Path
) -> None:
    from tests.fixtures.engines import reference_wav

    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("base")), device="cpu", warmup=False, idle_unload_s=1.0)
    )
    service = Service.assemble(
        ServiceConfig(store_audio=False), engine, LocalBlobStore(tmp_path / "s", fsync=False)
    )
    try:
        voice = service.register_voice(reference_wav(24000, 2.0), ref_text="A test voice.")
        assert service.voices.cached_bytes > 0
        wait_until(lambda: service.metrics.phase == "unloaded")
        assert service.voices.cached_bytes == 0 and not engine.loaded
        loads = engine.loads
        stream = service.synthesize(
            {"text": "Hi.", "voice": voice, "max_frames": 3, "response_format": "pcm"}
        )
        audio = b"".join(c.data for c in stream)
        assert len(audio) == 3 * 3840
        assert stream.result is not None and stream.result.timing.cold
        assert service.metrics.phase == "ready" and engine.loads == loads + 1
    finally:
        service.close()


@pytest.mark.gpu
def test_an_unload_on_cuda_gives_the_device_memory_back(tiny_model_dir: Factory) -> None:
    import torch

    torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    engine = Engine.load(
        EngineConfig(
            model=str(tiny_model_dir("custom_voice")), device="cuda", warmup=False, idle_unload_s=1.0
        )
    )
    try:
        wait_until(lambda: engine.unloads == 1, timeout_s=60, what="the first idle unload")
        # what the engine held is given back, the allocator's cache included
        assert torch.cuda.memory_allocated() <= allocated and torch.cuda.memory_reserved() <= reserved
        _, timing = _say(engine)
        assert timing.cold and torch.cuda.memory_allocated() > allocated
    finally:
        engine.close()
