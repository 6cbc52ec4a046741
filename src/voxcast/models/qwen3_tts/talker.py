"""The talker: a Qwen3 decoder over codec frames (its blocks, shared with the code predictor, are in
:mod:`~.layers`).

Parameter names equal the official checkpoint's ``talker.*`` keys, so ``model.safetensors`` loads
into :class:`Talker` with ``strict=True``. Attention keeps its keys/values in a
:class:`~.kv_cache.KVCache`: written in place (gpt-fast style), reallocated only when it doubles.
Numerics follow the official implementation operation by operation (see :mod:`~.layers`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.kernels.rows_linear import Linear
from voxcast.models.qwen3_tts.config import TalkerConfig
from voxcast.models.qwen3_tts.decode_steps import RecordedTalkerStep, StaticSteps
from voxcast.models.qwen3_tts.kv_cache import KVCache
from voxcast.models.qwen3_tts.layers import (
    DecoderLayer,
    RMSNorm,
    decoder_layers,
    rope_cos_sin,
    rope_inv_freq,
)

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.code_predictor import CodePredictor

__all__ = ["Talker"]


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
        self.layers = decoder_layers(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Talker(nn.Module):
    """``talker``: the backbone, ``text_projection``, ``codec_head`` and the ``code_predictor``."""

    inv_freq: Tensor

    def __init__(self, cfg: TalkerConfig, code_predictor: CodePredictor) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerBackbone(cfg)
        self.text_projection = ResizeMLP(cfg.text_hidden_size, cfg.text_hidden_size, cfg.hidden_size)
        self.codec_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Given by the caller (code_predictor.py builds on this module's blocks).
        self.code_predictor = code_predictor
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self._section = cfg.mrope_section if cfg.mrope_interleaved else None
        self._rope_table: tuple[Tensor, Tensor] | None = None  # cos/sin [P, D] for positions 0..P-1
        #: Compiled static-shape decode steps (VOXCAST_COMPILE), set by :func:`voxcast.models.qwen3_tts.accel.graphs.use_static_decode`.
        self.static: StaticSteps | None = None
        #: The recorded decode steps, one row and batched rows (VOXCAST_TRACE_STEPS), set by
        #: :func:`voxcast.models.qwen3_tts.accel.talker_trace.use_traced_step`.
        self.traced: RecordedTalkerStep | None = None

    def text_embed(self, ids: Tensor) -> Tensor:
        """``T(ids)``: text embedding then projection. ``ids [B, L]`` -> ``[B, L, hidden]``."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: Tensor) -> Tensor:
        """``C(ids)``: the talker's codec embedding (code group 0 and special codec ids)."""
        return self.model.codec_embedding(ids)

    def new_cache(self, max_len: int, *, batch: int = 1, reserve: int | None = None) -> list[KVCache]:
        """One :class:`KVCache` per layer for up to ``max_len`` positions.

        ``reserve``: positions to allocate now (the rest on demand; see :class:`KVCache`). With
        compiled steps every cache is allocated whole, its length rounded up so that few graphs
        serve every request.
        """
        c = self.cfg
        if self.static is not None:
            max_len, reserve = self.static.cache_length(max_len), None
        w = self.codec_head.weight
        return [
            KVCache(
                batch,
                c.num_key_value_heads,
                max_len,
                c.head_dim,
                dtype=w.dtype,
                device=w.device,
                reserve=reserve,
            )
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
        n = embeds.shape[1]
        one_step = n == 1 and start > 0 and embeds.shape[0] == 1
        if self.static is not None and one_step:
            return self.static.talker_step(embeds, cache, start)
        if self.traced is not None and one_step:
            return self.traced.step(embeds, cache, start)
        cos, sin = self.rope_at(start, embeds, n)
        return self.run_layers(embeds, cos, sin, cache, start)

    def run_layers(
        self, embeds: Tensor, cos: Tensor, sin: Tensor, cache: list[KVCache], start: int
    ) -> tuple[Tensor, Tensor]:
        """The decoder layers, final norm and ``codec_head`` for positions ``[start, start + L)``.

        ``cos``/``sin``: :meth:`rope_at`. ``start`` may be a 0-dim tensor while tracing
        (:mod:`voxcast.models.qwen3_tts.accel.talker_trace`). Returns ``(hidden [B, L, hidden], logits [B, L, vocab])``.
        """
        h = embeds
        for layer, layer_cache in zip(self.model.layers, cache, strict=True):
            h = layer(h, cos, sin, layer_cache, start)
        h = self.model.norm(h)
        return h, self.codec_head(h)

    def rope_at(self, start: int, like: Tensor, n: int = 1) -> tuple[Tensor, Tensor]:
        """cos/sin ``[1, 1, n, D]`` of positions ``[start, start + n)`` in ``like``'s dtype and device."""
        cos, sin = self._rope(start + n, like)
        return cos[start : start + n][None, None], sin[start : start + n][None, None]

    def forward_rows(
        self, embeds: Tensor, caches: list[list[KVCache]], starts: list[int]
    ) -> tuple[Tensor, Tensor]:
        """One decode step for B independent sequences, batched (continuous batching).

        Args:
            embeds: ``[B, 1, hidden]``, row i at absolute position ``starts[i]`` of ``caches[i]``.
            caches: one :meth:`new_cache` (batch 1) per row.
            starts: per-row positions.

        Returns:
            ``(hidden [B, 1, hidden], logits [B, 1, vocab])``. Row values can differ from a
            single-row :meth:`forward` in the last bits (a matmul over B rows accumulates in another
            order than a matrix-vector product).
        """
        if self.traced is not None:
            return self.traced.rows(embeds, caches, starts)
        cos, sin = self.rope_rows(starts, embeds)
        return self.run_rows(embeds, cos, sin, caches, starts)

    def run_rows(
        self, embeds: Tensor, cos: Tensor, sin: Tensor, caches: list[list[KVCache]], starts: list[int]
    ) -> tuple[Tensor, Tensor]:
        """The decoder layers, final norm and ``codec_head`` of :meth:`forward_rows`.

        ``cos``/``sin``: :meth:`rope_rows`. The ``starts`` may be 0-dim tensors while tracing
        (:mod:`voxcast.models.qwen3_tts.accel.talker_trace`).
        """
        h = embeds
        for i, layer in enumerate(self.model.layers):
            assert isinstance(layer, DecoderLayer)
            h = layer.forward_rows(h, cos, sin, [c[i] for c in caches], starts)
        h = self.model.norm(h)
        return h, self.codec_head(h)

    def rope_rows(self, starts: list[int], like: Tensor) -> tuple[Tensor, Tensor]:
        """cos/sin ``[B, 1, 1, D]`` of one position per row (``starts``)."""
        cos_t, sin_t = self._rope(max(starts) + 1, like)
        idx = torch.tensor(starts, device=like.device)
        return cos_t[idx][:, None, None], sin_t[idx][:, None, None]

    def _rope(self, length: int, like: Tensor) -> tuple[Tensor, Tensor]:
        # cos/sin tables [P, D] for positions 0..P-1 (P >= length), computed in one call: the
        # values are elementwise functions of (position, lane), the same as a per-step computation.
        t = self._rope_table
        if t is None or t[0].shape[0] < length or t[0].dtype != like.dtype or t[0].device != like.device:
            size = max(1024, 1 << (length - 1).bit_length())
            positions = torch.arange(size, device=like.device)
            cos, sin = rope_cos_sin(self.inv_freq, positions, like.dtype, self._section)
            t = self._rope_table = (cos[0], sin[0])
        return t

    def fuse(self) -> None:
        """Fuse the projections of every transformer block (talker and code predictor)."""
        for layer in list(self.model.layers) + list(self.code_predictor.model.layers):
            assert isinstance(layer, DecoderLayer)
            layer.fuse()
