"""A process's cold start, split into its parts: reported on ``/metrics`` and in its first request.

``before_load_ms`` runs from the process's start (the kernel's record of it, so the interpreter and the
imports count) to the moment the service began loading; ``kernels_ms`` is the time spent building or
loading voxcast's compiled kernels (a build happens at most once per machine or image: ``voxcast
build-kernels`` does it ahead); ``load_ms`` and ``warmup_ms`` are the engine's; ``ready_ms`` is process
start to ready.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

__all__ = ["Startup", "process_start_unix"]

_IMPORTED_AT = time.time()


def process_start_unix() -> float:
    """When this process started (Unix seconds): from ``/proc`` on Linux, else when voxcast was imported."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat(5): starttime after boot, counted after "pid (comm)"
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])  # 10 ms resolution (btime in /proc/stat: whole seconds)
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


@dataclass(frozen=True)
class Startup:
    """One process's start, in ms (see the module docstring)."""

    ready_ms: float
    before_load_ms: float
    load_ms: float
    warmup_ms: float
    kernels_ms: float

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in asdict(self).items()}
