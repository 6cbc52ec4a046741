"""Whole frames of many streams as one static-shape function (``VOXCAST_BATCH_GRAPHS``).

The default batched step (:func:`..generator.step_many`) keeps one :class:`~..kv_cache.KVCache` per
stream, each of its own length, so the talker's batched rows run eagerly with per-row attention,
and every row samples in Python with its own ``torch.Generator``. On a GPU that is launch-bound:
measured on an H200 (bfloat16, 0.6B), 4 streams made 30.2 frames/s in all against 39.8 for one.
Here a frame of B streams is one function of fixed shapes, captured once per batch bucket as a
CUDA graph (manual ``torch.cuda.CUDAGraph`` capture: no inductor compile, a cold start pays a few
captures) and replayed; on a CPU the same function runs eagerly.

**Slots.** One preallocated key/value tensor per talker layer ``[R, H_kv, S, D]`` holds R streams;
a stream owns a slot (a row) from its first frame to its last. Each slot's position is in a tensor
(``pos [R]``); a step writes its keys/values at ``(row, pos[row])`` with ``scatter_`` and attends
over all S positions with the per-row mask ``arange(S) <= pos[row]``, so no shape depends on a
row's length and nothing reads a length back to the host. S grows in powers of two from 256
(:func:`.graphs.bucket`) when a stream reaches it (tensors reallocated, graphs captured again).
A stream's prefill stays eager in its own cache (prefix cache, prefill in parts unchanged); its
keys/values are copied into its slot when it first steps. The prefill's draw (the first frame's code 0)
is the exact sampler's (the stream's own seeded generator, alone); every later draw is counter-based.

**Slots and batch buckets: compaction.** Live streams always occupy slots ``[0, n)`` and a frame
runs rows ``[0, B)`` with ``B = batch_bucket(n)``; when a stream ends, the stream in the last slot
moves into its slot (one copy of one row's cache, S positions). The alternative, gathering the
active rows' caches into a batch every frame, copies every row's whole cache every frame; keeping
slots where they are and running all R rows wastes compute on empty rows at every frame. Compaction
pays one row copy per stream end, which is rare next to frames (a stream makes hundreds). Rows of a
bucket that hold no live stream this frame (padding, or a stream waiting for text) compute values
that are discarded: their state is updated only where ``live``; the only write they make is a
key/value at their own next position, which their next real step overwrites before reading it.

**The frame** (``_frame``): talker step of B rows (for rows whose first frame this is, the code 0
and hidden state of the prefill are kept instead), code 0 by :class:`.row_sampling.RowSampling`
(graph-safe, counter-based draws: a row's draws do not depend on its batch), the code predictor's
15 steps over a static 16-position cache (:func:`.graphs.layer_step`), its 15 draws, and the frame
embedding for the next talker input. One host sync a frame for the whole batch: reading code 0 to
see which streams ended.

Greedy codes equal the eager path's up to float rounding (masked full-cache attention, batched
matmuls: identical on the tiny checkpoint); sampled codes do not equal the official sampler's (see
:mod:`.row_sampling`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from voxcast.models.qwen3_tts.accel.graphs import _layers, batch_bucket, bucket
from voxcast.models.qwen3_tts.accel.row_sampling import RowSampling
from voxcast.models.qwen3_tts.sampling import TalkerSampler

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.generator import FrameGenerator
    from voxcast.models.qwen3_tts.layers import DecoderLayer
    from voxcast.models.qwen3_tts.talker import Talker

__all__ = ["BatchedFrames"]

logger = logging.getLogger(__name__)


@dataclass
class _Slot:
    gen: weakref.ref[FrameGenerator]
    pos: int  # host copy of the slot's next talker position (no read-back)
    stepped: bool = False  # whether it made a frame (then each frame starts with a talker step)


@dataclass
class _Inputs:
    """Host-written inputs of a frame (fixed addresses, copied into before a run) and the CUDA
    graphs captured over them and the slots' tensors of the same allocation (by batch bucket)."""

    text: Tensor  # [R, 1, H] text-track input of the talker step
    step: Tensor  # [R] bool: the row runs a talker step this frame
    live: Tensor  # [R] bool: the row makes a frame this frame
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)


