"""voxcast's own int8 Linear for decode rows (C++): built on first use, then loaded from a cache.

PyTorch's int8 Linear (fbgemm, :mod:`voxcast.kernels.int8_linear`) quantizes the activations per call and runs a GEMM
kernel; for the one or two rows of a decode step it reads weights well below memory bandwidth
(measured on an AMD Zen 3, 2 cores, 40 decode-sized matrices from DRAM: 13-18 GB/s, where a plain
read runs at 23). This kernel (``int8_kernel.cpp``) streams a packed weight layout and comes in two
variants (:data:`VARIANTS`), the first this CPU runs being the default:

- ``"vnni"`` (AVX-512 VNNI: AMD Zen 4 and later, Intel Xeon since Cascade Lake): each row of x is
  rounded to 16-bit fixed point once per call and multiplied with the int8 weights in exact integer
  arithmetic, two instructions per 64 weights, so one core keeps up with memory (AMD Zen 4: 25 GB/s
  against the AVX2 variant's 20 and a plain read's 28).
- ``"avx2"`` (AVX2 + FMA): x stays float32 and each weight is widened to float32 in registers; only
  the weights are rounded. On an AMD Zen 3, 19-22 GB/s on the matrices above.

Both are more exact than fbgemm (which rounds x to 8 bits), and a row's outputs do not depend on the
other rows of the call. ``VOXCAST_INT8_VARIANT`` forces one (e.g. ``avx2`` on an AVX-512 host, with
``ATEN_CPU_CAPABILITY=avx2`` for PyTorch: what an AVX2-only host runs).

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

__all__ = [
    "CFLAGS",
    "DECODE_OPS_SOURCE",
    "INPUT_MULTIPLE",
    "KERNEL_DIR_ENV",
    "SOURCE",
    "VARIANTS",
    "VARIANT_ENV",
    "build_dir",
    "linear",
    "load",
    "pack",
    "resolve",
    "variants",
]

logger = logging.getLogger(__name__)

last_load_s: float = 0.0
"""How long :func:`load` took in this process (a build, ~20 s, or loading a built library; 0: not run)."""

#: The C++ source.
SOURCE = Path(__file__).with_name("int8_kernel.cpp")
#: Built into the same library: fused element-wise steps of a decode layer (:mod:`voxcast.models.qwen3_tts.accel.decode_ops`).
DECODE_OPS_SOURCE = Path(__file__).with_name("decode_ops.cpp")
#: And the codec encoder's element-wise steps (:mod:`voxcast.kernels.seanet_gemm`).
ENCODER_OPS_SOURCE = Path(__file__).with_name("encoder_ops.cpp")
#: And float32 decode rows in the BLAS's own order (:mod:`voxcast.models.qwen3_tts.accel.f32_rows`).
F32_ROWS_SOURCE = Path(__file__).with_name("f32_rows.cpp")
_SOURCES = (SOURCE, DECODE_OPS_SOURCE, ENCODER_OPS_SOURCE, F32_ROWS_SOURCE)
#: Included by the sources (part of what names a build).
_HEADERS = (Path(__file__).with_name("linear_rows.h"),)
#: Environment variable naming where built kernels are kept.
KERNEL_DIR_ENV = "VOXCAST_KERNEL_DIR"
#: Compiler flags. The kernel's FMAs are explicit; with contraction off the compiler adds no others,
#: so a row's rounding is the same whichever row-count variant computes it.
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
#: The kernel's variants, fastest first.
VARIANTS = ("vnni", "avx2")
#: A variant's weights need a number of inputs that is a multiple of this.
INPUT_MULTIPLE = {"vnni": 4, "avx2": 8}
_OPS = {"vnni": ("int8_vnni_pack", "int8_vnni_linear"), "avx2": ("int8_pack", "int8_linear")}


def build_dir() -> Path:
    """Where this source's build for this PyTorch lives (a name that changes with either)."""
    root = Path(os.environ.get(KERNEL_DIR_ENV) or Path.home() / ".cache" / "voxcast" / "kernels")
    digest = hashlib.sha256(
        b"".join(s.read_bytes() for s in (*_SOURCES, *_HEADERS)) + repr((CFLAGS, torch.__version__)).encode()
    ).hexdigest()[:12]
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
        name = "voxcast_int8_" + where.name.split("-", 1)[1]
        built = where / f"{name}.so"
        if built.is_file():  # built before (``voxcast build-kernels``, an image): no compiler needed
            torch.ops.load_library(str(built))
        else:
            where.mkdir(parents=True, exist_ok=True)
            cpp_extension.load(
                name=name,
                sources=[str(s) for s in _SOURCES],
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
    global last_load_s
    last_load_s = time.perf_counter() - t0
    logger.info("int8 decode kernel loaded in %.1f s from %s", last_load_s, where)
    return ok


@functools.cache
def variants() -> tuple[str, ...]:
    """The variants this CPU runs, fastest first (none where :func:`load` fails)."""
    if not load():
        return ()
    return tuple(v for v in VARIANTS if v == "avx2" or bool(torch.ops.voxcast.int8_vnni_supported()))


#: Forces the variant chosen where none is asked for (e.g. ``avx2`` on an AVX-512 VNNI host, with
#: ``ATEN_CPU_CAPABILITY=avx2`` for PyTorch's own kernels: what an AVX2-only host runs).
VARIANT_ENV = "VOXCAST_INT8_VARIANT"


def resolve(variant: str | None) -> str:
    """``variant``, else ``VOXCAST_INT8_VARIANT``, else this CPU's fastest.

    Raises:
        ValueError: not a variant, or one this CPU does not run.
        RuntimeError: the kernel cannot be built or run here at all.
    """
    if variant is None:
        variant = os.environ.get(VARIANT_ENV, "").strip().lower() or None
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"int8 kernel variant {variant!r} is not one of {', '.join(VARIANTS)}")
    runs = variants()
    if not runs:
        raise RuntimeError("voxcast's int8 kernel cannot be built or run here (see the log)")
    if variant is not None and variant not in runs:
        raise ValueError(
            f"int8 kernel variant {variant!r} does not run on this CPU (it runs: {', '.join(runs)})"
        )
    return variant or runs[0]


def pack(weight: Tensor, variant: str | None = None) -> Tensor:
    """An int8 [N, K] weight in a variant's layout (default: this CPU's fastest); K must be a multiple
    of the variant's :data:`INPUT_MULTIPLE`."""
    return getattr(torch.ops.voxcast, _OPS[resolve(variant)][0])(weight.contiguous())


def linear(
    x: Tensor, packed: Tensor, scale: Tensor, bias: Tensor | None, variant: str | None = None
) -> Tensor:
    """``x @ (W * scale[:, None]).T + bias`` for x [..., K] float32, W packed by :func:`pack` for the
    same variant."""
    return getattr(torch.ops.voxcast, _OPS[resolve(variant)][1])(x, packed, scale, bias)
