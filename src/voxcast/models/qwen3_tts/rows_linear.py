"""Linears whose batched-decode calls (several streams' rows) may run on oneDNN instead of BLAS.

A float32 Linear on the CPU goes to the BLAS PyTorch was built with (MKL). For one row it streams
the weight at memory bandwidth; for the 2-8 rows of a batched decode step MKL's small-M path can be
far slower. Measured on an AMD Zen 3 (AVX2, 2 cores; ``scripts/bench_decode.py --streams``, and the
profile of one 4-row step of the 0.6B talker + code predictor): ``[4, 1024] x [1024, 6144]`` took
5.3 ms in MKL against 2.1 ms in oneDNN, and a 4-row step cost 2.6x a 1-row one, so batching four
streams gave 1.43x one stream's frames/s; with the rows on oneDNN, 3.43x (``--rows-kernel both``).
oneDNN's matmul keeps the weight streaming for small M. The audio decoder runs its short GEMMs
(one- and two-frame chunks) through the same kernel (:func:`onednn_gemm`, :mod:`.codec_layers`).

Only rows of a batch (``x.shape[0] > 1``, which in this model only a batched decode step produces)
are rerouted: a single stream and every prefill keep PyTorch's own kernel and so stay bitwise equal
to the official implementation; a batched step equals the single-row one to float rounding, as a
multi-row BLAS call already does. Whether oneDNN is faster depends on the CPU and the BLAS, so the
model measures both on its own weight at load (:func:`onednn_rows_faster`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Linear",
    "kernel_choice",
    "onednn_available",
    "onednn_gemm",
    "onednn_linear",
    "onednn_rows_faster",
    "rows_linear",
    "set_flags",
    "time_both",
    "use_onednn_rows",
]

logger = logging.getLogger(__name__)


def onednn_available() -> bool:
    """Whether this PyTorch has the oneDNN linear kernel."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def rows_linear(x: Tensor, weight: Tensor, bias: Tensor | None, onednn: bool) -> Tensor:
    """``F.linear(x, weight, bias)``; with ``onednn``, a batch of rows (``x.shape[0] > 1``) runs on oneDNN."""
    if onednn and x.shape[0] > 1:
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` on oneDNN, for x [..., K] with at least 2 dimensions."""
    # The "+ zeros" form: its signature records under torch.jit.trace (the plain one's empty scalar
    # list does not), and adding zeros changes no value.
    zeros = x.new_zeros((*x.shape[:-1], weight.shape[0]))
    return torch.ops.mkldnn._linear_pointwise.binary(x, zeros, weight, bias, "add")


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict keys) that honours :func:`use_onednn_rows`."""

    onednn_rows = False

    def forward(self, x: Tensor) -> Tensor:
        return rows_linear(x, self.weight, self.bias, self.onednn_rows)


def set_flags(module: nn.Module, name: str, on: bool) -> int:
    """Set the kernel flag ``name`` on every submodule that has it; returns how many."""
    n = 0
    for m in module.modules():
        if hasattr(m, name):
            setattr(m, name, on)
            n += 1
    return n


def use_onednn_rows(module: nn.Module, on: bool) -> int:
    """Set ``onednn_rows`` on every submodule that has it (Linears, fused projections); returns how many."""
    return set_flags(module, "onednn_rows", on)


def onednn_gemm(w: Tensor, b: Tensor | None, x: Tensor) -> Tensor:
    """``w @ x + b[:, None]`` on oneDNN for w [M, K], x [K, N] -> [M, N] (contiguous)."""
    return onednn_linear(x.t()[None], w, b)[0].t().contiguous()


def time_both(aten: Callable[[], object], onednn: Callable[[], object], reps: int = 8) -> tuple[float, float]:
    """Median ms of ``aten()`` and ``onednn()``, run alternately (off, on, on, off, ...: drift cancels)."""
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.inference_mode():
        for i in range(2 * (reps + 1)):
            on = i % 4 in (1, 2)
            t0 = time.perf_counter()
            (onednn if on else aten)()
            if i >= 2:  # the first of each is a warm-up
                times[on].append(time.perf_counter() - t0)
    a, o = (sorted(times[k])[len(times[k]) // 2] * 1000 for k in (False, True))
    return a, o


def kernel_choice(
    what: str, aten: Callable[[], object], onednn: Callable[[], object], reps: int = 8, margin: float = 0.9
) -> dict[str, object]:
    """Time both kernels (:func:`time_both`); oneDNN is chosen when it takes at most ``margin`` of the time.

    Returns ``{"aten_ms", "onednn_ms", "onednn"}`` and logs it, naming ``what`` was measured.
    """
    aten_ms, onednn_ms = time_both(aten, onednn, reps)
    choice = onednn_ms <= margin * aten_ms
    logger.info(
        "%s: %.2f ms in PyTorch's kernel, %.2f ms in oneDNN: using %s",
        what,
        aten_ms,
        onednn_ms,
        "oneDNN" if choice else "PyTorch's",
    )
    return {"aten_ms": aten_ms, "onednn_ms": onednn_ms, "onednn": choice}


def onednn_rows_faster(weight: Tensor, rows: int = 4, reps: int = 8) -> dict[str, object]:
    """:func:`kernel_choice` for ``rows`` rows through ``weight`` [N, K].

    The weight should be one a decode step really reads (larger than the caches), so that the
    figures are the streaming ones. Costs ``2 * (reps + 1)`` matmuls.
    """
    x = torch.randn(rows, 1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    return kernel_choice(
        "batched rows",
        lambda: rows_linear(x, weight, None, False),
        lambda: rows_linear(x, weight, None, True),
        reps,
    )
