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
multi-row BLAS call already does. The two kernels round differently, so which one runs decides bits
and is a fixed rule, not a load-time timing (a loaded host would time them otherwise): batched rows
go to oneDNN wherever this PyTorch has it (:func:`onednn_available`; oneDNN took 0.36-0.51x MKL's
time for 2-4 rows on an AMD Zen 2 as well).

One to three rows (one stream's decode step; the code predictor's first step per frame, two
positions) have a kernel of their own: :func:`split_linear`. MKL's float32 product of so few rows
runs on one thread whatever the pool size, so it reads weights at one core's speed: measured on an
AMD Zen 5 (2 cores), ``F.linear`` of one row streamed 19-24 GB/s with 1 or 2 threads, two rows
9-16 GB/s, while a plain read of the same memory (``Tensor.sum``) ran at 75 GB/s on 2 threads.
Cutting the weight into ``parts`` blocks of outputs and computing them as one ``bmm`` (PyTorch
spreads a batch over its threads) gives each thread its block: 35-45 GB/s for one row, 2.2x for
two, and bitwise the same values, since each output is still the same dot product computed by the
same BLAS kernel with the same rows (tests; from four rows on MKL changes kernels with the width,
so those stay on ``F.linear``). Whether it is faster is measured at load (:func:`split_rows_faster`):
a timing may choose here because both give the same bits (checked on the weight first).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "F32_ROWS_MAX",
    "MAX_SPLIT_ROWS",
    "FusedLinear",
    "Linear",
    "onednn_available",
    "onednn_gemm",
    "onednn_linear",
    "rows_linear",
    "set_flags",
    "split_linear",
    "split_rows_faster",
    "time_both",
    "use_onednn_rows",
    "use_split_rows",
]

logger = logging.getLogger(__name__)


