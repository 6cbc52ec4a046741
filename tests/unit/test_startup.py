"""The process start time that cold-start figures count from."""

from __future__ import annotations

import json
import subprocess
import sys

from voxcast.startup import Startup


def test_process_start_is_read_from_the_kernel_before_voxcast_is_imported() -> None:
    code = (
        "import time; time.sleep(0.5); t_import = time.time();"
        "from voxcast.startup import process_start_unix;"
        "import json; print(json.dumps([process_start_unix(), t_import, time.time()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    start, t_import, now = json.loads(out)
    assert start <= t_import - 0.45  # the half second slept before the import counts
    assert now - start < 60


def test_startup_to_dict_rounds_every_part() -> None:
    s = Startup(ready_ms=1234.5678, before_load_ms=1.04, load_ms=2.0, warmup_ms=0.0, kernels_ms=0.0)
    assert s.to_dict() == {
        "ready_ms": 1234.6,
        "before_load_ms": 1.0,
        "load_ms": 2.0,
        "warmup_ms": 0.0,
        "kernels_ms": 0.0,
    }
