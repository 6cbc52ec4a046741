"""S3Gen's meanflow estimator: the velocity of the mel at times (t, r) given the noisy mel, the encoder's
mu, the speaker and the prompt mel.

The official ``ConditionalDecoder`` as Turbo builds it (``S3Gen(meanflow=True)``): a one-level U-Net over
time. Its input is ``x | mu | speaker | cond`` (4 x 80 = 320 channels); one down block, 12 mid blocks and
one up block (the up block takes the down block's output as a skip), each a causal resnet block
conditioned on the time embedding and 4 transformer blocks (pre-norm, 8 heads x 64 = 512 wide inside a
256-wide stream, an exact-GELU feed-forward of 1024); the down and up blocks end with a causal k=3
convolution (no resampling with one level); a final causal block and a 1x1 projection to 80. The
convolutions are causal (left padded) but the attention sees every frame: one frame's velocity depends
on the whole sequence. Meanflow: t and r each go through the sinusoidal embedding and the time MLP, and
a bias-free linear mixes the two.

Module names follow the official ``flow.decoder.estimator`` of ``s3gen_meanflow.safetensors``; diffusers'
``Attention``/``FeedForward`` (attention without biases but the output's, dropout as identity) are
rewritten here. Batches of equal lengths (no padding), as the encoder: the official masks are all ones
then, multiplying by them changes nothing and the attention's padding bias is zero (PyTorch's CPU
attention gives the same bits with or without it; on a GPU leaving it out allows flash attention).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.errors import CheckpointError
from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache

__all__ = ["Estimator", "EstimatorConfig", "timestep_embedding"]

#: Upstream's head width (``attention_head_dim=64``); the checkpoint fixes heads = inner width / 64.
HEAD_DIM = 64


@dataclass(frozen=True)
class EstimatorConfig:
    """Widths; the defaults are Turbo's (upstream hard-codes them in ``S3Token2Mel.__init__``)."""

    in_channels: int = 320  # x | mu | speaker | cond, 80 each
    out_channels: int = 80
    channels: int = 256  # upstream's ``channels=[256]``: one U-Net level
    blocks: int = 4  # transformer blocks per U-Net block (``n_blocks``)
    mid_blocks: int = 12
    heads: int = 8
    head_dim: int = HEAD_DIM

    @property
    def time_dim(self) -> int:
        return 4 * self.channels

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor], prefix: str = "") -> EstimatorConfig:
        """The widths of an estimator state (its keys under ``prefix``, e.g. ``flow.decoder.estimator.``).

        Raises:
            CheckpointError: a tensor the widths are read from is missing.
        """
        try:
            first = tensors[prefix + "down_blocks.0.0.block1.block.0.weight"]  # [C, in, 3]
            q = tensors[prefix + "down_blocks.0.1.0.attn1.to_q.weight"]  # [heads * 64, C]
            out = tensors[prefix + "final_proj.weight"]
        except KeyError as e:
            raise CheckpointError(f"not an S3Gen estimator state: {e} is missing") from e

        def count(pattern: str) -> int:
            pattern = re.escape(prefix) + pattern
            return len({m.group(1) for k in tensors if (m := re.fullmatch(pattern, k))})

        return cls(
            in_channels=int(first.shape[1]),
            out_channels=int(out.shape[0]),
            channels=int(first.shape[0]),
            blocks=count(r"down_blocks\.0\.1\.(\d+)\.norm1\.weight"),
            mid_blocks=count(r"mid_blocks\.(\d+)\.0\.mlp\.1\.weight"),
            heads=int(q.shape[0]) // HEAD_DIM,
        )


def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """Matcha's ``SinusoidalPosEmb``: ``[B]`` times in [0, 1] -> ``[B, dim]`` (sin | cos of 1000 t
    times geometric frequencies), computed in float32 and returned in ``t``'s dtype."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    emb = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((emb.sin(), emb.cos()), dim=-1).to(t.dtype)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, time_dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(dim, time_dim)
        self.linear_2 = nn.Linear(time_dim, time_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class CausalConv1d(nn.Conv1d):
    """A stride-1 convolution padded by ``kernel - 1`` zeros on the left: frame i sees frames <= i."""

    def forward(self, x: Tensor, cache: PromptCache | None = None) -> Tensor:
        left = self.kernel_size[0] - 1
        return super().forward(F.pad(x, (left, 0)) if cache is None else cache.left_context(self, x, left))


class Transpose(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return torch.transpose(x, 1, 2)


class CausalBlock(nn.Module):
    """Causal k=3 convolution, LayerNorm over channels, Mish (``[B, C, T]``)."""

    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            CausalConv1d(dim, dim_out, 3), Transpose(), nn.LayerNorm(dim_out), Transpose(), nn.Mish()
        )

    def forward(self, x: Tensor, cache: PromptCache | None = None) -> Tensor:
        x = self.block[0](x, cache)
        for layer in list(self.block)[1:]:
            x = layer(x)
        return x


class CausalResnetBlock(nn.Module):
    """Two causal blocks, the time embedding added between them, a 1x1 residual convolution."""

    def __init__(self, dim: int, dim_out: int, time_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_dim, dim_out))
        self.block1 = CausalBlock(dim, dim_out)
        self.block2 = CausalBlock(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: Tensor, time: Tensor, cache: PromptCache | None = None) -> Tensor:
        h = self.block1(x, cache)
        h += self.mlp(time).unsqueeze(-1)
        return self.block2(h, cache) + self.res_conv(x)


class Attention(nn.Module):
    """diffusers' ``Attention`` with ``AttnProcessor2_0`` (self-attention, no q/k/v biases)."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, heads * head_dim, bias=False)
        self.to_k = nn.Linear(dim, heads * head_dim, bias=False)
        self.to_v = nn.Linear(dim, heads * head_dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(heads * head_dim, dim), nn.Identity()])

    def forward(self, x: Tensor, cache: PromptCache | None = None) -> Tensor:
        b = x.shape[0]
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        d = k.shape[-1] // self.heads
        q, k, v = (y.view(b, -1, self.heads, d).transpose(1, 2) for y in (q, k, v))  # [B, h, T, d]
        if cache is not None:
            k, v = cache.keys_values(self, k, v)  # reading: the prompt's frames first
        mask = None if cache is None else cache.key_mask(k.shape[2])  # rows of several streams
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, -1, self.heads * d)
        return self.to_out[0](out)


