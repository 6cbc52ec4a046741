"""The transformer blocks the talker and the code predictor share (Qwen3): RMSNorm, RoPE tables,
grouped-query attention, the SwiGLU MLP and the pre-norm decoder layer.

Parameter names equal the official checkpoint's keys (``...layers.N.self_attn.q_proj`` etc.).
Numerics follow the official implementation operation by operation (RMSNorm in float32 then cast,
RoPE tables computed in float32 with the same tensor shapes, SDPA called the way transformers'
"sdpa" attention calls it), so that greedy decoding reproduces the official codes exactly. The
talker's "multimodal" RoPE has three equal position rows, which makes it plain 1-D RoPE; the
interleaving is still replayed so that every cos/sin value comes out of the same kernel lane.

Plain torch: the speed-ups of :mod:`voxcast.models.qwen3_tts.accel` swap or wrap these modules at
load; nothing here imports them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.kernels.rows_linear import FusedLinear, Linear
from voxcast.models.qwen3_tts.config import CodePredictorConfig, TalkerConfig
from voxcast.models.qwen3_tts.kv_cache import KVCache

__all__ = [
    "MLP",
    "Attention",
    "DecoderLayer",
    "RMSNorm",
    "decoder_layers",
    "rope_cos_sin",
    "rope_inv_freq",
]


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 and cast back before the weight (as Qwen3)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:  # the same ops without two no-op conversions
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float) -> Tensor:
    """Inverse frequencies ``[head_dim / 2]`` (float32), as transformers' default RoPE computes them."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    return 1.0 / (theta**exponent)


def rope_cos_sin(
    inv_freq: Tensor,
    positions: Tensor,
    dtype: torch.dtype,
    mrope_section: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor]:
    """cos/sin tables ``[1, L, D]`` for ``positions [L]``.

    With ``mrope_section`` the talker's interleaved multimodal layout is replayed over three equal
    position rows (same values as 1-D RoPE, same kernels as the official code).
    """
    inv = inv_freq.to(device=positions.device, dtype=torch.float32)
    if mrope_section is None:
        pos = positions.view(1, 1, -1).float()  # [1, 1, L]
        freqs = (inv[None, :, None] @ pos).transpose(1, 2)  # [1, L, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)
    n_rows = len(mrope_section)
    pos = positions.view(1, 1, 1, -1).expand(n_rows, 1, 1, -1).float()  # [3, 1, 1, L]
    inv_e = inv[None, None, :, None].expand(n_rows, 1, -1, 1)  # [3, 1, D/2, 1]
    freqs = (inv_e @ pos).transpose(2, 3)  # [3, 1, L, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return _interleave(emb.cos(), mrope_section).to(dtype), _interleave(emb.sin(), mrope_section).to(dtype)


