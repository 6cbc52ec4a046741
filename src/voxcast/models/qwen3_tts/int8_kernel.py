"""voxcast's own int8 Linear for decode rows (C++, AVX2): built on first use, then loaded from a cache.

PyTorch's int8 Linear (fbgemm, :mod:`.quant`) quantizes the activations per call and runs a GEMM
kernel; for the one or two rows of a decode step it reads weights well below memory bandwidth
(measured on an AMD Zen 3, 2 cores, 40 decode-sized matrices from DRAM: 13-18 GB/s, where a plain
read runs at 23). This kernel (``int8_kernel.cpp``) keeps activations in float32, widens each int8
weight in registers and streams a packed weight layout: 19-22 GB/s on the same matrices. It is
also more exact (only the weights are rounded), and a row's outputs do not depend on the other rows.

The source is compiled with PyTorch's C++ extension builder (a C++ compiler and ninja) into
``VOXCAST_KERNEL_DIR`` (default ``~/.cache/voxcast/kernels``), ~20 s once per source and PyTorch
version; later processes load the built library. Where it cannot be built or run (no compiler, not
x86-64 with AVX2), :func:`load` says so and the model keeps PyTorch's kernel.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import time
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["CFLAGS", "KERNEL_DIR_ENV", "SOURCE", "build_dir", "linear", "load", "pack"]

logger = logging.getLogger(__name__)

#: The C++ source.
SOURCE = Path(__file__).with_name("int8_kernel.cpp")
#: Environment variable naming where built kernels are kept.
KERNEL_DIR_ENV = "VOXCAST_KERNEL_DIR"
#: Compiler flags. The kernel's FMAs are explicit; with contraction off the compiler adds no others,
#: so a row's rounding is the same whichever row-count variant computes it.
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")


def build_dir() -> Path:
    """Where this source's build for this PyTorch lives (a name that changes with either)."""
    root = Path(os.environ.get(KERNEL_DIR_ENV) or Path.home() / ".cache" / "voxcast" / "kernels")
    digest = hashlib.sha256(SOURCE.read_bytes() + repr((CFLAGS, torch.__version__)).encode()).hexdigest()[:12]
    return root / f"int8-{digest}"


@functools.cache
def load() -> bool:
    """Build (first time) and load the kernel; False, with the reason logged, where it cannot run."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        logger.info("int8 decode kernel: x86-64 only (this is %s); using PyTorch's", platform.machine())
        return False
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        logger.info("int8 decode kernel: this CPU lacks AVX2; using PyTorch's")
        return False
    t0 = time.perf_counter()
    try:
        from torch.utils import cpp_extension

        where = build_dir()
        where.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(
            name="voxcast_int8_" + where.name.split("-", 1)[1],
            sources=[str(SOURCE)],
            extra_cflags=list(CFLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(where),
            is_python_module=False,
            verbose=False,
        )
        ok = bool(torch.ops.voxcast.int8_supported())
    except Exception as e:  # no compiler or ninja, a read-only cache, ...: fall back, loudly
        logger.warning("int8 decode kernel unavailable (%s: %s); using PyTorch's", type(e).__name__, e)
        return False
    logger.info("int8 decode kernel loaded in %.1f s from %s", time.perf_counter() - t0, where)
    return ok


def pack(weight: Tensor) -> Tensor:
    """An int8 [N, K] weight (K a multiple of 8) in the kernel's layout; :func:`load` must have succeeded."""
    return torch.ops.voxcast.int8_pack(weight.contiguous())


def linear(x: Tensor, packed: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ (W * scale[:, None]).T + bias`` for x [..., K] float32, W packed by :func:`pack`."""
    return torch.ops.voxcast.int8_linear(x, packed, scale, bias)
