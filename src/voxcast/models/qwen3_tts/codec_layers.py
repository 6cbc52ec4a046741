"""Building blocks of the streaming 12 Hz codec decoder (see :mod:`.codec_decoder`).

Every block streams: it reads and writes its slot of a :class:`_State` (conv input tails,
attention KV tails) and never modifies a stored tensor in place, so states are shared by clones.

Speed (CPU, one stream, 1-8 frames per call): what can be computed once from the weights is
computed once and cached (:func:`_fold`: codebook tables projected to the output width, SnakeBeta's
``exp``, fused q/k/v and gate/up weights), recomputed only when a parameter changes (in place, by
``load_state_dict`` or ``.to()``). Convolutions whose output is short for their width run as one GEMM on an im2col
copy of the input (oneDNN's direct conv is 2-3x slower there); long outputs keep ``F.conv1d``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.kernels.rows_linear import onednn_gemm, onednn_linear

_T = TypeVar("_T")


@dataclass(frozen=True)
class CodecDecoderConfig:
    """The ``decoder_config`` of the speech tokenizer's ``config.json`` (real values as defaults)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    rope_theta: float = 10000.0
    sliding_window: int = 72
    rms_norm_eps: float = 1e-5
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    attention_bias: bool = False
    hidden_act: str = "silu"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodecDecoderConfig:
        """Build from a parsed ``decoder_config`` dict; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        for k in ("upsample_rates", "upsampling_ratios"):
            if k in kw:
                kw[k] = tuple(int(x) for x in kw[k])
        if "head_dim" not in d:
            kw["head_dim"] = int(d.get("hidden_size", cls.hidden_size)) // int(
                d.get("num_attention_heads", cls.num_attention_heads)
            )
        cfg = cls(**kw)
        if cfg.hidden_act != "silu":
            raise ValueError(f"unsupported codec decoder hidden_act {cfg.hidden_act!r}")
        return cfg

    @property
    def samples_per_frame(self) -> int:
        """Total upsampling factor (1920 for the real model)."""
        return int(np.prod(self.upsample_rates + self.upsampling_ratios))


@dataclass
class _State:
    """Per-stream state: conv input tails and attention KV tails, indexed by module slot."""

    convs: list[Tensor | None]
    kv: list[tuple[Tensor, Tensor] | None]
    position: int = 0  # frames already seen by the transformer

    def copy(self) -> _State:
        # Tensors are never modified in place, so sharing them is safe.
        return _State(list(self.convs), list(self.kv), self.position)


def _fold(module: nn.Module, build: Callable[[], _T]) -> _T:
    """``build()`` cached on ``module``; rebuilt when any of its parameters changed since.

    The key is each parameter's in-place version counter, storage and dtype, so in-place edits,
    ``load_state_dict`` and ``.to()`` all invalidate it. Cached values are plain attributes, not
    buffers: the state dict keeps exactly the official keys.
    """
    key = tuple((p._version, p.data_ptr(), p.dtype) for p in module.parameters())
    hit: tuple[tuple[Any, ...], _T] | None = module.__dict__.get("_folded")
    if hit is None or hit[0] != key:
        with torch.no_grad():
            hit = (key, build())
        module.__dict__["_folded"] = hit
    return hit[1]


def _tail(x: Tensor, n: int) -> Tensor:
    """The last ``n`` steps of ``x`` [..., T] as state: a view, copied only when ``x`` is much longer."""
    tail = x[..., -n:]
    return tail.contiguous() if x.shape[-1] > 2 * n else tail


#: GEMMs with an output side at most this long count as small (see :data:`CausalConv.onednn_small`).
SMALL_DIM = 24


def _gemm(w: Tensor, b: Tensor | None, x: Tensor, onednn_small: bool = False) -> Tensor:
    """``w @ x + b[:, None]`` for w [Cout, K], x [B, K, T] -> [B, Cout, T] (one addmm when B == 1).

    With ``onednn_small``, a single GEMM with ``Cout`` or ``T`` at most :data:`SMALL_DIM` runs on
    oneDNN (:func:`voxcast.kernels.rows_linear.onednn_gemm`).
    """
    if x.shape[0] == 1:
        if onednn_small and min(w.shape[0], x.shape[2]) <= SMALL_DIM:
            return onednn_gemm(w, b, x[0])[None]
        y = torch.mm(w, x[0]) if b is None else torch.addmm(b[:, None], w, x[0])
        return y[None]
    y = torch.matmul(w, x)
    return y if b is None else y + b[:, None]


def _linear(x: Tensor, w: Tensor, b: Tensor | None, onednn_small: bool) -> Tensor:
    """``F.linear`` of x [B, T, K]; with ``onednn_small``, one sequence of at most :data:`SMALL_DIM`
    positions runs on oneDNN (the transformer's rows of a few-frame chunk: MKL computes so few rows
    on one thread, 1.5-1.6x oneDNN's time for one to four frames on an AMD Zen 3)."""
    if onednn_small and x.shape[0] == 1 and x.shape[1] <= SMALL_DIM:
        return onednn_linear(x, w, b)
    return F.linear(x, w, b)


# --------------------------------------------------------------------------- convolutions


class CausalConv(nn.Module):
    """Conv1d with left zero padding; streams by keeping the last ``(k-1)*dilation`` inputs.

    Kernel-1 convs are one GEMM. Wider kernels whose output is at most ``gemm_max_ratio`` times the
    input width long run as one GEMM on an im2col copy (``[Cin*k, T]``, 1.2-3x faster than oneDNN
    there); longer ones (e.g. 96 channels x 1920 samples) and depthwise ones use ``F.conv1d``.
    """

    slot: int = -1
    gemm_max_ratio: float = 2.0
    #: Short GEMMs (a frame or two: the first chunks) on oneDNN; set by ``CodecDecoder.prepare``
    #: where that measured faster (MKL on an AMD Zen 3: 22.9 vs 6.4 ms for the first upsampling
    #: layer of a one-frame chunk).
    onednn_small: bool = False

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation

    def needed_input(self, n: int) -> int:
        """Inputs (the last ones) that determine the last ``n`` outputs and the state after them."""
        return n + self.context

    def forward(self, x: Tensor, st: _State) -> Tensor:  # x: [B, C, T]
        if self.context:
            prev = st.convs[self.slot]
            if prev is None:
                prev = x.new_zeros(x.shape[0], x.shape[1], self.context)
            x = torch.cat([prev, x], dim=-1)
            st.convs[self.slot] = _tail(x, self.context)
        return self.apply_conv(x)

    def apply_conv(self, xx: Tensor) -> Tensor:
        """The valid (unpadded) convolution of ``xx`` [B, Cin, context + T] -> [B, Cout, T]."""
        conv = self.conv
        t = xx.shape[-1] - self.context
        k, d = conv.kernel_size[0], conv.dilation[0]
        if conv.groups != 1 or (k > 1 and t > self.gemm_max_ratio * conv.in_channels):
            return conv(xx)
        w = conv.weight.reshape(conv.out_channels, -1)  # [Cout, Cin * k], a view
        if k == 1:
            return _gemm(w, conv.bias, xx, self.onednn_small)
        cols = xx.unfold(-1, self.context + 1, 1)[..., ::d]  # [B, Cin, T, k]
        return _gemm(w, conv.bias, cols.transpose(2, 3).reshape(xx.shape[0], -1, t), self.onednn_small)


class CausalTransConv(nn.Module):
    """ConvTranspose1d trimmed to ``T * stride`` outputs; streams with its last inputs as state.

    Computed as one GEMM (CPU conv_transpose kernels are ~10x slower here): with kernel = m * stride,
    ``z = W^T @ x`` gives every input's [Cout, kernel] contribution; output block n (``stride``
    samples) is the sum of part i of the contribution of input n - i, for i < m. The weight keeps
    its official shape [Cin, Cout, kernel] but is stored as a contiguous [Cout * kernel, Cin]
    (strides, no copy): the GEMM then reads it row by row, 1.8x faster for a few frames.
    """

    slot: int = -1
    onednn_small: bool = False  # as CausalConv.onednn_small

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        if kernel % stride:
            raise ValueError("kernel must be a multiple of stride")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        w = torch.empty(cout * kernel, cin).t().view(cin, cout, kernel)
        self.conv.weight = nn.Parameter(w.copy_(self.conv.weight.detach()))
        self.stride, self.parts = stride, kernel // stride
        self.context = self.parts - 1

    def needed_input(self, n: int) -> int:
        """Inputs (the last ones) that determine the last ``n`` outputs and the state after them."""
        return -(-n // self.stride) + self.context

    def gemm_weight(self) -> Tensor:
        """The weight as the GEMM's ``[Cout * kernel, Cin]`` (a view)."""
        return self.conv.weight.reshape(self.conv.in_channels, -1).t()

    def forward(self, x: Tensor, st: _State) -> Tensor:  # x: [B, Cin, T] -> [B, Cout, T*stride]
        b, cin, t = x.shape
        xx = x
        if self.context:
            prev = st.convs[self.slot]
            if prev is None:
                prev = x.new_zeros(b, cin, self.context)
            xx = torch.cat([prev, x], dim=-1)
            st.convs[self.slot] = _tail(xx, self.context)
        cout, ctx = self.conv.out_channels, self.context
        z = _gemm(self.gemm_weight(), None, xx, self.onednn_small)  # [B, Cout * kernel, ctx + T]
        z = z.view(b, cout, self.parts, self.stride, t + ctx)
        y = z[:, :, 0, :, ctx:]  # [B, Cout, stride, T]
        for i in range(1, self.parts):
            y = y + z[:, :, i, :, ctx - i : ctx - i + t]
        if self.conv.bias is not None:
            y = y + self.conv.bias[None, :, None, None]
        return y.transpose(2, 3).reshape(b, cout, t * self.stride)


class SnakeBeta(nn.Module):
    """x + 1/(exp(beta) + 1e-9) * sin(x * exp(alpha))^2, per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def _coefs(self) -> tuple[Tensor, Tensor]:  # ([C, 1], [C, 1])
        return torch.exp(self.alpha)[:, None], (1.0 / (torch.exp(self.beta) + 1e-9))[:, None]

    def needed_input(self, n: int) -> int:
        """Pointwise: the last ``n`` outputs need the last ``n`` inputs."""
        return n

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T]
        alpha, inv_beta = _fold(self, self._coefs)
        s = torch.mul(x, alpha).sin_()
        return torch.addcmul(x, s.mul_(s), inv_beta)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm -> MLP x4 (GELU) -> gamma, residual."""

    onednn_small: bool = False  # as CausalConv.onednn_small, for the MLP over a few positions

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def needed_input(self, n: int) -> int:
        """Inputs (the last ones) that determine the last ``n`` outputs and the state after them."""
        return self.dwconv.needed_input(n)

    def forward(self, x: Tensor, st: _State) -> Tensor:  # x: [B, C, T]
        h = self.dwconv(x, st).transpose(1, 2)  # [B, T, C]
        if self.onednn_small and h.shape[0] == 1 and h.shape[1] <= SMALL_DIM:
            h = self.act(onednn_linear(self.norm(h), self.pwconv1.weight, self.pwconv1.bias))
            h = onednn_linear(h, self.pwconv2.weight, self.pwconv2.bias)
        else:
            h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return torch.addcmul(x, self.gamma[:, None], h.transpose(1, 2))


class ResidualUnit(nn.Module):
    """SnakeBeta -> causal conv k7 (dilated) -> SnakeBeta -> conv k1, residual."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: Tensor, st: _State) -> Tensor:
        h = self.conv1(self.act1(x), st)
        return self.conv2(self.act2(h), st).add_(x)


class DecoderBlock(nn.Module):
    """SnakeBeta -> causal transposed conv (k=2r, s=r) -> residual units with dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        units: list[nn.Module] = [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
        units += [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList(units)

    def needed_input(self, n: int) -> int:
        """Inputs (the last ones) that determine the last ``n`` outputs and every state after them."""
        for unit in self.block[2:]:
            assert isinstance(unit, ResidualUnit)
            n += unit.conv1.context  # conv2 is kernel 1
        trans = self.block[1]
        assert isinstance(trans, CausalTransConv)
        return trans.needed_input(n)

    def forward(self, x: Tensor, st: _State) -> Tensor:
        x = self.block[1](self.block[0](x), st)
        for unit in self.block[2:]:
            x = unit(x, st)
        return x


# --------------------------------------------------------------------------- transformer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    """A per-channel scale, applied by :class:`TransformerLayer` together with the residual add."""

    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _cat_bias(*linears: nn.Linear) -> Tensor | None:
    if linears[0].bias is None:
        return None
    return torch.cat([lin.bias for lin in linears])


class Attention(nn.Module):
    """Causal sliding-window attention whose stream state is the last ``window - 1`` keys/values."""

    slot: int = -1
    onednn_small: bool = False  # as CausalConv.onednn_small, for the projections (see _linear)

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        h, nh, nkv, hd = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_proj = nn.Linear(h, nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nh * hd, h, bias=cfg.attention_bias)
        self.head_dim, self.groups, self.keep = hd, nh // nkv, cfg.sliding_window - 1
        self.splits = (nh * hd, nkv * hd, nkv * hd)

    def _qkv(self) -> tuple[Tensor, Tensor | None]:  # one [q; k; v] projection
        lins = (self.q_proj, self.k_proj, self.v_proj)
        return torch.cat([lin.weight for lin in lins]), _cat_bias(*lins)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, st: _State) -> Tensor:
        b, t, _ = x.shape  # x: [B, T, H]; cos/sin: [T, hd]; mask: [T, past + T]
        qkv = _linear(x, *_fold(self, self._qkv), self.onednn_small)
        q, k, v = (y.view(b, t, -1, self.head_dim).transpose(1, 2) for y in qkv.split(self.splits, -1))
        q = q * cos + _rotate_half(q) * sin  # [B, nh, T, hd]
        k = k * cos + _rotate_half(k) * sin
        past = st.kv[self.slot]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        kt, vt = k[:, :, -self.keep :], v[:, :, -self.keep :]
        if k.shape[2] > 2 * self.keep:  # a long prefix (priming): do not keep it alive through views
            kt, vt = kt.contiguous(), vt.contiguous()
        st.kv[self.slot] = (kt, vt)
        if self.groups > 1:
            k, v = k.repeat_interleave(self.groups, 1), v.repeat_interleave(self.groups, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, nh, T, hd]
        o = o.transpose(1, 2).reshape(b, t, -1)
        return _linear(o, self.o_proj.weight, self.o_proj.bias, self.onednn_small)


class Mlp(nn.Module):
    onednn_small: bool = False  # as Attention.onednn_small

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _gate_up(self) -> Tensor:  # one [gate; up] projection
        return torch.cat([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x: Tensor) -> Tensor:  # x: [B, T, H]
        gate, up = _linear(x, _fold(self, self._gate_up), None, self.onednn_small).chunk(2, dim=-1)
        return _linear(F.silu(gate).mul_(up), self.down_proj.weight, None, self.onednn_small)


class TransformerLayer(nn.Module):
    """Pre-norm attention and SwiGLU MLP, each scaled by a LayerScale and added to the residual."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size, cfg.layer_scale_initial_scale)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, st: _State) -> Tensor:
        a = self.self_attn(self.input_layernorm(x), cos, sin, mask, st)
        x = torch.addcmul(x, self.self_attn_layer_scale.scale, a)
        m = self.mlp(self.post_attention_layernorm(x))
        return torch.addcmul(x, self.mlp_layer_scale.scale, m)


class Transformer(nn.Module):
    """latent -> hidden, layers with RoPE (absolute frame positions), norm, hidden -> latent."""

    inv_freq: Tensor

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden_size)
        self.output_proj = nn.Linear(cfg.hidden_size, cfg.latent_dim)
        hd = cfg.head_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.window = cfg.sliding_window

    def forward(self, x: Tensor, st: _State) -> Tensor:  # x: [B, T, latent]
        t, p0 = x.shape[1], st.position
        past = min(p0, self.window - 1)
        qpos = torch.arange(p0, p0 + t, device=x.device)
        kpos = torch.arange(p0 - past, p0 + t, device=x.device)
        mask = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] > qpos[:, None] - self.window)
        freqs = qpos.float()[:, None] * self.inv_freq.float()[None, :]  # [T, hd/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, st)
        st.position = p0 + t
        return self.output_proj(self.norm(h))
