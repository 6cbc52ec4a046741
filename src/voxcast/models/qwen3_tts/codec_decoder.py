"""The 12 Hz speech-tokenizer decoder of Qwen3-TTS (codes -> 24 kHz waveform), built to stream exactly.

The network is strictly causal: split RVQ lookup -> causal conv -> 8-layer transformer with a
causal sliding window of 72 frames -> 2 x (transposed conv + ConvNeXt) -> causal conv -> 4
SnakeBeta/transposed-conv/residual blocks -> causal conv -> clamp. Every causal convolution keeps
its last ``(kernel - 1) * dilation`` inputs as state, every transposed convolution its last
``ceil(kernel / stride) - 1`` inputs, every attention layer the keys/values of its last
``window - 1`` frames. With that state a chunk of new frames costs O(new frames), and any chunk
schedule reproduces the one-pass decode (to float rounding, ~1e-7).

Parameter names equal the ``decoder.*`` keys of the official ``speech_tokenizer/model.safetensors``
(minus that prefix), so the official weights load with ``strict=True``.

Streams never modify a stored tensor in place: a :class:`StreamingDecoder` is cloned by copying
two short lists (:meth:`StreamingDecoder.clone`), which is how a voice's primed state (decoder run
over the reference codes once) is shared by every request of that voice.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

__all__ = [
    "SAMPLES_PER_FRAME",
    "CodecDecoder",
    "CodecDecoderConfig",
    "StreamingDecoder",
    "load_codec_decoder",
    "write_random_speech_tokenizer",
]

logger = logging.getLogger(__name__)

#: Output samples per codec frame (24 kHz / 12.5 Hz).
SAMPLES_PER_FRAME = 1920


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


# --------------------------------------------------------------------------- convolutions


class CausalConv(nn.Module):
    """Conv1d with left zero padding; streams by keeping the last ``(k-1)*dilation`` inputs."""

    slot: int = -1

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, groups=groups)
        self.context = (kernel - 1) * dilation

    def forward(self, x: Tensor, st: _State) -> Tensor:  # x: [B, C, T]
        if self.context == 0:
            if self.conv.groups == 1 and self.conv.kernel_size[0] == 1:  # a GEMM beats the conv kernels
                w, b = self.conv.weight[:, :, 0], self.conv.bias
                return torch.matmul(w, x) + b[:, None] if b is not None else torch.matmul(w, x)
            return self.conv(x)
        prev = st.convs[self.slot]
        if prev is None:
            prev = x.new_zeros(x.shape[0], x.shape[1], self.context)
        xx = torch.cat([prev, x], dim=-1)
        st.convs[self.slot] = xx[..., -self.context :].contiguous()
        return self.conv(xx)


class CausalTransConv(nn.Module):
    """ConvTranspose1d trimmed to ``T * stride`` outputs; streams with its last inputs as state.

    Computed as one GEMM (CPU conv_transpose kernels are ~10x slower here): with kernel = m * stride,
    ``z = x^T @ W`` gives every input's [Cout, kernel] contribution; output block n (``stride``
    samples) is the sum of part i of the contribution of input n - i, for i < m.
    """

    slot: int = -1

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        if kernel % stride:
            raise ValueError("kernel must be a multiple of stride")
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride, self.parts = stride, kernel // stride
        self.context = self.parts - 1

    def forward(self, x: Tensor, st: _State) -> Tensor:  # x: [B, Cin, T] -> [B, Cout, T*stride]
        b, cin, t = x.shape
        xx = x
        if self.context:
            prev = st.convs[self.slot]
            if prev is None:
                prev = x.new_zeros(b, cin, self.context)
            xx = torch.cat([prev, x], dim=-1)
            st.convs[self.slot] = xx[..., -self.context :].contiguous()
        w = self.conv.weight  # [Cin, Cout, kernel]
        z = torch.matmul(xx.transpose(1, 2), w.reshape(cin, -1))  # [B, ctx + T, Cout * kernel]
        z = z.view(b, t + self.context, w.shape[1], self.parts, self.stride)
        y = z[:, self.context :, :, 0]  # [B, T, Cout, stride]
        for i in range(1, self.parts):
            y = y + z[:, self.context - i : self.context - i + t, :, i]
        if self.conv.bias is not None:
            y = y + self.conv.bias[None, None, :, None]
        return y.permute(0, 2, 1, 3).reshape(b, w.shape[1], t * self.stride)


class SnakeBeta(nn.Module):
    """x + 1/(exp(beta) + 1e-9) * sin(x * exp(alpha))^2, per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:  # x: [B, C, T]
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.pow(torch.sin(x * alpha), 2)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm -> MLP x4 (GELU) -> gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: Tensor, st: _State) -> Tensor:  # x: [B, C, T]
        h = self.dwconv(x, st).permute(0, 2, 1)
        h = self.pwconv2(self.act(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).permute(0, 2, 1)


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
        return self.conv2(self.act2(h), st) + x


class DecoderBlock(nn.Module):
    """SnakeBeta -> causal transposed conv (k=2r, s=r) -> residual units with dilations 1, 3, 9."""

    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        units: list[nn.Module] = [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
        units += [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList(units)

    def forward(self, x: Tensor, st: _State) -> Tensor:
        x = self.block[1](self.block[0](x), st)
        for unit in self.block[2:]:
            x = unit(x, st)
        return x


# --------------------------------------------------------------------------- quantizer


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self._table: tuple[tuple[int, ...], Tensor] | None = None

    def table(self) -> Tensor:  # [size, dim], recomputed only when the weights change
        e, u = self.embedding_sum, self.cluster_usage
        key = (e._version, u._version, e.data_ptr(), u.data_ptr())
        if self._table is None or self._table[0] != key:
            self._table = (key, (e / u.clamp(min=1e-5)[:, None]).detach())
        return self._table[1]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _VQList(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQ(size, dim) for _ in range(n)])


class _RVQ(nn.Module):
    """A group of residual codebooks whose summed lookups are projected dim -> out (Conv1d k1)."""

    def __init__(self, n: int, size: int, dim: int, out: int):
        super().__init__()
        self.input_proj = nn.Conv1d(out, dim, 1, bias=False)  # encoder side; unused here
        self.output_proj = nn.Conv1d(dim, out, 1, bias=False)
        self.vq = _VQList(n, size, dim)

    def decode(self, codes: Tensor) -> Tensor:  # codes: [B, n, T] -> [B, out, T]
        q: Tensor | float = 0.0
        for i, layer in enumerate(self.vq.layers):
            table = cast(_Codebook, layer._codebook).table()
            q = q + F.embedding(codes[:, i], table).transpose(1, 2)
        assert isinstance(q, Tensor)
        return self.output_proj(q)


class SplitQuantizer(nn.Module):
    """One semantic codebook + the acoustic rest, each group with its own output projection."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        dim, out, size = cfg.codebook_dim // 2, cfg.codebook_dim, cfg.codebook_size
        self.rvq_first = _RVQ(1, size, dim, out)
        self.rvq_rest = _RVQ(cfg.num_quantizers - 1, size, dim, out)

    def decode(self, codes: Tensor) -> Tensor:  # codes: [B, Q, T] -> [B, codebook_dim, T]
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


# --------------------------------------------------------------------------- transformer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    """Causal sliding-window attention whose stream state is the last ``window - 1`` keys/values."""

    slot: int = -1

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

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor, st: _State) -> Tensor:
        b, t, _ = x.shape  # x: [B, T, H]; cos/sin: [T, hd]; mask: [T, past + T]
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        past = st.kv[self.slot]
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        st.kv[self.slot] = (k[:, :, -self.keep :].contiguous(), v[:, :, -self.keep :].contiguous())
        if self.groups > 1:
            k, v = k.repeat_interleave(self.groups, 1), v.repeat_interleave(self.groups, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, nh, T, hd]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class Mlp(nn.Module):
    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
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
        x = x + self.self_attn_layer_scale(a)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


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


# --------------------------------------------------------------------------- decoder


class CodecDecoder(nn.Module):
    """Codes [T, 16] -> waveform [T * 1920]; parameter names as the official ``decoder.*`` keys."""

    def __init__(self, cfg: CodecDecoderConfig):
        super().__init__()
        self.config = cfg
        self.quantizer = SplitQuantizer(cfg)
        self.pre_conv = CausalConv(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [CausalTransConv(cfg.latent_dim, cfg.latent_dim, r, r), ConvNeXtBlock(cfg.latent_dim)]
            )
            for r in cfg.upsampling_ratios
        )
        dims = [cfg.decoder_dim // 2**i for i in range(len(cfg.upsample_rates) + 1)]
        blocks: list[nn.Module] = [CausalConv(cfg.latent_dim, cfg.decoder_dim, 7)]
        blocks += [DecoderBlock(dims[i], dims[i + 1], r) for i, r in enumerate(cfg.upsample_rates)]
        blocks += [SnakeBeta(dims[-1]), CausalConv(dims[-1], 1, 7)]
        self.decoder = nn.ModuleList(blocks)
        self._n_conv = self._n_attn = 0
        for m in self.modules():
            if isinstance(m, (CausalConv, CausalTransConv)):
                m.slot, self._n_conv = self._n_conv, self._n_conv + 1
            elif isinstance(m, Attention):
                m.slot, self._n_attn = self._n_attn, self._n_attn + 1

    def _fresh_state(self) -> _State:
        return _State([None] * self._n_conv, [None] * self._n_attn)

    def _front(self, codes: Tensor, st: _State) -> Tensor:  # codes: [B, T, Q] -> [B, latent, T]
        h = self.quantizer.decode(codes.transpose(1, 2))  # [B, codebook_dim, T]
        h = self.pre_conv(h, st).transpose(1, 2)  # [B, T, latent]
        return self.pre_transformer(h, st).permute(0, 2, 1)

    def _back(self, h: Tensor, st: _State) -> Tensor:  # h: [B, latent, T] -> [B, T * spf]
        for pair in self.upsample:  # [CausalTransConv, ConvNeXtBlock]
            h = pair[1](pair[0](h, st), st)  # type: ignore[index]
        for layer in self.decoder:
            h = layer(h) if isinstance(layer, SnakeBeta) else layer(h, st)
        return h.clamp(min=-1.0, max=1.0).squeeze(1)

    def _run(self, codes: Tensor, st: _State) -> Tensor:  # codes: [B, T, Q] -> [B, T * spf]
        return self._back(self._front(codes, st), st)

    def _back_context_frames(self) -> int:
        """Frames of transformer output that determine the conv stack's state (its receptive field)."""
        frames, rate = 0.0, 1  # rate: samples per frame at the current stage
        for m in [*self.upsample.modules(), *self.decoder.modules()]:
            if isinstance(m, CausalTransConv):
                frames += m.context / rate
                rate *= m.stride
            elif isinstance(m, CausalConv):
                frames += m.context / rate
        return math.ceil(frames) + 2  # ~10 for the real model; +2 for safety

    def _check_codes(self, codes: Tensor) -> Tensor:
        if codes.dim() != 2 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(f"codes must be [T, {self.config.num_quantizers}], got {tuple(codes.shape)}")
        return codes.to(device=self.pre_conv.conv.weight.device, dtype=torch.long)

    @torch.inference_mode()
    def decode_offline(self, codes: Tensor) -> np.ndarray:
        """One-pass decode of all frames (the reference for the streaming decoder).

        Args:
            codes: LongTensor [T, Q] of codec codes.

        Returns:
            float32 waveform [T * samples_per_frame] in [-1, 1].
        """
        codes = self._check_codes(codes)
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self._run(codes[None], self._fresh_state())[0]
        return wav.float().cpu().numpy()

    def new_stream(self, prime_codes: Tensor | None = None) -> StreamingDecoder:
        """A stream with fresh state, optionally primed with reference codes (audio discarded).

        Priming runs the transformer over every reference frame but the conv stack only over the
        last few (its receptive field, :meth:`_back_context_frames`): the state after the
        reference is the same, at a fraction of a full decode. Call it once per voice and
        :meth:`StreamingDecoder.clone` the result for every request. The stream then returns
        exactly the generated frames' samples. (The official wrapper decodes ref ++ gen and drops
        ``int(ref / total * total * 1920)`` samples: ``ref * 1920``, or one fewer where the float
        quotient rounds down, leaving the reference's last sample in front of its clip.)
        """
        st = self._fresh_state()
        if prime_codes is not None and prime_codes.shape[0] > 0:
            codes = self._check_codes(prime_codes)
            with torch.inference_mode():
                h = self._front(codes[None], st)
                self._back(h[:, :, -self._back_context_frames() :], st)
        stream = StreamingDecoder(self, st)
        stream.primed_frames = st.position
        return stream


class StreamingDecoder:
    """Stateful incremental decode: ``decode(codes [T, Q]) -> float32 [T * 1920]``.

    The concatenation of the outputs over any chunk schedule equals
    :meth:`CodecDecoder.decode_offline` of all frames (max abs diff ~1e-7 in fp32). Not thread-safe;
    one instance per request (clones share nothing mutable).
    """

    def __init__(self, model: CodecDecoder, state: _State):
        self.model = model
        self._state = state
        self.primed_frames = 0

    @property
    def frames_decoded(self) -> int:
        """Frames run through this stream so far, including priming frames."""
        return self._state.position

    def decode(self, codes: Tensor) -> np.ndarray:
        """Decode the next frames.

        Args:
            codes: LongTensor [T, Q] (T may be 0).

        Returns:
            float32 waveform [T * samples_per_frame]: exactly the samples these frames add.
        """
        codes = self.model._check_codes(codes)
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        with torch.inference_mode():
            wav = self.model._run(codes[None], self._state)[0]
        return wav.float().cpu().numpy()

    def clone(self) -> StreamingDecoder:
        """An independent copy of this stream (cheap: the state's tensors are shared read-only)."""
        out = StreamingDecoder(self.model, self._state.copy())
        out.primed_frames = self.primed_frames
        return out


def load_codec_decoder(
    speech_tokenizer_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CodecDecoder:
    """Load the decoder from an official ``speech_tokenizer`` folder (config.json + model.safetensors).

    Raises:
        FileNotFoundError: a file is missing.
        RuntimeError: the weights do not match the config (strict load).
    """
    d = Path(speech_tokenizer_dir)
    cfg = CodecDecoderConfig.from_dict(json.loads((d / "config.json").read_text())["decoder_config"])
    tensors = load_file(str(d / "model.safetensors"))
    state = {k[len("decoder.") :]: v for k, v in tensors.items() if k.startswith("decoder.")}
    model = CodecDecoder(cfg)
    model.load_state_dict(state, strict=True)
    logger.info("codec decoder loaded from %s (%d tensors)", d, len(state))
    return model.to(device=device, dtype=dtype).eval()


def write_random_speech_tokenizer(out_dir: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random speech tokenizer folder; see :mod:`.codec_encoder` (imported lazily)."""
    from .codec_encoder import write_random_speech_tokenizer as write

    return write(out_dir, size, seed)
