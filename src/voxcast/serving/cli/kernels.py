"""``voxcast build-kernels``: compile voxcast's C++ CPU kernels now (at install or image build), so
no process pays the ~20 s build on its first start."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "build-kernels",
        help="compile voxcast's C++ CPU kernels into VOXCAST_KERNEL_DIR (do it at image build)",
        description="Build (or load, when already built) the int8 and fused CPU kernels for this "
        "PyTorch into VOXCAST_KERNEL_DIR (default ~/.cache/voxcast/kernels). Needs a C++ compiler; "
        "exits 1 where the kernels cannot be built or run (the engine then uses PyTorch's).",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from voxcast.kernels import native

    if not native.load():
        print("error: the kernels cannot be built or run here (see the log)", file=sys.stderr)
        return 1
    print(
        f"kernels ready in {native.build_dir()} ({native.last_load_s:.1f} s; variants: {', '.join(native.variants())})"
    )
    return 0
