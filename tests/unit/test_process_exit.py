"""Serving processes end with their exit code even while an engine thread is still inside torch.

Python's normal exit tears down daemon threads; one caught inside a torch call (the GIL released)
aborts the process ("terminate called without an active exception", SIGABRT) instead of exiting
with its code. ``voxcast serve`` and ``voxcast worker`` therefore end through ``serving.exit.die``.
Each case runs the real command line in a subprocess, its body replaced by one that leaves such a
thread running and returns 0 (on the old exit path, 8 runs of 8 aborted).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

_BUSY_THREAD = """
import sys, threading
import torch

def busy() -> None:  # an engine thread still multiplying when the command returns
    a = torch.randn(1200, 1200)
    started = threading.Event()

    def work() -> None:
        with torch.inference_mode():
            while True:
                started.set()
                a @ a

    threading.Thread(target=work, daemon=True).start()
    started.wait()
"""

_SERVE = """
import voxcast.serving.http.main as http_main

def serve(env):
    busy()
    return 0

http_main.serve = serve
from voxcast.serving.cli.main import main
sys.exit(main(["serve"]))
"""

_WORKER = """
import voxcast.serving.cli.queue as queue
import voxcast.serving.rq.config as rq_config
import voxcast.serving.rq.worker as rq_worker

class Worker:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def work(self, **kwargs) -> None:
        busy()

queue._reachable = lambda url: None
rq_config.connect = lambda config: None
rq_worker.VoxcastWorker = Worker
sys.exit(queue.worker_main([]))
"""


@pytest.mark.parametrize("body", [_SERVE, _WORKER], ids=["serve", "worker"])
def test_a_command_exits_0_with_a_torch_thread_still_running(body: str) -> None:
    script = textwrap.dedent(_BUSY_THREAD) + textwrap.dedent(body)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("VOXCAST_")},
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO_ROOT / "src"),
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
