"""Start-up hands freed heap memory back to the OS (glibc, Linux) and reports what it did."""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path

import pytest

from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.memory import rss_mb, trim_heap

glibc_linux = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs Linux with glibc"
)


@glibc_linux
def test_trim_returns_freed_heap_pages() -> None:
    # 64 KiB blocks (below glibc's mmap threshold: heap memory), each pinned by a small block after
    # it, so freeing them leaves holes that free() itself cannot return
    blocks, pins = [], []
    for _ in range(1600):  # ~100 MB
        b = bytearray(64 << 10)
        b[::4096] = b"\x01" * len(b[::4096])  # touch every page
        blocks.append(b)
        pins.append(bytearray(1024))
    del blocks
    result = trim_heap()
    assert result is not None
    assert result["rss_after_mb"] < result["rss_before_mb"]
    now = rss_mb()
    assert now is not None and now <= result["rss_before_mb"]
    assert len(pins) == 1600


@glibc_linux
@pytest.mark.parametrize("warmup", [False, True])
def test_engine_start_up_trims_the_heap(tiny_model_dir: Callable[[str], Path], warmup: bool) -> None:
    engine = Engine.load(EngineConfig(model=str(tiny_model_dir("custom_voice")), device="cpu", warmup=warmup))
    try:
        trim = engine.heap_trim
        assert trim is not None and trim["rss_after_mb"] <= trim["rss_before_mb"] + 1.0
        assert engine.warmed is warmup
        chunks = list(engine.synthesize({"text": "Hello.", "voice": "ryan", "max_frames": 2, "greedy": True}))
        assert sum(c.frames for c in chunks) == 2  # still serves
    finally:
        engine.close()