def onednn_available() -> bool:
    """Whether this PyTorch has the oneDNN linear kernel."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def rows_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    onednn: bool,
    parts: int = 1,
    f32_rows: bool = False,
    packed: tuple[Tensor, int] | None = None,
) -> Tensor:
    """``F.linear(x, weight, bias)``, with the faster kernels this module chooses.

    One row, up to :data:`F32_ROWS_MAX` one-position rows (a batched step's streams) or as many
    pairs of positions (:func:`_kernel_columns`) run on voxcast's float32 row kernels
    (:mod:`voxcast.models.qwen3_tts.accel.f32_rows`) through ``packed`` where given, else through the weight with ``f32_rows``:
    each stream's rows get the bits ``F.linear`` gives them alone (where the model checked that at
    load). Otherwise, with ``onednn`` a batch of rows (``x.shape[0] > 1``) runs on
    oneDNN (equal to one row's to float rounding); with ``parts > 1``, one to three rows of a float32
    CPU Linear run as :func:`split_linear` (bitwise ``F.linear``).
    """
    if f32_rows or packed is not None:
        columns = _kernel_columns(x, weight, packed)
        if columns and packed is not None:
            return torch.ops.voxcast.f32_rows_packed_linear(x, packed[0], bias, packed[1], columns)
        if columns:
            return torch.ops.voxcast.f32_rows_linear(x, weight, bias, columns)
    if onednn and x.shape[0] > 1:
        return onednn_linear(x, weight, bias)
    if parts > 1 and _splittable(x, weight, parts):
        return split_linear(x, weight, bias, parts)
    return F.linear(x, weight, bias)


#: Most rows voxcast's float32 row kernels take in one call (``f32_rows.cpp``).
F32_ROWS_MAX = 4


def _kernel_columns(x: Tensor, weight: Tensor, packed: tuple[Tensor, int] | None) -> int:
    """Which BLAS product voxcast's float32 row kernels reproduce for x, 0 for none: 1 for one row or
    up to :data:`F32_ROWS_MAX` rows of one position each (a batched step's streams), 2 for up to as
    many pairs of positions (the code predictor's first step) through a weight whose rows start
    16-byte aligned. Several positions of one stream otherwise go to the BLAS's own many-column
    product."""
    rows = x.numel() // max(int(weight.shape[-1]), 1)
    if rows == 1 or (1 < rows <= F32_ROWS_MAX and x.dim() >= 2 and x.shape[-2] == 1):
        return 1
    if x.dim() >= 3 and x.shape[-2] == 2 and rows <= 2 * F32_ROWS_MAX:
        aligned = packed[1] == 4 if packed is not None else weight.data_ptr() % 16 == 0
        return 2 if aligned else 0
    return 0


#: Smallest block (outputs, and outputs x inputs) :func:`rows_linear` splits a row into. Below
#: ~400 elements PyTorch's bmm takes a plain loop of its own, and MKL treats matrices of 2 outputs
#: differently: both round differently from ``F.linear`` (measured: every block of fewer than 4
#: outputs or 400 elements differed, none larger did). A decode step's blocks are 10^5-10^6.
_MIN_BLOCK_OUT, _MIN_BLOCK = 16, 1024
#: Most rows :func:`rows_linear` splits (measured bitwise up to 3 rows, with biases; 4 without).
MAX_SPLIT_ROWS = 3


def _splittable(x: Tensor, weight: Tensor, parts: int) -> bool:
    rows = 1
    for d in x.shape[:-1]:
        rows *= int(d)
    n, k = weight.shape if weight.dim() == 2 else (0, 0)
    return (
        rows <= MAX_SPLIT_ROWS
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and n % parts == 0
        and n // parts >= _MIN_BLOCK_OUT
        and n // parts * k >= _MIN_BLOCK
        and weight.is_contiguous()
    )


def split_linear(x: Tensor, weight: Tensor, bias: Tensor | None, parts: int) -> Tensor:
    """``F.linear`` of a few rows x [..., K] as ``parts`` blocks of outputs in one ``bmm``.

    ``weight`` [N, K] (contiguous, N a multiple of ``parts``) is viewed, not copied, as
    ``[parts, N / parts, K]``; the bmm runs the blocks on the intra-op threads, each with the BLAS
    kernel ``F.linear`` uses for that many rows, so every output is bitwise the same for up to
    :data:`MAX_SPLIT_ROWS` rows (with a bias too: it is added after the dot product either way;
    tests). One row's result is a view of the bmm's; more rows cost one small copy.
    """
    n, k = weight.shape
    m = x.numel() // k
    blocks = weight.view(parts, n // parts, k).transpose(1, 2)
    y = torch.bmm(x.reshape(1, m, k).expand(parts, m, k), blocks)  # [parts, m, n / parts]
    y = y.transpose(0, 1).reshape(*x.shape[:-1], n)
    return y if bias is None else y + bias


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` on oneDNN, for x [..., K] with at least 2 dimensions."""
    # The "+ zeros" form: its signature records under torch.jit.trace (the plain one's empty scalar
    # list does not), and adding zeros changes no value.
    zeros = x.new_zeros((*x.shape[:-1], weight.shape[0]))
    return torch.ops.mkldnn._linear_pointwise.binary(x, zeros, weight, bias, "add")


class _RowKernels:
    """The kernel choices of one projection's decode rows, set at load by the accel step.

    ``onednn_rows`` (:func:`use_onednn_rows`), ``row_parts`` (:func:`use_split_rows`), and
    ``f32_rows`` / ``row_packed`` (:mod:`voxcast.models.qwen3_tts.accel.f32_rows`). The projection
    computes ``F.linear(x, self.weight, self.bias)`` through :func:`rows_linear`.
    """

    weight: Tensor
    bias: Tensor  # None where the projection has none (as nn.Linear's annotation leaves out)
    onednn_rows = False
    row_parts = 1
    f32_rows = False
    row_packed: tuple[Tensor, int] | None = None  # (:class:`voxcast.models.qwen3_tts.accel.f32_rows.Packed`)

    def forward(self, x: Tensor) -> Tensor:
        return rows_linear(
            x, self.weight, self.bias, self.onednn_rows, self.row_parts, self.f32_rows, self.row_packed
        )

    def row_weights(self) -> list[tuple[nn.Module, Tensor, Tensor | None]]:
        """``(self, weight, bias)``: what a decode row through this projection multiplies."""
        assert isinstance(self, nn.Module)
        return [(self, self.weight, self.bias)]


class Linear(_RowKernels, nn.Linear):  # type: ignore[misc]  # (bias: nn.Linear types it by its assignment)
    """``nn.Linear`` (same parameters and state-dict keys) whose rows run on the chosen kernels."""


class FusedLinear(_RowKernels, nn.Module):
    """Several Linears with one input read as one matmul: ``[q; k; v]`` or ``[gate; up]``.

    The concatenated weight (and bias) is held as non-persistent buffers (the state dict keeps the
    original Linears' keys) and each original Linear's parameters are rebound to views of it, so
    nothing is stored twice. Splitting a Linear along its outputs gives bitwise the same values
    (each output is its own dot product), so fusing only removes matmul calls and their overhead.
    """

    def __init__(self, *linears: nn.Linear) -> None:
        super().__init__()
        weight = torch.cat([lin.weight for lin in linears])
        bias = torch.cat([lin.bias for lin in linears]) if linears[0].bias is not None else None
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        row = 0
        for lin in linears:
            n = lin.out_features
            lin.weight = nn.Parameter(weight[row : row + n], requires_grad=False)
            if bias is not None:
                lin.bias = nn.Parameter(bias[row : row + n], requires_grad=False)
            row += n


def set_flags(module: nn.Module, name: str, on: object) -> int:
    """Set the kernel flag (or state) ``name`` on every submodule that has it; returns how many."""
    n = 0
    for m in module.modules():
        if hasattr(m, name):
            setattr(m, name, on)
            n += 1
    return n


def use_onednn_rows(module: nn.Module, on: bool) -> int:
    """Set ``onednn_rows`` on every submodule that has it (Linears, fused projections); returns how many."""
    return set_flags(module, "onednn_rows", on)


def use_split_rows(module: nn.Module, parts: int) -> int:
    """Set ``row_parts`` on every submodule that has it (1 = ``F.linear``); returns how many."""
    return set_flags(module, "row_parts", parts)


def onednn_gemm(w: Tensor, b: Tensor | None, x: Tensor) -> Tensor:
    """``w @ x + b[:, None]`` on oneDNN for w [M, K], x [K, N] -> [M, N] (contiguous)."""
    return onednn_linear(x.t()[None], w, b)[0].t().contiguous()


def time_both(aten: Callable[[], object], onednn: Callable[[], object], reps: int = 8) -> tuple[float, float]:
    """Median ms of ``aten()`` and ``onednn()``, run alternately (off, on, on, off, ...: drift cancels).

    A timing depends on what else the host runs, so it may only choose among kernels that give the
    same bits (the same request must give the same audio whatever the load): :func:`split_rows_faster`
    checks that first; kernels that round differently are chosen by a fixed rule.
    """
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


def split_rows_faster(weight: Tensor, parts: int, reps: int = 8, margin: float = 0.9) -> dict[str, object]:
    """Time one row through ``weight`` [N, K] with ``F.linear`` and with :func:`split_linear`.

    The weight should be one a decode step really reads (larger than the caches). Returns
    ``{"linear_ms", "split_ms", "bitwise", "parts"}``: ``parts`` is the given count where the split
    gave bitwise ``F.linear``'s values on this weight (1 to :data:`MAX_SPLIT_ROWS` rows) and took
    at most ``margin`` of its time for one row, else 1.
    """
    x = torch.randn(1, 1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    with torch.inference_mode():
        bitwise = _splittable(x, weight, parts) and all(
            torch.equal(F.linear(r, weight), split_linear(r, weight, None, parts))
            for r in (
                torch.randn(m, 1, weight.shape[1], dtype=weight.dtype) for m in range(1, MAX_SPLIT_ROWS + 1)
            )
        )
    linear_ms, split_ms = time_both(
        lambda: F.linear(x, weight), lambda: split_linear(x, weight, None, parts), reps
    )
    chosen = parts if bitwise and split_ms <= margin * linear_ms else 1
    logger.info(
        "one decode row: %.2f ms in F.linear, %.2f ms as %d blocks in one bmm: using %s",
        linear_ms,
        split_ms,
        parts,
        f"{parts} blocks" if chosen > 1 else "F.linear",
    )
    return {"linear_ms": linear_ms, "split_ms": split_ms, "bitwise": bitwise, "parts": chosen}
