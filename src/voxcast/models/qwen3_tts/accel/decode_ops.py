"""Fused element-wise steps of a decoder layer for float32 on the CPU (C++, ``decode_ops.cpp``).

A decode step's vectors are a few KB, so an RMSNorm (~7 PyTorch operations) or a rotary embedding
(~7 more) costs its dispatch, ~2-3 us an operation on these CPUs, not its arithmetic; a frame runs
~100 decoder layers with four norms, two rotary embeddings and an attention each. C++ operations
replace them:

- ``voxcast::rms_norm(x, w, eps)``: :class:`.talker.RMSNorm`.
- ``voxcast::norm_rope(x, w, cos, sin, eps, head_dim)``: the per-head q/k norm and the rotary
  embedding of :class:`.talker.Attention`, from the fused projection's view straight to the
  ``[B, H, L, D]`` layout attention takes.
- ``voxcast::decode_attention(q, k, v, scale)``: the grouped-query attention of up to
  :data:`.talker.FUSED_ATTENTION_ROWS` positions over their cache (PyTorch's
  ``scaled_dot_product_attention`` costs 18-60 us a call here, most of it set-up), straight to the
  ``[B, L, H * D]`` layout of the output projection.

Sums are accumulated in another order than PyTorch's (the norms' sum of squares in double), so
values differ from the eager operations in the last bits: they are on with int8 weights (not
bit-exact anyway) and off for float32 weights, whose decode matches the official implementation
bitwise. They are built into the int8 kernel's library (:func:`voxcast.kernels.native.load`).
"""

from __future__ import annotations

import torch
from torch import nn

from voxcast.kernels import native as int8_kernel
from voxcast.models.qwen3_tts.talker import Attention, RMSNorm

__all__ = ["available", "use_fused_ops"]


def available() -> bool:
    """Whether the operations are built and loaded (x86-64 with AVX2 and a C++ compiler)."""
    return int8_kernel.load()


def use_fused_ops(module: nn.Module, on: bool) -> int:
    """Run every float32 :class:`.talker.RMSNorm`, and :class:`.talker.Attention`'s q/k norm, rotary
    embedding and decode-step attention, in ``module`` on the fused operations (on) or PyTorch's
    (off); returns how many modules switched. ``on`` needs :func:`available`."""
    n = 0
    for m in module.modules():
        if isinstance(m, RMSNorm):
            w = m.weight
        elif isinstance(m, Attention):
            w = m.q_norm.weight
        else:
            continue
        m.fused = on and w.dtype == torch.float32 and w.device.type == "cpu"
        n += int(m.fused)
    return n
