"""One float32 decode row per Linear in the BLAS's own order, at memory speed (C++, ``f32_rows.cpp``).

A float32 decode step multiplies one row by each weight. PyTorch hands that to its BLAS (MKL), whose
one-column product runs one dependent chain of 4-wide adds per output on one thread: measured on an
AMD Zen 5 (2 cores), ``F.linear`` read 22-23 GB/s, :func:`voxcast.kernels.rows_linear.split_linear` (blocks on both
threads) 34-44, a plain read of the same memory 47-77 GB/s. ``f32_rows.cpp`` computes every output
with exactly the BLAS's operations in the BLAS's order (its comment gives the order), several outputs
side by side on each thread, so the values stay bitwise ``F.linear``'s, i.e. the official
implementation's, while the weights stream at the memory's speed:

- :func:`linear` reads the weight as it is (no extra memory), 8 outputs at a time;
- :func:`pack` lays a weight out as one sequential stream per 8 outputs and :func:`packed_linear`
  reads that (a second copy of the weight, but at a plain read's speed).

Both take up to 8 rows at once, each weight vector loaded once for all of them, every row getting the
bits it would get alone; the model sends them a batched step's streams up to
:data:`voxcast.kernels.rows_linear.F32_ROWS_MAX` (4), below which they measured faster than oneDNN.

The order is the BLAS's on CPUs where it takes that path (it may take another elsewhere), so a model
uses these only where :func:`matches_blas` found the same bits on every weight they would serve
(:meth:`.model.Qwen3TTS` at load). Where a weight's rows start (16-byte aligned or not) changes how
the BLAS starts each sum; the kernels follow that too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.kernels import native as int8_kernel
from voxcast.kernels.rows_linear import Linear, time_both
from voxcast.models.qwen3_tts.layers import MLP, Attention

__all__ = ["Packed", "available", "choose", "linear", "matches_blas", "pack", "packed_linear", "row_weights"]

logger = logging.getLogger(__name__)


def available() -> bool:
    """Whether the kernels are built and loaded (the int8 kernel's library: x86-64, a C++ compiler)."""
    return int8_kernel.load()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, columns: int = 1) -> Tensor:
    """``F.linear`` of x [..., K] (1 to 8 rows) through a row-major float32 weight [N, K].

    Each row gets the bits the BLAS gives it in a product of ``columns`` (1, or 2: a pair of positions,
    as the code predictor's first step computes them) rows."""
    return torch.ops.voxcast.f32_rows_linear(x, weight, bias, columns)


class Packed(NamedTuple):
    """A weight in :func:`packed_linear`'s layout, and the BLAS's scalar start for the original."""

    weight: Tensor
    peel: int


def pack(weight: Tensor) -> Packed:
    """A contiguous float32 [N, K] weight (N a multiple of 8, K of 4) in :func:`packed_linear`'s layout.

    The BLAS's order depends on where the original's rows start (:func:`matches_blas` checks the
    pair), so pack the weight the model multiplies, not a copy of it.
    """
    return Packed(torch.ops.voxcast.f32_rows_pack(weight), int(torch.ops.voxcast.f32_rows_peel(weight)))


def packed_linear(x: Tensor, packed: Packed, bias: Tensor | None = None, columns: int = 1) -> Tensor:
    """``F.linear`` of x [..., K] (1 to 8 rows) through a weight packed by :func:`pack` (``columns``
    as in :func:`linear`; 2 needs a weight whose rows start 16-byte aligned, ``peel`` 4)."""
    return torch.ops.voxcast.f32_rows_packed_linear(x, packed.weight, bias, packed.peel, columns)


def matches_blas(
    weight: Tensor, bias: Tensor | None = None, packed: Packed | None = None, draws: int = 2
) -> bool:
    """Whether :func:`linear` (and :func:`packed_linear` on ``packed``) give bitwise ``F.linear``'s
    values for ``draws`` random rows through ``weight``, and for pairs of positions where the rows
    start 16-byte aligned; costs 2-6 products per draw."""
    g = torch.Generator().manual_seed(weight.shape[0] * 7919 + weight.shape[1])
    pairs = weight.data_ptr() % 16 == 0
    with torch.inference_mode():
        for i in range(draws):
            for columns in (1, 2) if pairs else (1,):
                x = torch.randn(1, columns, weight.shape[1], generator=g) * (10.0**i)
                want = F.linear(x, weight, bias)
                if not torch.equal(linear(x, weight, bias, columns), want):
                    return False
                if packed is not None and not torch.equal(packed_linear(x, packed, bias, columns), want):
                    return False
    return True


