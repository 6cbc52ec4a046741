"""The decode-thread choice that warm-up measured, remembered per machine and model.

``decode_thread=auto`` times concurrent warm-up streams with and without the decode thread
(:meth:`Engine.calibrate_decode_thread <voxcast.engine.engine.Engine.calibrate_decode_thread>`):
about 7 s of a 0.6B int8 warm-up on 2 cores, paid again by every process start on the same machine
(a restarted RQ worker, a redeploy). The result is stored under ``VOXCAST_CALIBRATION_DIR``
(default ``~/.cache/voxcast/calibration``; ``off`` disables it), keyed by everything the measurement
depends on: the CPU model and count, PyTorch's version and intra-op threads, the checkpoint's
identity, how it was loaded (device, dtypes, quantization, kernel choices) and the engine's
``max_active``. Another key (another machine, model or setting) measures again. Reading or writing
the cache never fails a start: a problem is logged and the measurement runs.

Only choices that change no audio may be kept here: the decode thread decodes the same chunks with
the same decoder as inline decoding, so a request's bytes do not depend on which process measured
what (``tests/engine/test_engine_decode_calibration.py`` compares the audio after each choice).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

import torch

__all__ = ["CALIBRATION_DIR_ENV", "cache_dir", "calibration_key", "cpu_model", "load", "store"]

log = logging.getLogger(__name__)

CALIBRATION_DIR_ENV = "VOXCAST_CALIBRATION_DIR"
_OFF = {"off", "0", "false", "no", "none"}


def cache_dir() -> Path | None:
    """Where choices are kept (None: the cache is off)."""
    raw = os.environ.get(CALIBRATION_DIR_ENV, "").strip()
    if raw.lower() in _OFF:
        return None
    return Path(raw) if raw else Path.home() / ".cache" / "voxcast" / "calibration"


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibration_key(identity: str, options: Any, max_active: int) -> str:
    """A name for the circumstances of one measurement (see the module docstring)."""
    parts = {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "identity": identity,
        "options": repr(options),
        "max_active": max_active,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def load(key: str) -> dict[str, Any] | None:
    """The stored measurement for ``key``, or None (none stored, the cache is off or unreadable)."""
    root = cache_dir()
    if root is None:
        return None
    path = root / f"decode-{key}.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("decode-thread calibration cache %s unreadable (%s): measuring again", path, e)
        return None
    if not isinstance(record, dict) or not isinstance(record.get("decode_thread"), bool):
        return None
    return record


def store(key: str, record: dict[str, Any]) -> None:
    """Keep ``record`` for ``key`` (atomically; a failure is only logged)."""
    root = cache_dir()
    if root is None:
        return
    path = root / f"decode-{key}.json"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("decode-thread calibration cache %s not written: %s", path, e)
