"""SIGTERM's handler begins the drain on the main thread, which may hold the drain's lock right then
(a request registering or leaving :meth:`Drain.track` on the event loop): begin must not wait for it.

A plain lock deadlocked there: ``voxcast serve`` hung on SIGTERM after its last request, logging
nothing (seen under load in the test suite). The case runs in a subprocess that raises the signal
inside ``track``'s locked section; the old lock hangs it (the test's timeout), the fixed one ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import os, signal
from voxcast.serving.drain import Drain

drain = Drain(30.0)
signal.signal(signal.SIGTERM, lambda *_: drain.begin())


class Signalled(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        os.kill(os.getpid(), signal.SIGTERM)  # its handler runs here, with the drain's lock held


drain._work = Signalled()
with drain.track(lambda reason: None):
    assert drain.begun
assert drain.wait_idle(1.0)
print("drained")
"""


def test_a_signal_inside_track_begins_the_drain_without_deadlock() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")},
    )
    assert done.returncode == 0 and done.stdout.strip() == "drained", done.stderr[-2000:]