#: One (module, weight, bias) a decode row multiplies: the module holds the kernel flag and packed copy.
RowWeight = tuple[nn.Module, Tensor, "Tensor | None"]
#: The packed copies are taken by ``choose(wanted=None)`` where they take at most this much of the row
#: kernel's time.
_MARGIN = 0.95


def row_weights(module: nn.Module) -> list[RowWeight]:
    """Every matmul a decode row through ``module`` runs, once each (fused projections as one)."""
    out: list[RowWeight] = []
    covered: set[int] = set()
    for m in module.modules():  # parents before their children
        if id(m) not in covered and isinstance(m, (Attention, MLP, Linear)):
            out += m.row_weights()
            covered.update(id(c) for c in m.modules())
    return out


def _packable(w: Tensor) -> bool:
    return (
        w.dim() == 2 and w.is_contiguous() and w.shape[0] % 8 == 0 and w.shape[1] % 4 == 0 and w.shape[1] >= 8
    )


def _time(
    entries: list[RowWeight], now: Callable[..., Tensor], ours: Callable[..., Tensor]
) -> tuple[float, float]:
    """Median ms of one row and of two (one stream's step, two streams') through every weight of
    ``entries`` with ``now`` and with ``ours`` (each called as ``fn(x, module, weight, bias)``), alternated."""
    ks = {int(w.shape[1]) for _, w, _ in entries}
    xs = [{k: torch.randn(rows, 1, k) for k in ks} for rows in (1, 2)]

    def run(fn: Callable[..., Tensor]) -> None:
        for x in xs:
            for m, w, b in entries:
                fn(x[int(w.shape[1])], m, w, b)

    return time_both(lambda: run(now), lambda: run(ours))


def choose(talker: nn.Module, code_predictor_layers: nn.Module, wanted: bool | None) -> dict[str, object]:
    """Put the float32 decode rows of ``talker`` on these kernels where they give the BLAS's bits.

    Every Linear runs its one-row products on :func:`linear`; the code predictor's layers (15 steps a
    frame: most of a frame's weight reads) on :func:`packed_linear` through packed copies of their
    weights; both also take the rows of a batched step (up to :data:`voxcast.kernels.rows_linear.F32_ROWS_MAX`
    streams), each row getting the bits it gets alone. Both need :func:`matches_blas` on every weight
    they serve (all checked). With ``wanted`` True or None (auto) the row kernel is taken wherever the
    bits match: not by a timing, because for a batched step's rows the path it replaces (oneDNN, or
    the BLAS's many-row product) rounds differently, and a timing depends on the host's load. The
    packed copies compute the same bits as the row kernel, so with None they are taken only where one
    and two rows measure at most :data:`_MARGIN` of its time (they cost memory); False: neither.

    Returns what was checked, timed and chosen: ``{"bitwise", "rows", "packed", "packed_mb", ...}``.
    """
    entries = row_weights(talker)
    cp = row_weights(code_predictor_layers)
    out: dict[str, object] = {"rows": False, "packed": False, "packed_mb": 0.0}
    if wanted is False or not available():
        return out
    out["bitwise"] = bitwise = all(matches_blas(w, b) for _, w, b in entries)
    if not bitwise:
        logger.info("float32 row kernel: this CPU's BLAS sums in another order; using PyTorch's")
        return out
    out["rows"] = True

    def rows(x: Tensor, m: nn.Module, w: Tensor, b: Tensor | None) -> Tensor:
        return linear(x, w, b)

    packed = [pack(w) for _, w, _ in cp] if cp and all(_packable(w) for _, w, _ in cp) else []
    if packed and all(matches_blas(w, b, p) for (_, w, b), p in zip(cp, packed, strict=True)):
        if wanted is None:
            by_id = {id(m): p for (m, _, _), p in zip(cp, packed, strict=True)}

            def packed_fn(x: Tensor, m: nn.Module, w: Tensor, b: Tensor | None) -> Tensor:
                return packed_linear(x, by_id[id(m)], b)

            out["rows_ms"], out["packed_ms"] = _time(cp, rows, packed_fn)
            out["packed"] = out["packed_ms"] <= _MARGIN * out["rows_ms"]  # type: ignore[operator]
        else:
            out["packed"] = True
    for m, _, _ in entries:
        m.f32_rows = bool(out["rows"])  # type: ignore[assignment]
    if out["packed"]:
        for (m, _, _), p in zip(cp, packed, strict=True):
            m.row_packed = p  # type: ignore[assignment]
        out["packed_mb"] = sum(p.weight.numel() * 4 for p in packed) / 1e6
    logger.info(
        "float32 decode rows: voxcast's row kernel %s, the code predictor's packed weights %s (+%.0f MB)",
        "on" if out["rows"] else "off",
        "on" if out["packed"] else "off",
        out["packed_mb"],
    )
    return out
