"""S3Gen's token encoder: speech-token embeddings (25 Hz, 512 wide) -> 50 Hz features for the flow.

The official ``UpsampleConformerEncoder`` as S3Gen builds it: a linear input layer (Linear, LayerNorm)
with ESPnet's relative positional encoding (the input scaled by sqrt(512)), a look-ahead layer that
sees 3 tokens ahead, 6 conformer blocks (pre-norm, relative-position self-attention with 8 heads,
a SiLU feed-forward of 2048; no convolution module, no macaron), x2 nearest upsampling through a
left-padded k=5 convolution, the same input layer again and 4 more blocks, a final LayerNorm. Module
names follow the official ``flow.encoder`` of ``s3gen_meanflow.safetensors``. Batches of equal lengths
(no padding); the attention sees the whole sequence (not causal), so a streamed encoder re-encodes a
window (measured in docs/chatterbox-turbo.md when the flow streams).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache

__all__ = ["S3GenEncoder", "rel_positions"]

WIDTH, HEADS, FFN = 512, 8, 2048
BLOCKS, UP_BLOCKS = 6, 4
LOOKAHEAD = 3


def rel_positions(
    length: int, width: int = WIDTH, device: torch.device | None = None, dtype: torch.dtype | None = None
) -> Tensor:
    """ESPnet's relative positional encoding for ``length`` positions: ``[1, 2 * length - 1, width]``,
    positions length - 1 ... -(length - 1), computed as the official table (5000 positions, grown on
    demand) and sliced the same way. The table is built once per size (about 30 ms on a CPU core) and
    kept on each ``device`` in each ``dtype`` it is asked for (a slice then copies nothing to the device)."""
    table = _table(max(5000, length), width, device, dtype)
    center = table.shape[1] // 2
    return table[:, center - length + 1 : center + length]


@functools.lru_cache(maxsize=4)
def _table(n: int, width: int, device: torch.device | None, dtype: torch.dtype | None) -> Tensor:
    with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
        if device is None and dtype is None:
            return _build_table(n, width)
        return _table(n, width, None, None).to(device, dtype)


def _build_table(n: int, width: int) -> Tensor:
    positive, negative = torch.zeros(n, width), torch.zeros(n, width)
    position = torch.arange(0, n, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * -(math.log(10000.0) / width))
    positive[:, 0::2] = torch.sin(position * div)
    positive[:, 1::2] = torch.cos(position * div)
    negative[:, 0::2] = torch.sin(-1 * position * div)
    negative[:, 1::2] = torch.cos(-1 * position * div)
    return torch.cat([torch.flip(positive, [0]).unsqueeze(0), negative[1:].unsqueeze(0)], dim=1)


@functools.lru_cache(maxsize=16)
def _gather_index(queries: int, keys: int, device: torch.device) -> Tensor:
    """:meth:`RelAttention.rel_gather`'s index ``[Tq, L]``, built once per window shape and device."""
    with torch.inference_mode(False):
        n = torch.arange(queries, device=device)[:, None]
        return (queries - 1 - n) + torch.arange(keys, device=device)[None, :]


