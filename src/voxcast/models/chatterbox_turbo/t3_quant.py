"""int8 weights for T3 on the CPU (``VOXCAST_QUANT=int8``): the GPT-2 blocks' four projections.

A T3 decode step reads every block's weights once per token (24 layers x 12.6 M at full size:
1.2 GB in float32), so on a CPU it is bound by memory bandwidth; int8 weights read a quarter of
that. Each ``c_attn``, ``c_proj``, ``c_fc`` and ``c_proj`` (GPT-2's ``Conv1D``, weight stored
``[in, out]``) becomes a :class:`voxcast.kernels.int8_linear.Int8Linear` (per-output-channel int8
weights; fbgemm for prefills and wide batches, voxcast's kernel for one or two decode rows wherever
it builds: a fixed rule, since the two round differently). Layer norms, embeddings, the position
table and ``speech_head`` (one 6563 x 1024 matrix a token, 2 % of the reads) stay as loaded.

Not bit-exact: the logits move by the weights' rounding, so sampled tokens follow another path
after the first draw they change. docs/chatterbox-turbo.md gives the measured difference
(``scripts/bench_turbo_quant.py``). S3Gen and HiFT keep their float weights.
"""

from __future__ import annotations

import logging
import time
from typing import cast

from torch import Tensor

from voxcast.kernels.int8_linear import Int8Linear, choose_int8_kernel
from voxcast.models.chatterbox_turbo.gpt2 import Block, Conv1D
from voxcast.models.chatterbox_turbo.t3 import T3

__all__ = ["quantize_t3", "store_identity"]

log = logging.getLogger(__name__)


def store_identity(identity: str) -> str:
    """The int8 store's key for a Turbo checkpoint's T3 (:mod:`voxcast.kernels.int8_store`)."""
    return f"chatterbox_turbo.t3:{identity}"


def quantize_t3(
    t3: T3, kernel: bool | None = None, stored: dict[str, Tensor] | None = None
) -> dict[str, object]:
    """Replace T3's block projections with int8 Linears, in place (CPU only).

    Args:
        kernel: decode rows on voxcast's kernel: True or None (where it builds), False (fbgemm only).
        stored: the int8 store's tensors for this checkpoint (:mod:`voxcast.kernels.int8_store`):
            the Linears are read from them, bitwise what quantizing gives, without quantizing.

    Returns:
        What was done, for the runtime report: ``linears``, ``seconds``, ``kernel`` (used or not)
        and ``variant``.

    Raises:
        ValueError: T3 is not on the CPU.
    """
    if t3.speech_head.weight.device.type != "cpu":
        raise ValueError("int8 weights are implemented for the CPU only")
    t0 = time.perf_counter()
    n = 0
    blocks = [cast(Block, b) for b in t3.tfmr.h]
    for i, block in enumerate(blocks):
        for parent, path in (
            (block.attn, "attn.c_attn"),
            (block.attn, "attn.c_proj"),
            (block.mlp, "mlp.c_fc"),
            (block.mlp, "mlp.c_proj"),
        ):
            attr, name = path.split(".")[1], f"tfmr.h.{i}.{path}"
            conv = getattr(parent, attr)
            if not isinstance(conv, Conv1D):
                continue
            if stored is not None and f"{name}.int8" in stored:
                linear = Int8Linear.from_stored(stored, name)
            else:
                linear = Int8Linear.of(conv.weight.t(), conv.bias)
            setattr(parent, attr, linear)  # the float original is dropped with it
            n += 1
    choice = choose_int8_kernel(t3, kernel)
    report: dict[str, object] = {"linears": n, **{k: v for k, v in choice.items() if v is not None}}
    report["seconds"] = round(time.perf_counter() - t0, 3)
    log.info(
        "T3: %d projections quantized to int8 in %.2f s (decode rows on %s)",
        n,
        report["seconds"],
        "voxcast's kernel" if report["kernel"] else "fbgemm",
    )
    return report
