"""Helpers the benchmark scripts share: machine facts for every JSON, the cached random checkpoints,
threads released together, and the one place that makes this checkout importable.

A script in ``scripts/`` imports this module directly (``python scripts/bench_x.py`` puts ``scripts/``
first on ``sys.path``). Scripts that import ``tests.fixtures`` or ``tests.parity``, or that must run
this checkout's ``src/`` rather than an installed voxcast, call :func:`use_checkout` before those
imports. Nothing here imports torch or voxcast at import time (``bench_memory`` measures the process
before torch is loaded).
"""

from __future__ import annotations

import os
import platform
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "ROOT",
    "at_once",
    "checkpoint",
    "cpu_name",
    "machine_info",
    "turbo_checkpoint",
    "use_checkout",
    "write_json",
]

#: The repository root.
ROOT = Path(__file__).resolve().parents[1]

_T = TypeVar("_T")


def use_checkout() -> None:
    """Put this checkout's ``src/`` and its root first on ``sys.path``: voxcast from ``src/``, and
    ``tests.fixtures`` / ``tests.parity`` importable."""
    for path in (str(ROOT), str(ROOT / "src")):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)


def checkpoint(size: str, kind: str = "base") -> Path:
    """The random ``size`` checkpoint of ``kind``, built once in ``.cache/bench-models``."""
    out = ROOT / ".cache" / "bench-models" / f"{size}-{kind}"
    if not (out / "config.json").exists():
        from voxcast.testing.qwen3_tts import make_test_model

        print(f"building random {size} {kind} checkpoint in {out} ...", flush=True)
        make_test_model(out, kind, size=size, seed=0)
    return out


def turbo_checkpoint(size: str, folder: Path | None = None) -> Path:
    """The random Chatterbox Turbo ``size`` checkpoint (``full`` or ``tiny``), built once in
    ``.cache/bench-models`` (or ``folder``), with its built-in voice ``default``. T3 has no stop bias:
    an utterance runs to its frame limit, as a benchmark needs."""
    from voxcast.testing.chatterbox_turbo import make_t3
    from voxcast.testing.chatterbox_turbo_layout import make_checkpoint

    folder = folder or ROOT / ".cache" / "bench-models" / f"turbo-{size}-nostop"
    if not (folder / ".complete").is_file():
        print(f"building random Chatterbox Turbo {size} checkpoint in {folder} ...", flush=True)
        make_checkpoint(folder, size, seed=0)
        make_t3(folder, size=size, seed=0, stop_bias=-20.0)
        (folder / ".complete").write_text("ok\n")
    return folder


def cpu_name() -> str:
    """The CPU's model name (every figure names its CPU)."""
    from voxcast.engine.calibration_cache import cpu_model

    return cpu_model()


_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
)


def machine_info() -> dict[str, Any]:
    """What a benchmark JSON records about where it ran: the CPU, its vector flags, the kernels PyTorch
    and voxcast pick on it (and what forces them: ``ATEN_CPU_CAPABILITY``, ``VOXCAST_INT8_VARIANT``)."""
    import torch

    from voxcast.kernels import native

    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    try:
        int8_variant: str | None = native.resolve(None)
    except (RuntimeError, ValueError):
        int8_variant = None
    return {
        "cpu": cpu_name(),
        "cpu_flags": [f for f in _FLAGS if f in flags],
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "int8_variant": int8_variant,
        "forced": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", native.VARIANT_ENV) if k in os.environ},
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def at_once(n: int, fn: Callable[[int], _T]) -> list[_T]:
    """``[fn(0), ..., fn(n - 1)]``, each on its own thread, all released together (a barrier)."""
    out: list[Any] = [None] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        barrier.wait()
        out[i] = fn(i)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write a benchmark's JSON (its folder created) and say where."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")
