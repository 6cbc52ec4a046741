"""int8 weights for T3 on the CPU (``VOXCAST_QUANT=int8``): the GPT-2 blocks' four projections.

A T3 decode step reads every block's weights once per token (24 layers x 12.6 M at full size:
1.2 GB in float32), so on a CPU it is bound by memory bandwidth; int8 weights read a quarter of
that. Each ``c_attn``, ``c_proj``, ``c_fc`` and ``c_proj`` (GPT-2's ``Conv1D``, weight stored
``[in, out]``) becomes a :class:`voxcast.kernels.int8_linear.Int8Linear` (per-output-channel int8
weights; fbgemm for prefills and wide batches, voxcast's kernel for one or two decode rows where it
measures faster at load). Layer norms, embeddings, the position table and ``speech_head`` (one
6563 x 1024 matrix a token, 2 % of the reads) stay as loaded.

Not bit-exact: the logits move by the weights' rounding, so sampled tokens follow another path
after the first draw they change. docs/chatterbox-turbo.md gives the measured difference
(``scripts/bench_turbo_quant.py``). S3Gen and HiFT keep their float weights.
"""

from __future__ import annotations

import logging
import time
from typing import cast

from voxcast.kernels import native
from voxcast.kernels.int8_linear import Int8Linear, kernel_faster, use_int8_kernel
from voxcast.models.chatterbox_turbo.gpt2 import Block, Conv1D
from voxcast.models.chatterbox_turbo.t3 import T3

__all__ = ["quantize_t3"]

log = logging.getLogger(__name__)


def _int8(conv: Conv1D) -> Int8Linear:
    return Int8Linear.of(conv.weight.t(), conv.bias)


def quantize_t3(t3: T3, kernel: bool | None = None) -> dict[str, object]:
    """Replace T3's block projections with int8 Linears, in place (CPU only).

    Args:
        kernel: decode rows on voxcast's kernel: True (where it builds), False (fbgemm only), None
            (where it builds and measures faster than fbgemm on this CPU).

    Returns:
        What was done, for the runtime report: ``linears``, ``seconds``, ``kernel`` (used or not),
        ``variant`` and, when measured, ``timing``.

    Raises:
        ValueError: T3 is not on the CPU.
    """
    if t3.speech_head.weight.device.type != "cpu":
        raise ValueError("int8 weights are implemented for the CPU only")
    t0 = time.perf_counter()
    n = 0
    blocks = [cast(Block, b) for b in t3.tfmr.h]
    for block in blocks:
        for parent, name in (
            (block.attn, "c_attn"),
            (block.attn, "c_proj"),
            (block.mlp, "c_fc"),
            (block.mlp, "c_proj"),
        ):
            conv = getattr(parent, name)
            if isinstance(conv, Conv1D):
                setattr(parent, name, _int8(conv))  # the float original is dropped with it
                n += 1
    report: dict[str, object] = {"linears": n, "kernel": False}
    if kernel is not False and native.load():
        variant = native.resolve(None)
        use_int8_kernel(t3, True, variant)
        report["variant"] = variant
        use = True
        if kernel is None:
            fcs: list[object] = [block.mlp.c_fc for block in blocks]
            timing = kernel_faster([m for m in fcs if isinstance(m, Int8Linear)], "T3 int8 decode row")
            report["timing"] = timing
            use = bool(timing["voxcast"])
        if not use:
            use_int8_kernel(t3, False)
        report["kernel"] = use
    report["seconds"] = round(time.perf_counter() - t0, 3)
    log.info(
        "T3: %d projections quantized to int8 in %.2f s (decode rows on %s)",
        n,
        report["seconds"],
        "voxcast's kernel" if report["kernel"] else "fbgemm",
    )
    return report
