"""T3's backbone: GPT-2 (pre-norm blocks, learned absolute positions, tanh-approximated GELU), written
to compute what ``transformers``' ``GPT2Model`` computes, operation for operation (the parity tests
compare tokens), with a key/value cache per layer that decoding appends to."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.models.chatterbox_turbo.config import T3Config

__all__ = ["GPT2", "KVCache"]


class Conv1D(nn.Module):
    """GPT-2's projection: a Linear whose weight is stored ``[in, out]`` (the checkpoint's layout)."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x: Tensor) -> Tensor:
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], out.shape[-1])


def new_gelu(x: Tensor) -> Tensor:
    """GPT-2's GELU (the tanh approximation), as ``transformers`` writes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@dataclass
class KVCache:
    """Keys and values of the positions run so far, one ``[B, heads, T, head_dim]`` pair per layer."""

    keys: list[Tensor | None] = field(default_factory=list)
    values: list[Tensor | None] = field(default_factory=list)

    @property
    def length(self) -> int:
        k = self.keys[0] if self.keys else None
        return 0 if k is None else int(k.shape[2])

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            k, v = torch.cat((old_k, k), dim=-2), torch.cat((old_v, v), dim=-2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def clone(self) -> KVCache:
        """An independent copy (a cached voice prefix is cloned before a request extends it)."""
        return KVCache([None if k is None else k.clone() for k in self.keys],
                       [None if v is None else v.clone() for v in self.values])  # fmt: skip


class Attention(nn.Module):
    def __init__(self, cfg: T3Config) -> None:
        super().__init__()
        self.heads, self.width = cfg.heads, cfg.width
        self.head_dim = cfg.width // cfg.heads
        self.c_attn = Conv1D(cfg.width, 3 * cfg.width)
        self.c_proj = Conv1D(cfg.width, cfg.width)

    def forward_rows(self, x: Tensor, caches: list[KVCache], layer: int) -> Tensor:
        """One new position for each of several streams ``x [B, 1, width]``, each with its own cache
        (of any length): the projections run on all rows at once, the attention per stream."""
        q, k, v = self.c_attn(x).split(self.width, dim=2)
        shape = (x.shape[0], 1, -1, self.head_dim)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        outs = []
        for i, cache in enumerate(caches):
            ki, vi = cache.append(layer, k[i : i + 1], v[i : i + 1])
            outs.append(F.scaled_dot_product_attention(q[i : i + 1], ki, vi))
        out = torch.cat(outs).transpose(1, 2).contiguous()
        return self.c_proj(out.reshape(x.shape[0], 1, -1).contiguous())

    def forward(self, x: Tensor, cache: KVCache, layer: int) -> Tensor:
        q, k, v = self.c_attn(x).split(self.width, dim=2)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        k, v = cache.append(layer, k, v)
        n, total = q.shape[2], k.shape[2]
        if n > 1 and total > n:  # several positions after cached ones: PyTorch's is_causal would align
            # the mask top-left (query i sees keys 0..i), so the mask is written out (bottom-right)
            mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(total - n)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1)
        out = out.transpose(1, 2).contiguous()
        return self.c_proj(out.reshape(*out.shape[:-2], -1).contiguous())


class MLP(nn.Module):
    def __init__(self, cfg: T3Config) -> None:
        super().__init__()
        self.c_fc = Conv1D(cfg.width, 4 * cfg.width)
        self.c_proj = Conv1D(4 * cfg.width, cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(new_gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: T3Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x: Tensor, cache: KVCache, layer: int) -> Tensor:
        x = self.attn(self.ln_1(x), cache, layer) + x
        return x + self.mlp(self.ln_2(x))

    def forward_rows(self, x: Tensor, caches: list[KVCache], layer: int) -> Tensor:
        x = self.attn.forward_rows(self.ln_1(x), caches, layer) + x
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 without its token embedding (T3 feeds embeddings): ``wpe``, ``h.N``, ``ln_f``."""

    def __init__(self, cfg: T3Config) -> None:
        super().__init__()
        self.wpe = nn.Embedding(cfg.positions, cfg.width)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width, eps=cfg.eps)

    def forward(self, embeds: Tensor, cache: KVCache) -> Tensor:
        """Hidden states ``[B, L, width]`` (after ``ln_f``) of ``embeds`` ``[B, L, width]``, placed after the
        positions ``cache`` holds; ``cache`` is extended."""
        start = cache.length
        positions = torch.arange(start, start + embeds.shape[1], device=embeds.device).unsqueeze(0)
        x = embeds + self.wpe(positions)
        for i, block in enumerate(self.h):
            x = block(x, cache, i)
        return self.ln_f(x)

    def forward_rows(self, embeds: Tensor, caches: list[KVCache]) -> Tensor:
        """Hidden states ``[B, 1, width]`` of one new position per stream (``embeds [B, 1, width]``),
        stream ``i`` continuing ``caches[i]`` (extended). The weights are read once for all rows;
        a row's values equal its one-stream step's up to float rounding (a multi-row matrix product
        may sum in another order)."""
        positions = torch.tensor([[c.length] for c in caches], device=embeds.device)
        x = embeds + self.wpe(positions)
        for i, block in enumerate(self.h):
            x = cast(Block, block).forward_rows(x, caches, i)
        return self.ln_f(x)
