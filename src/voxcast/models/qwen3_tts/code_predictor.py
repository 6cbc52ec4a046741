"""The code predictor (the official "sub-talker"): codes 1..15 of a frame from the talker's state.

Per frame it sees two positions, ``[talker hidden (after the final norm), C(code0)]``, projected by
``small_to_mtp_projection`` (a Linear on 1.7B models, identity on 0.6B), and then produces code g
with ``lm_head[g-1]``, feeding ``codec_embedding[g-1](code_g)`` back in. The cache is fresh every
frame: positions start at 0 for each frame, so one small preallocated cache is reused.

Parameter names equal the official ``talker.code_predictor.*`` keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from voxcast.kernels.rows_linear import Linear
from voxcast.models.qwen3_tts.config import CodePredictorConfig
from voxcast.models.qwen3_tts.decode_steps import RecordedPredictorSteps, StaticSteps
from voxcast.models.qwen3_tts.kv_cache import KVCache
from voxcast.models.qwen3_tts.layers import RMSNorm, decoder_layers, rope_cos_sin, rope_inv_freq

__all__ = ["CodePredictor", "Picker"]

#: Chooses one code per row from float32 logits ``[B, vocab]``; returns ``[B]`` (int64).
Picker = Callable[[Tensor], Tensor]


class CodePredictorBackbone(nn.Module):
    """``talker.code_predictor.model``: decoder layers, final norm and the 15 codec embeddings."""

    def __init__(self, cfg: CodePredictorConfig, embedding_dim: int) -> None:
        super().__init__()
        self.layers = decoder_layers(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Embeddings live in the talker's width: they are summed into the talker's next input.
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, embedding_dim) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """``talker.code_predictor``."""

    inv_freq: Tensor

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorBackbone(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            Linear(cfg.hidden_size, cfg.vocab_size, bias=False) for _ in range(cfg.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module = (
            Linear(talker_hidden, cfg.hidden_size, bias=True)
            if talker_hidden != cfg.hidden_size
            else nn.Identity()
        )
        self.register_buffer("inv_freq", rope_inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)
        self._rope_tables: dict[tuple[int, int, torch.dtype, torch.device], tuple[Tensor, Tensor]] = {}
        self._caches: dict[int, list[KVCache]] = {}  # shared per-frame caches by batch size
        self.static: StaticSteps | None = None  # compiled steps (accel.graphs.use_static_decode)
        self.traced: RecordedPredictorSteps | None = None  # recorded steps (accel.cp_trace.use_traced_steps)

    @property
    def num_codes(self) -> int:
        """Codes produced per frame (15)."""
        return self.cfg.num_code_groups - 1

    def new_cache(self, *, batch: int = 1) -> list[KVCache]:
        """A per-layer cache for one frame (``num_code_groups`` positions); reusable across frames."""
        c = self.cfg
        w = self.model.norm.weight
        return [
            KVCache(
                batch, c.num_key_value_heads, c.num_code_groups, c.head_dim, dtype=w.dtype, device=w.device
            )
            for _ in range(c.num_hidden_layers)
        ]

    def _forward(self, embeds: Tensor, cache: list[KVCache], start: int) -> Tensor:
        # embeds: [B, L, talker_hidden] -> normed hidden [B, L, cp_hidden]
        h = self.small_to_mtp_projection(embeds)
        cos, sin = self._rope(start, h.shape[1], h.dtype, h.device)
        for layer, layer_cache in zip(self.model.layers, cache, strict=True):
            h = layer(h, cos, sin, layer_cache, start)
        return self.model.norm(h)

    def _rope(self, start: int, n: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
        # Every frame uses the same positions (0-1, then 2, 3, ... 15): compute each table once,
        # with the same shapes as a fresh computation (so the values are bitwise the same).
        key = (start, n, dtype, device)
        hit = self._rope_tables.get(key)
        if hit is None:
            positions = torch.arange(start, start + n, device=device)
            cos, sin = rope_cos_sin(self.inv_freq, positions, dtype)
            hit = self._rope_tables[key] = (cos.unsqueeze(1), sin.unsqueeze(1))  # [1, 1, L, D]
        return hit

    def shared_cache(self, batch: int) -> list[KVCache]:
        """A per-frame cache for ``batch`` rows, allocated once per batch size and reused.

        Safe to share between streams driven from one thread: every frame writes positions
        0..15 before reading them.
        """
        w = self.model.norm.weight
        cache = self._caches.get(batch)
        if cache is None or cache[0].k.dtype != w.dtype or cache[0].k.device != w.device:
            cache = self._caches[batch] = self.new_cache(batch=batch)
        return cache

    def predict(
        self, talker_hidden: Tensor, code0_embed: Tensor, cache: list[KVCache], pick: Picker
    ) -> Tensor:
        """Codes 1..15 of one frame.

        Args:
            talker_hidden: ``[B, 1, talker_hidden]`` last talker output (after the final norm).
            code0_embed: ``[B, 1, talker_hidden]`` = ``C(code0)``.
            cache: from :meth:`new_cache` (overwritten).
            pick: turns float32 logits ``[B, vocab]`` into codes ``[B]``; called 15 times in order.

        Returns:
            ``[B, 15]`` int64 codes.
        """
        return self.predict_frame(talker_hidden, code0_embed, pick, cache)[0]

    def predict_frame(
        self,
        talker_hidden: Tensor,
        code0_embed: Tensor,
        pick: Picker | Sequence[Picker],
        cache: list[KVCache] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Codes 1..15 of one frame for B rows, and the frame's embedding ``E(frame)``.

        Args:
            talker_hidden: ``[B, 1, talker_hidden]`` last talker outputs (after the final norm).
            code0_embed: ``[B, 1, talker_hidden]`` = ``C(code0)``.
            pick: one picker for all rows, or one per row (each stream keeps its own generator;
                rows are picked in order, each consuming only its own random draws).
            cache: a cache for B rows; default :meth:`shared_cache`.

        Returns:
            ``(codes [B, 15] int64, E(frame) [B, 1, talker_hidden])``, the embedding equal to
            :meth:`frame_embed` (the per-step embeddings are reused instead of looked up again).
        """
        b = talker_hidden.shape[0]
        if cache is None:  # compiled steps run a batch bucket's rows (graphs.batch_bucket)
            cache = self.shared_cache(self.static.batch_rows(b) if self.static is not None else b)
        x = torch.cat((talker_hidden, code0_embed), dim=1)  # [B, 2, H]
        start = 0
        codes: list[Tensor] = []
        embeds = [code0_embed]
        for g in range(self.num_codes):
            if self.static is not None:
                h = self.static.cp_step(x, cache, g)
            elif self.traced is not None:
                h = self.traced.step(x, g)
            else:
                h = self._forward(x, cache, start)
            start += x.shape[1]
            logits = self.lm_head[g](h)[:, -1, :]  # [B, vocab] (all rows: same matmul shape as official)
            if logits.dtype != torch.float32:
                logits = logits.to(torch.float32)
            if callable(pick):
                code = pick(logits)  # [B]
            else:
                code = torch.cat([p(logits[i : i + 1]) for i, p in enumerate(pick)])
            codes.append(code)
            x = self.model.codec_embedding[g](code[:, None])  # [B, 1, H]
            embeds.append(x)
        frame = torch.cat(embeds, dim=1).sum(1, keepdim=True)  # same reduction as frame_embed
        return torch.stack(codes, dim=1), frame

    def frame_embed(self, code0_embed: Tensor, codes: Tensor) -> Tensor:
        """``E(frame)``: ``C(code0) + sum_g codec_embedding[g-1](code_g)``; ``[B, 1, talker_hidden]``.

        Args:
            code0_embed: ``[B, 1, H]``.
            codes: ``[B, 15]`` codes 1..15.
        """
        parts = [code0_embed] + [emb(codes[:, i : i + 1]) for i, emb in enumerate(self.model.codec_embedding)]
        return torch.cat(parts, dim=1).sum(1, keepdim=True)  # same reduction as the official code
