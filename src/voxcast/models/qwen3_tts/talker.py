"""The talker: a Qwen3 decoder over codec frames, plus the transformer blocks shared with the code predictor.

Parameter names equal the official checkpoint's ``talker.*`` keys, so ``model.safetensors`` loads
into :class:`Talker` with ``strict=True``. Attention keeps its keys/values in a preallocated
:class:`KVCache` (gpt-fast style) instead of growing tensors.

Numerics follow the official implementation operation by operation (RMSNorm in float32 then cast,
RoPE tables computed in float32 with the same tensor shapes, SDPA called the way transformers'
"sdpa" attention calls it), so that greedy decoding reproduces the official codes exactly. The
talker's "multimodal" RoPE has three equal position rows, which makes it plain 1-D RoPE; the
interleaving is still replayed so that every cos/sin value comes out of the same kernel lane.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.models.qwen3_tts.config import TalkerConfig

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.code_predictor import CodePredictor

__all__ = [
    "Attention",
    "DecoderLayer",
    "KVCache",
    "RMSNorm",
    "Talker",
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
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class KVCache:
    """Preallocated keys/values of one attention layer: ``[B, H_kv, S_max, D]`` each."""

    def __init__(
        self,
        batch: int,
        heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (batch, heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def max_len(self) -> int:
        """Positions this cache can hold."""
        return self.k.shape[2]

    def update(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k, v [B, H_kv, L, D]`` at ``start`` and return views of positions ``[0, start + L)``."""
        end = start + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: position {end} > {self.max_len}")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


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
    """Grouped-query attention with per-head q/k RMSNorm (Qwen3)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float, bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, start: int) -> Tensor:
        # x: [B, L, hidden]; cos/sin: [1, L, D]
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, -1, self.head_dim)).transpose(1, 2)  # [B, H, L, D]
        k = self.k_norm(self.k_proj(x).view(b, n, -1, self.head_dim)).transpose(1, 2)  # [B, Hkv, L, D]
        v = self.v_proj(x).view(b, n, -1, self.head_dim).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        k_all, v_all = cache.update(start, k, v)  # [B, Hkv, start + L, D]
        mask = None
        if n > 1 and start > 0:  # a chunk after a cached prefix: causal, shifted by `start`
            rows = torch.arange(start, start + n, device=x.device)[:, None]
            mask = rows >= torch.arange(start + n, device=x.device)[None, :]
        out = F.scaled_dot_product_attention(
            q,
            k_all,
            v_all,
            attn_mask=mask,
            is_causal=n > 1 and start == 0,
            scale=self.head_dim**-0.5,
            enable_gqa=self.heads != self.kv_heads,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


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


class ResizeMLP(nn.Module):
    """``text_projection``: Linear + SiLU + Linear (with biases), text width -> talker width."""

    def __init__(self, d_in: int, d_mid: int, d_out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(d_in, d_mid, bias=True)
        self.linear_fc2 = nn.Linear(d_mid, d_out, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerBackbone(nn.Module):
    """``talker.model``: embeddings, decoder layers, final norm."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__()
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.layers = nn.ModuleList(
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
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Talker(nn.Module):
    """``talker``: the backbone, ``text_projection``, ``codec_head`` and the ``code_predictor``."""

    inv_freq: Tensor

    def __init__(self, cfg: TalkerConfig, code_predictor: CodePredictor) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerBackbone(cfg)
        self.text_projection = ResizeMLP(cfg.text_hidden_size, cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Given by the caller (code_predictor.py builds on this module's blocks).
        self.code_predictor = code_predictor
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self._section = cfg.mrope_section if cfg.mrope_interleaved else None

    def text_embed(self, ids: Tensor) -> Tensor:
        """``T(ids)``: text embedding then projection. ``ids [B, L]`` -> ``[B, L, hidden]``."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: Tensor) -> Tensor:
        """``C(ids)``: the talker's codec embedding (code group 0 and special codec ids)."""
        return self.model.codec_embedding(ids)

    def new_cache(self, max_len: int, *, batch: int = 1) -> list[KVCache]:
        """One preallocated :class:`KVCache` per layer, for ``max_len`` positions."""
        c = self.cfg
        w = self.codec_head.weight
        return [
            KVCache(batch, c.num_key_value_heads, max_len, c.head_dim, dtype=w.dtype, device=w.device)
            for _ in range(c.num_hidden_layers)
        ]

    def forward(self, embeds: Tensor, cache: list[KVCache], start: int) -> tuple[Tensor, Tensor]:
        """Run positions ``[start, start + L)``.

        Args:
            embeds: ``[B, L, hidden]`` input embeddings.
            cache: from :meth:`new_cache`; positions before ``start`` must be filled.
            start: absolute position of ``embeds[:, 0]``.

        Returns:
            ``(hidden [B, L, hidden] after the final norm, logits [B, L, vocab])``.
        """
        positions = torch.arange(start, start + embeds.shape[1], device=embeds.device)
        cos, sin = rope_cos_sin(self.inv_freq, positions, embeds.dtype, self._section)
        h = embeds
        for layer, layer_cache in zip(self.model.layers, cache, strict=True):
            h = layer(h, cos, sin, layer_cache, start)
        h = self.model.norm(h)
        return h, self.codec_head(h)
