"""A process that ends with its engine still running (not closed, a stream mid-way) exits cleanly:
no "terminate called without an active exception", exit status 0 (why it aborted: ``_close_at_exit``
in voxcast.engine.engine)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

Factory = Callable[[str], Path]

_SCRIPT = textwrap.dedent(
    """
    import sys
    from voxcast.config import EngineConfig
    from voxcast.engine.engine import Engine

    config = EngineConfig(model=sys.argv[1], device="cpu", warmup=False, decode_thread=sys.argv[2])
    engine = Engine.load(config)
    for _ in engine.synthesize({"text": "one frame then some", "voice": "ryan", "max_frames": 4}):
        pass
    stream = iter(engine.synthesize({"text": "left running at exit", "voice": "ryan", "max_frames": 400}))
    next(stream)  # generating now; the process ends here
    print("exiting", flush=True)
    """
)


@pytest.mark.parametrize("decode_thread", ["off", "on"])
def test_exit_with_a_running_engine_is_clean(tiny_model_dir: Factory, decode_thread: str) -> None:
    model = tiny_model_dir("custom_voice")
    # three tries of a race at exit, run side by side (separate processes: nothing shared)
    tries = [
        subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, str(model), decode_thread],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in tries:
        stdout, stderr = proc.communicate(timeout=240)
        assert "exiting" in stdout, stderr[-2000:]
        assert proc.returncode == 0, stderr[-2000:]
        assert "terminate called" not in stderr
