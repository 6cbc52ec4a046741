"""Fused element-wise steps of a decoder layer for float32 on the CPU (C++, ``decode_ops.cpp``).

A decode step's vectors are a few KB, so an RMSNorm (~7 PyTorch operations) or a rotary embedding
(~7 more) costs its dispatch, ~2-3 us an operation on these CPUs, not its arithmetic; a frame runs
~100 decoder layers with four norms, two rotary embeddings and an attention each. C++ operations
replace them:

- ``voxcast::rms_norm(x, w, eps)``: :class:`.layers.RMSNorm`.
- ``voxcast::norm_rope(x, w, cos, sin, eps, head_dim)``: the per-head q/k norm and the rotary
  embedding of :class:`.layers.Attention`, from the fused projection's view straight to the
  ``[B, H, L, D]`` layout attention takes.
- ``voxcast::decode_attention(q, k, v, scale)``: the grouped-query attention of up to
  :data:`FUSED_ATTENTION_ROWS` positions over their cache (PyTorch's
  ``scaled_dot_product_attention`` costs 18-60 us a call here, most of it set-up), straight to the
  ``[B, L, H * D]`` layout of the output projection.

Sums are accumulated in another order than PyTorch's (the norms' sum of squares in double), so
values differ from the eager operations in the last bits: they are on with int8 weights (not
bit-exact anyway) and off for float32 weights, whose decode matches the official implementation
bitwise. They are built into the int8 kernel's library (:func:`voxcast.kernels.native.load`).

The model's layers know nothing of them: :func:`use_fused_ops` turns a float32 CPU
:class:`.layers.RMSNorm` or :class:`.layers.Attention` into its fused subclass here, in place
(same parameters, same state), and back.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from voxcast.kernels import native as int8_kernel
from voxcast.models.qwen3_tts.layers import Attention, RMSNorm

__all__ = ["FUSED_ATTENTION_ROWS", "FusedAttention", "FusedRMSNorm", "available", "is_fused", "use_fused_ops"]

#: Most query positions a fused attention call takes (a decode step, the code predictor's two-position
#: first step, a short prefill chunk); longer prefills keep PyTorch's blocked attention.
FUSED_ATTENTION_ROWS = 4


class FusedRMSNorm(RMSNorm):
    """:class:`.layers.RMSNorm` on ``voxcast::rms_norm`` for float32 rows."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            return torch.ops.voxcast.rms_norm(x, self.weight, self.eps)
        return super().forward(x)


class FusedAttention(Attention):
    """:class:`.layers.Attention` with its float32 q/k norm + rotary embedding and decode-step
    attention on voxcast's fused operations."""

    def _norm_rope(
        self, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        if q.dtype != torch.float32:
            return super()._norm_rope(q, k, v, cos, sin)
        b, n, _ = q.shape
        hd, nq, nk = self.head_dim, self.q_norm, self.k_norm
        q = torch.ops.voxcast.norm_rope(q, nq.weight, cos, sin, nq.eps, hd)
        k = torch.ops.voxcast.norm_rope(k, nk.weight, cos, sin, nk.eps, hd)
        return q, k, v.view(b, n, -1, hd).transpose(1, 2)

    def _attend(self, q: Tensor, k_all: Tensor, v_all: Tensor, start: int) -> Tensor:
        if q.shape[2] <= FUSED_ATTENTION_ROWS and q.dtype == torch.float32:  # straight to [B, L, H * D]
            return torch.ops.voxcast.decode_attention(q, k_all, v_all, self.head_dim**-0.5)
        return super()._attend(q, k_all, v_all, start)

    def _attend_row(self, q: Tensor, k_all: Tensor, v_all: Tensor) -> Tensor:
        if q.dtype == torch.float32:  # [1, 1, H * D]
            return torch.ops.voxcast.decode_attention(q, k_all, v_all, self.head_dim**-0.5)
        return super()._attend_row(q, k_all, v_all)


_FUSED: dict[type[nn.Module], type[nn.Module]] = {RMSNorm: FusedRMSNorm, Attention: FusedAttention}
_PLAIN = {v: k for k, v in _FUSED.items()}


def available() -> bool:
    """Whether the operations are built and loaded (x86-64 with AVX2 and a C++ compiler)."""
    return int8_kernel.load()


def is_fused(module: nn.Module) -> bool:
    """Whether ``module`` runs on the fused operations."""
    return type(module) in _PLAIN


def use_fused_ops(module: nn.Module, on: bool) -> int:
    """Run every float32 CPU :class:`.layers.RMSNorm`, and :class:`.layers.Attention`'s q/k norm,
    rotary embedding and decode-step attention, in ``module`` on the fused operations (on) or
    PyTorch's (off); returns how many modules run fused. ``on`` needs :func:`available`.

    The switch changes each module's class in place (its subclass here, or back), so parameters,
    caches and references to the module stay as they are.
    """
    n = 0
    for m in module.modules():
        plain = _PLAIN.get(type(m), type(m))
        if plain not in _FUSED:
            continue
        w = m.weight if isinstance(m, RMSNorm) else m.q_norm.weight  # type: ignore[union-attr]
        fused = on and w.dtype == torch.float32 and w.device.type == "cpu"
        m.__class__ = _FUSED[plain] if fused else plain
        n += int(fused)
    return n
