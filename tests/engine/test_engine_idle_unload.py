"""Idle unload (``idle_unload_s``): the weights go after a quiet spell, the next request loads them
again (once, however many arrive together) and reports itself cold; a long stream is never unloaded
under it; the service drops its voice prompts and reports the phase.

The engine's idle clock (``time.monotonic`` in engine.py and scheduler.py) is an :class:`IdleClock`
that stands still unless a test moves it, so nothing unloads before a test says the limit has passed,
however slow or loaded the host; a test waits for the scheduler's idle checks by counting them."""

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
from voxcast.engine import engine as engine_module
from voxcast.engine import scheduler as scheduler_module
from voxcast.engine.engine import Engine
from voxcast.errors import EngineUnavailable
from voxcast.service import Service, ServiceConfig
from voxcast.storage.local import LocalBlobStore

Factory = Callable[[str], Path]


class IdleClock:
    """Stands in for the ``time`` module of the engine and its scheduler: ``monotonic()`` is
    :attr:`now`, which only the test moves; the rest is the real module's. Counts the scheduler's idle
    checks (one a round)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.checks = 0
        self._checked = threading.Condition()
        for module in (engine_module, scheduler_module):
            monkeypatch.setattr(module, "time", self)
        check = Engine._maybe_unload

        def counted(engine: Engine) -> None:
            check(engine)
            with self._checked:
                self.checks += 1
                self._checked.notify_all()

        monkeypatch.setattr(Engine, "_maybe_unload", counted)

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def wait_checks(self) -> None:
        """Wait until the scheduler has made an idle check that began after this call."""
        with self._checked:
            target = self.checks + 2  # the one under way may have read the clock before
            assert self._checked.wait_for(lambda: self.checks >= target, timeout=30), "no idle check"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> IdleClock:
    return IdleClock(monkeypatch)


def _say(engine: Engine, seed: int = 5, frames: int = 6) -> tuple[np.ndarray, Any]:
    stream = engine.synthesize({"text": "Hello there.", "voice": "ryan", "seed": seed, "max_frames": frames})
    pcm = np.concatenate([c.pcm for c in stream])
    return pcm, stream.timing


def test_unload_after_idle_then_reload_cold_with_the_same_audio(
    tiny_model_dir: Factory, clock: IdleClock
) -> None:
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, idle_unload_s=1.0)
    )
    phases: list[str] = []
    engine.on_phase = phases.append
    try:
        first, _ = _say(engine)
        clock.wait_checks()
        assert engine.loaded and engine.unloads == 0  # idle, but not for a second yet
        clock.now += 1.0
        wait_until(lambda: engine.unloads == 1)
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
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch, clock: IdleClock
) -> None:
    """Warm-up pauses between its requests (here 10 s by the idle clock in one step, more than
    ``idle_unload_s``, while the scheduler checks): the model must not be unloaded under it (it was,
    on a GPU: the load then failed)."""
    from voxcast.models.qwen3_tts.model import Qwen3TTS

    fill = Qwen3TTS.fill_speaker_prefixes
    checked: list[bool] = []

    def slow_fill(self: Qwen3TTS) -> None:
        fill(self)
        clock.now += 10.0
        clock.wait_checks()
        checked.append(True)

    monkeypatch.setattr(Qwen3TTS, "fill_speaker_prefixes", slow_fill)
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", idle_unload_s=1.0)
    )
    try:
        # the load returned (an unload under warm-up made it raise) and never had to load again
        assert checked and engine.loads == 1 and engine.unloads == 0
    finally:
        engine.close()


def test_requests_arriving_together_after_an_unload_load_it_once(
    tiny_model_dir: Factory, clock: IdleClock
) -> None:
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, idle_unload_s=1.0)
    )
    try:
        _say(engine)
        clock.now += 1.0
        wait_until(lambda: not engine.loaded and engine.unloads == 1)  # and none again: the clock stands
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


def test_a_long_stream_is_never_unloaded_under_it(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch, clock: IdleClock
) -> None:
    engine = Engine.load(
        EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False, idle_unload_s=0.5)
    )
    phases: list[str] = []
    engine.on_phase = phases.append
    step_many = engine.model.step_many

    def slow_step(generators: Any) -> Any:  # a frame takes two idle limits by the idle clock
        clock.now += 1.0
        return step_many(generators)

    monkeypatch.setattr(engine.model, "step_many", slow_step)
    try:  # chunks of 4 frames: the rounds between them check with the last chunk 1-3 s ago
        stream = engine.synthesize(
            {"text": "Hello there.", "voice": "ryan", "seed": 1, "max_frames": 12, "chunk_frames": 4}
        )
        assert sum(c.frames for c in stream) == 12 and stream.timing.finish_reason == "max_frames"
        assert "unloaded" not in phases  # 12 s of streaming, 24 idle limits
        # and the idle clock starts when the stream ends, not when it started
        clock.wait_checks()
        assert engine.loaded and "unloaded" not in phases
        clock.now += 0.5
        wait_until(lambda: "unloaded" in phases)
    finally:
        engine.close()


def test_the_service_reports_the_phases_and_drops_voice_prompts(
    tiny_model_dir: Factory, tmp_path: Path, clock: IdleClock
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
        clock.now += 1.0
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