def _row_layer(
    layer: DecoderLayer,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    index: Tensor,
    mask: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
) -> Tensor:
    """One decoder block for one position of each row: ``x [B, 1, H]`` at its own position.

    ``index [B, H_kv, 1, D]``: each row's position, expanded (``scatter_`` target); ``mask
    [B, 1, 1, S]``: True where a row attends; ``k_cache``/``v_cache`` ``[B, H_kv, S, D]`` written in place.
    """
    att = layer.self_attn
    b = x.shape[0]
    q, k, v = att._qkv_rope(layer.input_layernorm(x), cos, sin)  # q [B, H, 1, D], k/v [B, Hkv, 1, D]
    k_cache.scatter_(2, index, k)
    v_cache.scatter_(2, index, v)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k_cache, v_cache, attn_mask=mask, scale=att.head_dim**-0.5, enable_gqa=att.heads != att.kv_heads
    )
    x = x + att.o_proj(out.transpose(1, 2).reshape(b, 1, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


class BatchedFrames:
    """Slots and per-bucket frame functions for one talker and its code predictor.

    Args:
        talker: the loaded talker (float weights on any device).
        cuda_graphs: capture each batch bucket's frame as a CUDA graph (default: on CUDA devices).
        rows: slots to allocate at first (grown by doubling when more streams are active).
    """

    def __init__(self, talker: Talker, *, cuda_graphs: bool | None = None, rows: int = 1) -> None:
        w = talker.codec_head.weight
        self.talker, self.device, self.dtype = talker, w.device, w.dtype
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.cuda_graphs = cuda_graphs
        self._slots: list[_Slot] = []
        self._rows = 0
        self._length = 0
        self._pool: Any = None  # CUDA graph memory pool, shared by every bucket
        self.captures = 0  # CUDA graphs captured so far (a cold start's cost)
        cp = talker.code_predictor
        n = cp.cfg.num_code_groups
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        self._cp_pos = [torch.arange(0, 2, device=self.device)] + [
            torch.tensor([g + 1], device=self.device) for g in range(1, n - 1)
        ]
        self._cp_mask = [causal[p] for p in self._cp_pos]
        self._cp_rope = [cp._rope(int(p[0]), len(p), self.dtype, self.device) for p in self._cp_pos]
        self._allocate(max(1, rows), bucket(1))

    # ------------------------------------------------------------------ slots

    @property
    def rows(self) -> int:
        """Slots allocated."""
        return self._rows

    @property
    def length(self) -> int:
        """Positions each slot holds (S)."""
        return self._length

    @property
    def active(self) -> int:
        """Slots held by streams."""
        return len(self._slots)

    def _allocate(self, rows: int, length: int) -> None:
        """(Re)allocate every per-slot tensor for ``rows`` x ``length``, keeping the held slots'
        contents; captured graphs are dropped (they read the old tensors)."""
        t, cp = self.talker, self.talker.code_predictor
        c, cc = t.cfg, cp.cfg
        dev, dt = self.device, self.dtype
        kv = (rows, c.num_key_value_heads, length, c.head_dim)
        ks = [torch.zeros(kv, device=dev, dtype=dt) for _ in range(c.num_hidden_layers)]
        vs = [torch.zeros(kv, device=dev, dtype=dt) for _ in range(c.num_hidden_layers)]
        cpkv = (rows, cc.num_key_value_heads, cc.num_code_groups, cc.head_dim)
        self._cp_k = [torch.zeros(cpkv, device=dev, dtype=dt) for _ in range(cc.num_hidden_layers)]
        self._cp_v = [torch.zeros(cpkv, device=dev, dtype=dt) for _ in range(cc.num_hidden_layers)]
        h, long = c.hidden_size, torch.long
        state = {
            "pos": torch.zeros(rows, device=dev, dtype=long),  # [R] next talker position
            "code0": torch.zeros(rows, device=dev, dtype=long),  # [R] code 0 of the frame to make
            "hidden": torch.zeros(rows, 1, h, device=dev, dtype=dt),  # [R, 1, H] last talker output
            "pending": torch.zeros(rows, 1, h, device=dev, dtype=dt),  # [R, 1, H] E(last frame)
            "out": torch.zeros(rows, cc.num_code_groups, device=dev, dtype=long),  # [R, 16] the frame
        }
        sampling = RowSampling(rows, c.vocab_size, c.codec_eos_token_id, cc.vocab_size, self.device)
        if self._rows:  # keep what the held slots wrote
            n, s = len(self._slots), min(self._length, length)
            for new, prev in zip(ks + vs, self._row_kv(), strict=True):
                new[:n, :, :s] = prev[:n, :, :s]
            for new, prev in zip(self._row_state(state, sampling), self._row_state(), strict=True):
                new[:n] = prev[:n]
        self._in = _Inputs(
            torch.zeros(rows, 1, h, device=dev, dtype=dt),
            torch.zeros(rows, device=dev, dtype=torch.bool),
            torch.zeros(rows, device=dev, dtype=torch.bool),
        )
        self._k, self._v, self._state, self.sampling = ks, vs, state, sampling
        self._rows, self._length = rows, length
        cos, sin = t._rope(length, ks[0])  # [P >= S, D]
        self._cos, self._sin = cos[:length], sin[:length]
        self._positions = torch.arange(length, device=self.device)

    def _row_kv(self) -> list[Tensor]:
        return self._k + self._v

    def _row_state(
        self, state: dict[str, Tensor] | None = None, sampling: RowSampling | None = None
    ) -> list[Tensor]:
        st = self._state if state is None else state
        smp = self.sampling if sampling is None else sampling
        return [st["pos"], st["code0"], st["hidden"], st["pending"], *smp.row_tensors()]

    def _attach(self, g: FrameGenerator) -> int:
        """Give ``g`` (prefilled) the next free slot (returned): its prefill keys/values, state and
        sampler state (settings, seed, codes drawn by its prefill)."""
        i = len(self._slots)
        if i >= self._rows:
            self._allocate(2 * self._rows, self._length)
        if g._pos + 1 > self._length:
            self._allocate(self._rows, bucket(g._pos + 1))
        for layer, cache in enumerate(g._cache):
            self._k[layer][i, :, : g._pos] = cache.k[0, :, : g._pos]
            self._v[layer][i, :, : g._pos] = cache.v[0, :, : g._pos]
        st = self._state
        st["pos"][i] = g._pos
        st["code0"][i] = g._code0[0]  # type: ignore[index]
        st["hidden"][i] = g._hidden[0]  # type: ignore[index]
        pick = g._talker_pick
        assert isinstance(pick, TalkerSampler)
        self.sampling.set_row(i, pick.settings, g.seed, pick._seen[0], pick.samples)
        g._cache = []  # the slot holds it now
        self._slots.append(_Slot(weakref.ref(g), g._pos))
        return i

    def _release(self, i: int) -> None:
        """Free slot ``i``: the last slot's stream moves into it (compaction)."""
        last = len(self._slots) - 1
        if i != last:
            for t in self._row_kv() + self._row_state():
                t[i] = t[last]
            self._slots[i] = self._slots[last]
        self._slots.pop()

    def _sweep(self) -> None:
        """Release the slots of streams that finished or were dropped (cancelled, garbage-collected)."""
        i = 0
        while i < len(self._slots):
            g = self._slots[i].gen()
            if g is None or g.done:
                self._release(i)
            else:
                i += 1

    # ------------------------------------------------------------------ the frame

    def _frame(self, b: int) -> None:
        """One frame of rows ``[0, b)``: reads ``_in``, updates the slots' state, writes ``out[:b]``."""
        t, _cp, st, smp = self.talker, self.talker.code_predictor, self._state, self.sampling
        step, live = self._in.step[:b], self._in.live[:b]
        pos = st["pos"][:b]
        x = st["pending"][:b] + self._in.text[:b]  # [B, 1, H]
        cos, sin = self._cos[pos][:, None, None], self._sin[pos][:, None, None]  # [B, 1, 1, D]
        k0 = self._k[0]
        index = pos.view(b, 1, 1, 1).expand(b, k0.shape[1], 1, k0.shape[3])
        mask = (self._positions[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, S]
        h = x
        for layer, k, v in zip(t.model.layers, self._k, self._v, strict=True):
            h = _row_layer(layer, h, cos, sin, index, mask, k[:b], v[:b])  # type: ignore[arg-type]
        h = t.model.norm(h)
        logits = t.codec_head(h)[:, -1, :].to(torch.float32)  # [B, V]
        code0 = smp.talker_pick(logits, step)
        code0 = torch.where(step, code0, st["code0"][:b])
        hidden = torch.where(step[:, None, None], h, st["hidden"][:b])
        pos.add_(step.long())
        codes, frame = self._predict(hidden, t.codec_embed(code0[:, None]), b)
        smp.end_frame(live)
        keep = live[:, None, None]
        st["pending"][:b] = torch.where(keep, frame, st["pending"][:b])
        st["hidden"][:b] = torch.where(keep, hidden, st["hidden"][:b])
        st["code0"][:b] = torch.where(live, code0, st["code0"][:b])
        st["out"][:b, 0] = code0
        st["out"][:b, 1:] = codes

    def _predict(self, hidden: Tensor, code0_embed: Tensor, b: int) -> tuple[Tensor, Tensor]:
        """The code predictor's 15 steps (as ``CodePredictor.predict_frame``, static cache)."""
        cp = self.talker.code_predictor
        x = torch.cat((hidden, code0_embed), dim=1)  # [B, 2, H]
        ks, vs = [k[:b] for k in self._cp_k], [v[:b] for v in self._cp_v]
        codes, embeds = [], [code0_embed]
        for g in range(cp.num_codes):
            cos, sin = self._cp_rope[g]
            h = _layers(
                cp.model.layers,
                cp.small_to_mtp_projection(x),
                cos,
                sin,
                self._cp_pos[g],
                self._cp_mask[g],
                ks,
                vs,
            )
            logits = cp.lm_head[g](cp.model.norm(h))[:, -1, :].to(torch.float32)  # [B, vocab]
            code = self.sampling.code_pick(logits, g)
            codes.append(code)
            x = cp.model.codec_embedding[g](code[:, None])  # [B, 1, H]
            embeds.append(x)
        return torch.stack(codes, dim=1), torch.cat(embeds, dim=1).sum(1, keepdim=True)

    def _run(self, b: int) -> None:
        if not self.cuda_graphs:
            self._frame(b)
            return
        graph = self._in.graphs.get(b)
        if graph is None:
            graph = self._in.graphs[b] = self._capture(b)
        graph.replay()

    def _capture(self, b: int) -> torch.cuda.CUDAGraph:
        """Record bucket ``b``'s frame. Warm-up runs happen with no row live (state unchanged)."""
        step, live = self._in.step[:b].clone(), self._in.live[:b].clone()
        self._in.step[:b] = False
        self._in.live[:b] = False
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # lazy initialisations (cuBLAS workspaces) before capture
                self._frame(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._frame(b)
        self._in.step[:b] = step
        self._in.live[:b] = live
        self.captures += 1
        return graph

    # ------------------------------------------------------------------ public

    def prepare(self, max_batch: int) -> None:
        """Allocate slots for ``max_batch`` streams and build (capture, on CUDA) every batch bucket's
        frame up to it, so that no request waits for one (at warm-up)."""
        rows = batch_bucket(max(1, max_batch))
        with torch.inference_mode():
            if rows > self._rows:
                self._allocate(rows, self._length)
            b = 1
            while b <= rows:
                if self.cuda_graphs:
                    if b not in self._in.graphs:
                        self._in.graphs[b] = self._capture(b)
                else:
                    self._in.step[:b] = False
                    self._in.live[:b] = False
                    self._frame(b)
                b *= 2

    @torch.inference_mode()
    def step_many(self, gens: Sequence[FrameGenerator]) -> list[Tensor | None]:
        """One frame for each of ``gens`` (as :func:`..generator.step_many`), in slots.

        Returns:
            Per generator: its frame's codes (LongTensor ``[16]``), or None once it has finished.
        """
        self._sweep()
        live = [g for g in gens if g._ready()]
        self._sweep()  # streams that reached their frame limit
        if not live:
            return [None] * len(gens)
        t0 = time.perf_counter()
        by_gen = {id(s.gen()): i for i, s in enumerate(self._slots)}
        rows = [by_gen[id(g)] if id(g) in by_gen else self._attach(g) for g in live]
        b = batch_bucket(len(self._slots))
        need = max(s.pos for s in self._slots) + 1
        if need > self._length or b > self._rows:
            self._allocate(max(self._rows, b), bucket(need) if need > self._length else self._length)
        self._fill(live, rows, b)
        self._run(b)
        frames = self._state["out"][:b].clone()
        code0 = frames[:, 0].tolist()  # the one host sync of a frame
        out: dict[int, Tensor] = {}
        dt = time.perf_counter() - t0
        for g, i in zip(live, rows, strict=True):
            slot = self._slots[i]
            slot.pos += int(slot.stepped)
            slot.stepped = True
            g.talker_s += dt  # the whole frame: talker and code predictor are one function here
            if code0[i] == g._eos:
                g._finish("eos")
            else:
                g.frames += 1
                g._pending = self._state["pending"][i : i + 1]  # marks that a frame was emitted
                out[id(g)] = frames[i]
        self._sweep()
        return [out.get(id(g)) for g in gens]

    def _fill(self, live: list[FrameGenerator], rows: list[int], b: int) -> None:
        """Write the frame's inputs for rows ``[0, b)``: text rows, and which rows step / are live."""
        h = self._in.text.shape[-1]
        text = [torch.zeros(1, 1, h, device=self.device, dtype=self.dtype)] * b
        step, on = [False] * b, [False] * b
        for g, i in zip(live, rows, strict=True):
            on[i] = True
            if self._slots[i].stepped:
                step[i] = True
                text[i] = g._next_text()
        self._in.text[:b] = torch.cat(text)
        flags = torch.tensor([step, on], dtype=torch.bool)
        self._in.step[:b] = flags[0].to(self.device, non_blocking=True)
        self._in.live[:b] = flags[1].to(self.device, non_blocking=True)