class InputLayer(nn.Module):
    """``Linear -> LayerNorm``, then the scale of the relative positional encoding."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH, eps=1e-5))

    def forward(self, x: Tensor, offset: int = 0) -> tuple[Tensor, Tensor]:
        """``x [B, T, 512]`` -> (scaled ``x``, the relative positions of ``offset + T`` positions: rows
        ``offset...`` continue a cached prompt of ``offset`` rows)."""
        x = self.out(x) * math.sqrt(WIDTH)
        return x, rel_positions(offset + x.shape[1], device=x.device, dtype=x.dtype)


class RelAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h, self.d_k = HEADS, WIDTH // HEADS
        self.linear_q = nn.Linear(WIDTH, WIDTH)
        self.linear_k = nn.Linear(WIDTH, WIDTH)
        self.linear_v = nn.Linear(WIDTH, WIDTH)
        self.linear_out = nn.Linear(WIDTH, WIDTH)
        self.linear_pos = nn.Linear(WIDTH, WIDTH, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(self.h, self.d_k))

    @staticmethod
    def rel_shift(x: Tensor) -> Tensor:
        """``[B, h, T, 2T - 1]`` scores by relative position -> ``[B, h, T, T]`` by key position."""
        b, h, t, n = x.shape
        padded = torch.cat([torch.zeros((b, h, t, 1), dtype=x.dtype, device=x.device), x], dim=-1)
        return padded.view(b, h, n + 1, t)[:, :, 1:].view_as(x)[:, :, :, : n // 2 + 1]

    @staticmethod
    def rel_gather(x: Tensor, keys: int) -> Tensor:
        """``[B, h, Tq, 2L - 1]`` scores by relative position of the last ``Tq`` of ``L = keys``
        positions -> ``[B, h, Tq, L]`` by key position (:meth:`rel_shift` for queries that continue a
        cached prompt: query n sits at position L - Tq + n; its key j at relative index Tq - 1 - n + j)."""
        b, h, tq, _ = x.shape
        return x.gather(-1, _gather_index(tq, keys, x.device).expand(b, h, tq, keys))

    def forward(self, x: Tensor, pos: Tensor, cache: PromptCache | None = None) -> Tensor:
        b = x.shape[0]
        q = self.linear_q(x).view(b, -1, self.h, self.d_k)  # (B, T, h, d_k)
        k = self.linear_k(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, -1, self.h, self.d_k).transpose(1, 2)
        if cache is not None:
            k, v = cache.keys_values(self, k, v)  # reading: the prompt's rows first
        p = self.linear_pos(pos).view(pos.shape[0], -1, self.h, self.d_k).transpose(1, 2)
        ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        if ac.shape[-1] != ac.shape[-2]:
            bd = self.rel_gather(bd, ac.shape[-1])
        elif ac.shape != bd.shape:
            bd = self.rel_shift(bd)
        scores = (ac + bd) / math.sqrt(self.d_k)
        mask = None if cache is None else cache.key_mask(k.shape[2])  # rows of several streams
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.linear_out(out)


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w_1 = nn.Linear(WIDTH, FFN)
        self.w_2 = nn.Linear(FFN, WIDTH)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class Block(nn.Module):
    """A pre-norm conformer block without convolution: attention, then feed-forward."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn = RelAttention()
        self.feed_forward = FeedForward()
        self.norm_ff = nn.LayerNorm(WIDTH, eps=1e-12)
        self.norm_mha = nn.LayerNorm(WIDTH, eps=1e-12)

    def forward(self, x: Tensor, pos: Tensor, cache: PromptCache | None = None) -> Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos, cache)
        return x + self.feed_forward(self.norm_ff(x))


class LookAhead(nn.Module):
    """Each token sees the next three: a k=4 convolution over the right-padded sequence, LeakyReLU, a
    left-padded k=3 convolution, plus the input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(WIDTH, WIDTH, LOOKAHEAD + 1)
        self.conv2 = nn.Conv1d(WIDTH, WIDTH, 3)

    def forward(self, x: Tensor, cache: PromptCache | None = None) -> Tensor:
        y = x.transpose(1, 2).contiguous()
        if cache is not None:  # padded rows (several streams): conv1 sees zeros past a row's end
            y = cache.zero_padding(y)
        if cache is None or not cache.continues:
            if cache is not None and cache.recording:  # the last two tokens: the first new ones' conv2
                cache.remember(self, y[..., -2:])  # needs their conv1
            y = F.pad(F.leaky_relu(self.conv1(F.pad(y, (0, LOOKAHEAD)))), (2, 0), value=0.0)
        else:  # conv1 of the prompt's last two tokens again, now seeing the new tokens ahead
            y = torch.cat((cache.recall(self, y.shape[0]), y), dim=-1)
            y = F.leaky_relu(self.conv1(F.pad(y, (0, LOOKAHEAD))))
        return self.conv2(y).transpose(1, 2).contiguous() + x


class Upsample(nn.Module):
    """x2 nearest, left-padded by 4, k=5 convolution (``[B, C, T]`` -> ``[B, C, 2T]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(WIDTH, WIDTH, 5)

    def forward(self, x: Tensor, cache: PromptCache | None = None) -> Tensor:
        up = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return self.conv(F.pad(up, (4, 0)) if cache is None else cache.left_context(self, up, 4))


class S3GenEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = InputLayer()
        self.pre_lookahead_layer = LookAhead()
        self.encoders = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.up_layer = Upsample()
        self.up_embed = InputLayer()
        self.up_encoders = nn.ModuleList(Block() for _ in range(UP_BLOCKS))
        self.after_norm = nn.LayerNorm(WIDTH, eps=1e-5)

    def forward(self, tokens: Tensor, cache: PromptCache | None = None) -> Tensor:
        """``[B, T, 512]`` token embeddings -> ``[B, 2T, 512]`` features. With a ``cache`` being
        recorded, ``tokens`` are a voice prompt's; with a recorded one, they follow that prompt."""
        offset = cache.prompt_tokens if cache is not None and cache.continues else 0
        x, pos = self.embed(tokens, offset)
        x = self.pre_lookahead_layer(x, cache)
        for block in self.encoders:
            x = block(x, pos, cache)
        x = self.up_layer(x.transpose(1, 2).contiguous(), cache).transpose(1, 2).contiguous()
        x, pos = self.up_embed(x, 2 * offset)
        for block in self.up_encoders:
            x = block(x, pos, cache)
        return self.after_norm(x)