def _interleave(table: Tensor, section: tuple[int, ...]) -> Tensor:
    # table: [3, 1, L, D] -> [1, L, D]; lane j of the first half comes from row j % 3 (if in range).
    half = table[..., : table.shape[-1] // 2]
    out = half[0].clone()
    n = len(section)
    for i, width in enumerate(section[1:], 1):
        out[..., i : width * n : n] = half[i, ..., i : width * n : n]
    return torch.cat([out, out], dim=-1)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention with per-head q/k RMSNorm (Qwen3).

    ``qkv``: the q, k and v projections as one matmul once :meth:`fuse` ran (a
    :class:`~voxcast.kernels.rows_linear.FusedLinear`), or whatever module the accel step puts in
    that place (int8 weights); None: three matmuls, as the reference.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.qkv: nn.Module | None = None

    def fuse(self) -> None:
        """Read q, k and v with one matmul: the projections become views of one ``[Nq + 2 Nkv, hidden]``
        (bitwise the same values, see :class:`~voxcast.kernels.rows_linear.FusedLinear`)."""
        self.qkv = FusedLinear(self.q_proj, self.k_proj, self.v_proj)

    def row_weights(self) -> list[tuple[nn.Module, Tensor, Tensor | None]]:
        """``(module, weight, bias)`` of each matmul a decode row runs: the fused q/k/v (held by this
        module) or q, k and v, then the output projection."""
        if isinstance(self.qkv, FusedLinear):
            return [*self.qkv.row_weights(), *self.o_proj.row_weights()]
        return [
            *self.q_proj.row_weights(),
            *self.k_proj.row_weights(),
            *self.v_proj.row_weights(),
            *self.o_proj.row_weights(),
        ]

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [B, L, hidden] -> q [B, L, Nq], k/v [B, L, Nkv] (views of one output when fused)
        if self.qkv is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        qkv = self.qkv(x)
        nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]

    def _qkv_rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x: [B, L, hidden]; cos/sin: [B or 1, 1, L, D] -> q [B, H, L, D], k/v [B, Hkv, L, D]
        q, k, v = self._project(x)
        return self._norm_rope(q, k, v, cos, sin)

    def _norm_rope(
        self, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        # q [B, L, Nq], k/v [B, L, Nkv] -> q [B, H, L, D], k/v [B, Hkv, L, D]
        b, n, _ = q.shape
        q = self.q_norm(q.view(b, n, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(k.view(b, n, -1, self.head_dim)).transpose(1, 2)
        v = v.view(b, n, -1, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, start: int) -> Tensor:
        # x: [B, L, hidden]; cos/sin: [1, 1, L, D]
        q, k, v = self._qkv_rope(x, cos, sin)
        k_all, v_all = cache.update(start, k, v)  # [B, Hkv, start + L, D]
        return self.o_proj(self._attend(q, k_all, v_all, start))

    def _attend(self, q: Tensor, k_all: Tensor, v_all: Tensor, start: int) -> Tensor:
        """Attention of q ``[B, H, L, D]`` at positions ``start..`` over its cache -> ``[B, L, H * D]``."""
        b, _, n, _ = q.shape
        mask = None
        if n > 1 and start > 0:  # a chunk after a cached prefix: causal, shifted by `start`
            rows = torch.arange(start, start + n, device=q.device)[:, None]
            mask = rows >= torch.arange(start + n, device=q.device)[None, :]
        out = F.scaled_dot_product_attention(
            q,
            k_all,
            v_all,
            attn_mask=mask,
            is_causal=bool(n > 1 and start == 0),  # bool(): a Python value even when traced
            scale=self.head_dim**-0.5,
            enable_gqa=self.heads != self.kv_heads,
        )
        return out.transpose(1, 2).reshape(b, n, -1)

    def forward_rows(
        self, x: Tensor, cos: Tensor, sin: Tensor, caches: list[KVCache], starts: list[int]
    ) -> Tensor:
        """One decode position for each of B independent sequences (own cache, own position).

        Projections run batched (weights read once for all rows); attention runs per row over its
        own cache. x: ``[B, 1, hidden]``; cos/sin: ``[B, 1, 1, D]``.
        """
        b = x.shape[0]
        q, k, v = self._qkv_rope(x, cos, sin)
        outs = []
        for i, (cache, start) in enumerate(zip(caches, starts, strict=True)):
            k_all, v_all = cache.update(start, k[i : i + 1], v[i : i + 1])
            outs.append(self._attend_row(q[i : i + 1], k_all, v_all))
        return self.o_proj(torch.cat(outs) if b > 1 else outs[0])  # [B, 1, H * D]

    def _attend_row(self, q: Tensor, k_all: Tensor, v_all: Tensor) -> Tensor:
        """One decode position's attention over its own cache: q ``[1, H, 1, D]`` -> ``[1, 1, H * D]``."""
        out = F.scaled_dot_product_attention(
            q, k_all, v_all, scale=self.head_dim**-0.5, enable_gqa=self.heads != self.kv_heads
        )
        return out.transpose(1, 2).reshape(1, 1, -1)


class MLP(nn.Module):
    """SwiGLU feed-forward. ``gate_up``: the gate and up projections as one matmul (see :class:`Attention`)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=False)
        self.up_proj = Linear(hidden, intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)
        self.gate_up: nn.Module | None = None

    def fuse(self) -> None:
        """Gate and up projections as one matmul (bitwise the same outputs, see :meth:`Attention.fuse`)."""
        self.gate_up = FusedLinear(self.gate_proj, self.up_proj)

    def row_weights(self) -> list[tuple[nn.Module, Tensor, Tensor | None]]:
        """``(module, weight, bias)`` of each matmul a decode row runs (see :meth:`Attention.row_weights`)."""
        if isinstance(self.gate_up, FusedLinear):
            return [*self.gate_up.row_weights(), *self.down_proj.row_weights()]
        return [*self.gate_proj.row_weights(), *self.up_proj.row_weights(), *self.down_proj.row_weights()]

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, eps, bias)
        self.mlp = MLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, start: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_rows(
        self, x: Tensor, cos: Tensor, sin: Tensor, caches: list[KVCache], starts: list[int]
    ) -> Tensor:
        """See :meth:`Attention.forward_rows`."""
        x = x + self.self_attn.forward_rows(self.input_layernorm(x), cos, sin, caches, starts)
        return x + self.mlp(self.post_attention_layernorm(x))

    def fuse(self) -> None:
        """Fuse the q/k/v and gate/up projections (see :meth:`Attention.fuse`)."""
        self.self_attn.fuse()
        self.mlp.fuse()


def decoder_layers(cfg: TalkerConfig | CodePredictorConfig) -> nn.ModuleList:
    """The ``num_hidden_layers`` decoder layers of a talker or code-predictor config."""
    return nn.ModuleList(
        DecoderLayer(
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.rms_norm_eps,
            cfg.attention_bias,
        )
        for _ in range(cfg.num_hidden_layers)
    )