class GELUProj(nn.Module):
    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, inner)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.ModuleList([GELUProj(dim, mult * dim), nn.Identity(), nn.Linear(mult * dim, dim)])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.net:
            x = layer(x)
        return x


class TransformerBlock(nn.Module):
    """Matcha's ``BasicTransformerBlock`` as the decoder builds it: pre-norm self-attention, then a
    pre-norm GELU feed-forward (``[B, T, C]``)."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, cache: PromptCache | None = None) -> Tensor:
        x = self.attn1(self.norm1(x), cache) + x
        return self.ff(self.norm3(x)) + x


def _stage(cfg: EstimatorConfig, dim_in: int, conv: bool) -> nn.ModuleList:
    """``[resnet, transformer blocks(, causal k=3 convolution)]`` as the official lists them."""
    c = cfg.channels
    parts: list[nn.Module] = [
        CausalResnetBlock(dim_in, c, cfg.time_dim),
        nn.ModuleList(TransformerBlock(c, cfg.heads, cfg.head_dim) for _ in range(cfg.blocks)),
    ]
    if conv:
        parts.append(CausalConv1d(c, c, 3))
    return nn.ModuleList(parts)


class Estimator(nn.Module):
    def __init__(self, cfg: EstimatorConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_mlp = TimestepEmbedding(cfg.in_channels, cfg.time_dim)
        self.down_blocks = nn.ModuleList([_stage(cfg, cfg.in_channels, conv=True)])
        self.mid_blocks = nn.ModuleList(_stage(cfg, cfg.channels, conv=False) for _ in range(cfg.mid_blocks))
        self.up_blocks = nn.ModuleList([_stage(cfg, 2 * cfg.channels, conv=True)])
        self.final_block = CausalBlock(cfg.channels, cfg.channels)
        self.final_proj = nn.Conv1d(cfg.channels, cfg.out_channels, 1)
        self.time_embed_mixer = nn.Linear(2 * cfg.time_dim, cfg.time_dim, bias=False)

    def time(self, t: Tensor, r: Tensor) -> Tensor:
        """``[B]`` start and end times -> ``[B, time_dim]`` mixed embedding."""
        emb_t = self.time_mlp(timestep_embedding(t, self.cfg.in_channels))
        emb_r = self.time_mlp(timestep_embedding(r, self.cfg.in_channels).to(emb_t.dtype))
        return self.time_embed_mixer(torch.cat([emb_t, emb_r], dim=1))

    @staticmethod
    def _stage(stage: nn.ModuleList, x: Tensor, time: Tensor, cache: PromptCache | None) -> Tensor:
        """The resnet block, then the transformer blocks (``[B, C, T]`` in and out)."""
        resnet, blocks = stage[0], cast(nn.ModuleList, stage[1])
        x = resnet(x, time, cache).transpose(1, 2).contiguous()  # [B, T, C]
        for block in blocks:
            x = block(x, cache)
        return x.transpose(1, 2).contiguous()

    def forward(
        self,
        x: Tensor,
        mu: Tensor,
        t: Tensor,
        r: Tensor,
        spks: Tensor,
        cond: Tensor,
        cache: PromptCache | None = None,
        *,
        time: Tensor | None = None,
    ) -> Tensor:
        """The mean velocity over [t, r].

        Args:
            x: ``[B, 80, T]`` the mel at time t.
            mu: ``[B, 80, T]`` the encoder's projected features.
            t, r: ``[B]`` or ``[1]`` start and end times.
            spks: ``[B, 80]`` the projected speaker embedding.
            cond: ``[B, 80, T]`` the prompt mel over its frames, zeros after.
            cache: a voice prompt's (:mod:`.s3gen_prefix`): recording (``x`` covers the prompt alone)
                or recorded (``x`` covers the frames after the prompt), at its current step.
            time: :meth:`time` of (t, r) when the caller computed it already (it depends on t and r
                only).

        Returns:
            ``[B, 80, T]``.
        """
        if time is None:
            time = self.time(t, r)
        x = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.shape[-1]), cond], dim=1)
        down, up = cast(nn.ModuleList, self.down_blocks[0]), cast(nn.ModuleList, self.up_blocks[0])
        skip = self._stage(down, x, time, cache)
        x = down[2](skip, cache)
        for stage in self.mid_blocks:
            x = self._stage(cast(nn.ModuleList, stage), x, time, cache)
        x = up[2](self._stage(up, torch.cat([x, skip], dim=1), time, cache), cache)
        return self.final_proj(self.final_block(x, cache))
