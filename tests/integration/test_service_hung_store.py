"""A hung object store (moto S3 frozen with SIGSTOP) never holds a request's first audio or its end.

Before: a seeded request looked the cache up with S3's timeouts and retries before generating, so
first audio came after ~50 s. Here the S3 read timeout is an hour, so a request that waited for the
frozen store would not end within the test's bound; with the lookup deadline at 100 ms the request
must speak without the store, report the lookup as timed out and the write as unconfirmed, and after
repeated failures skip the store until a probe finds it answering again. While the store answers,
the deadlines are generous (a busy host may take longer than 100 ms for a moto call; that part is not
under test), so the outcome never depends on the machine's speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.s3 import MotoServer
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.service import Service, ServiceConfig
from voxcast.storage import open_store
from voxcast.storage.guard import GuardSettings, StoreGuard

READ_TIMEOUT_S = 3600
SPEAK_BOUND_S = 60
"""How long a request may take while the store is frozen (a request waiting for it would not end)."""
ANSWERING = GuardSettings(lookup_s=60, write_s=60, failures=2, cooldown_s=60)
"""While the store answers: deadlines no host is slow enough to miss."""
FROZEN = replace(ANSWERING, lookup_s=0.1, write_s=0.5)
"""While it is frozen: short deadlines (missed whatever the host's speed: the store never answers)."""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Callable[[str], Path]) -> Iterator[Engine]:
    e = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=False))
    yield e
    e.close()


def _speak(service: Service, seed: int) -> tuple[bytes, Any]:
    """The PCM samples and the result (a streamed WAV's header differs from the stored file's)."""
    stream = service.synthesize(
        {"text": "Hello there.", "voice": "ryan", "seed": seed, "max_frames": 4, "response_format": "pcm"}
    )
    data = b"".join(c.data for c in stream)
    return data, stream.result


def _speak_within_bound(service: Service, seed: int) -> tuple[bytes, Any]:
    """:func:`_speak`, failing the test if it has not ended after :data:`SPEAK_BOUND_S`."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(_speak, service, seed).result(timeout=SPEAK_BOUND_S)
    except TimeoutError:
        pytest.fail(f"the request had not ended after {SPEAK_BOUND_S} s: it waits for the frozen store")
    finally:
        pool.shutdown(wait=False)  # a request stuck on the frozen store ends once it is thawed


def test_a_frozen_store_neither_delays_first_audio_nor_the_end(
    engine: Engine, s3_server: MotoServer, s3_bucket: str
) -> None:
    store = open_store(
        s3_server.storage_config(
            s3_bucket, VOXCAST_S3_READ_TIMEOUT_S=str(READ_TIMEOUT_S), VOXCAST_S3_MAX_ATTEMPTS="1"
        )
    )
    service = Service.assemble(ServiceConfig(store_guard=ANSWERING), engine, store)
    clock = Clock()
    guard = service.store_guard = StoreGuard(ANSWERING, clock=clock)
    try:
        first, r = _speak(service, seed=1)  # the store answers: a miss, then a fill
        assert r.timing.extra["cache_lookup"] == "miss" and r.audio_key and r.cache_error is None
        again, hit = _speak(service, seed=1)
        assert hit.timing.extra["cache_lookup"] == "hit" and again == first

        s3_server.freeze()
        guard.settings = FROZEN  # read at each call; the breaker's state stays
        try:
            audio, r = _speak_within_bound(service, seed=2)  # ended: it did not wait for the store
            assert audio and r.timing.extra["cache_lookup"] == "timeout"
            assert r.audio_key is None and "goes on in the background" in (r.cache_error or "")
            assert service.store_guard.state == "open"  # two failures in a row (lookup, write)

            audio, r = _speak_within_bound(service, seed=3)  # skipped at once: no deadline waited
            assert audio and r.timing.extra["cache_lookup"] == "skipped"
            assert r.audio_key is None and "skipped" in (r.cache_error or "")
            assert service.store_guard.report()["skipped"] == 2  # the lookup and the write
        finally:
            guard.settings = ANSWERING
            s3_server.thaw()

        clock.now += 61  # cooldown over: the next call probes the store, which answers again
        again, hit = _speak(service, seed=1)
        assert hit.timing.extra["cache_lookup"] == "hit" and again == first
        assert service.store_guard.state == "closed"
    finally:
        service.store_guard.close()
        store.close()
