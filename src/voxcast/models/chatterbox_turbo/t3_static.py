"""T3's decode step at fixed shapes: a static key/value cache, one function per batch
bucket that a CUDA graph captures, batched across streams.

The eager step (:meth:`.t3.TokenStream.next`) grows each stream's cache by concatenation and samples
with tensors of changing shapes (the repetition penalty gathers over every token so far): on a GPU
each of GPT-2's ~300 kernels per token is launched from Python, and T3 was launch-bound (36.5 ms a
token on an H100 where the weights take ~0.3 ms to read). :class:`StaticT3` keeps

- one key/value cache of ``slots`` rows, ``length`` positions each (``[layers, slots, heads, length,
  head_dim]``); a stream takes a free slot when it starts steady decoding (after its prefill and first
  token) and its dynamic cache is copied in; its position is a tensor (``pos [slots]``), the attention
  masks the positions after it;
- the tokens each stream has drawn as a mask ``seen [slots, vocab]`` (the repetition penalty reads
  it: the same values as the eager ``gather``/``scatter`` over the token list);
- per-row sampling settings as tensors.

:meth:`StaticT3._step` runs every row of a bucket (the first ``bucket`` slots; rows not stepping
compute and write at their own next position, which their next real step overwrites, and their
outputs are dropped). It is an ordinary function: on a CPU it runs eagerly; on CUDA
:meth:`StaticT3.capture` records it once per bucket into a ``torch.cuda.CUDAGraph`` and a step is a
replay.

Sampling. On a CPU the step returns the processed probabilities and each row draws
``torch.multinomial(probs, 1, generator)`` from its stream's own generator: the draws today's eager
path makes (same seed, same tokens, up to the float rounding of the masked attention). A captured
graph cannot call a per-stream generator, so the CUDA path draws each row's exponential noise
``q ~ Exp(1)`` from its stream's generator into a static buffer before the replay and the graph takes
``argmax(probs / q)`` (the exponential-race form of the same categorical distribution, as gpt-fast
samples): seeded and reproducible, but other draws than ``torch.multinomial``'s.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from voxcast.models.chatterbox_turbo.gpt2 import Block, KVCache, new_gelu

if TYPE_CHECKING:
    from voxcast.models.chatterbox_turbo.t3 import T3, TokenStream

__all__ = ["DEFAULT_LENGTH", "StaticT3", "buckets"]

log = logging.getLogger(__name__)

#: Positions per slot: a 375-token voice prefix, a few hundred text tokens and upstream's 1000
#: speech tokens fit; a stream that could outgrow it decodes eagerly.
DEFAULT_LENGTH = 2048


def buckets(slots: int) -> tuple[int, ...]:
    """Batch buckets for ``slots`` rows: powers of two, then ``slots``."""
    out, b = [], 1
    while b < slots:
        out.append(b)
        b *= 2
    return (*out, slots)


class StaticT3:
    """T3's steady decode step for up to ``slots`` streams at fixed shapes (see the module docstring).

    Args:
        t3: the model (its weights are read, never copied).
        slots: streams decoded at once (the engine's ``max_active``).
        length: positions per slot (a stream's prefix, text and speech tokens together).
        graphs: capture each bucket's step as a CUDA graph (:meth:`capture`; CUDA only).
    """

    def __init__(self, t3: T3, slots: int, length: int = DEFAULT_LENGTH, *, graphs: bool = False) -> None:
        cfg = t3.cfg
        w = t3.speech_head.weight
        self.t3, self.slots, self.length = t3, slots, min(length, cfg.positions)
        self.device, self.dtype = w.device, w.dtype
        self.buckets = buckets(slots)
        hd = cfg.width // cfg.heads
        kv = (cfg.layers, slots, cfg.heads, self.length, hd)
        dev = self.device
        self.keys = torch.zeros(kv, dtype=self.dtype, device=dev)  # [L, S, H, T, D]
        self.values = torch.zeros(kv, dtype=self.dtype, device=dev)
        self.pos = torch.zeros(slots, dtype=torch.long, device=dev)  # next position per slot
        self.token = torch.zeros(slots, 1, dtype=torch.long, device=dev)  # last token per slot
        self.seen = torch.zeros(slots, cfg.speech_vocab, dtype=torch.bool, device=dev)
        self.temperature = torch.ones(slots, 1, dtype=torch.float32, device=dev)
        self.top_k = torch.full((slots, 1), cfg.speech_vocab, dtype=torch.long, device=dev)
        self.top_p_on = torch.zeros(slots, 1, dtype=torch.bool, device=dev)
        self.top_p_cut = torch.zeros(
            slots, 1, dtype=self.dtype, device=dev
        )  # 1 - top_p, in the logits' dtype
        self.penalty = torch.ones(slots, 1, dtype=torch.float32, device=dev)
        self.greedy = torch.zeros(slots, 1, dtype=torch.bool, device=dev)
        self.q = torch.ones(slots, cfg.speech_vocab, dtype=torch.float32, device=dev)  # Exp(1) noise (graphs)
        self._positions = torch.arange(self.length, device=dev)
        self.steps = 0  # steps run (rows: :attr:`rows`), for reports and tests
        self.rows = 0
        self._free = list(range(slots))
        self._lock = threading.Lock()
        self._owner: dict[int, object] = {}  # slot -> the ticket of the stream holding it
        self.graphs = graphs and self.device.type == "cuda"
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[Tensor, Tensor]]] = {}

    # ------------------------------------------------------------------ slots

    def fits(self, stream: TokenStream) -> bool:
        """Whether ``stream``'s cache and the tokens it may still draw fit a slot."""
        return stream.cache.length + stream.max_tokens - len(stream.tokens) + 1 <= self.length

    def admit(self, stream: TokenStream) -> int | None:
        """A slot for ``stream`` (its own if it has one), its cache and tokens copied in; None when
        every slot is taken or the stream would outgrow one (it decodes eagerly then)."""
        if stream.slot is not None:
            return stream.slot
        if not self.fits(stream) or not stream.steady:
            return None
        with self._lock:
            if not self._free:
                return None
            slot = self._free.pop(0)
        n = stream.cache.length
        with torch.inference_mode():
            for i, (k, v) in enumerate(zip(stream.cache.keys, stream.cache.values, strict=True)):
                assert k is not None and v is not None
                self.keys[i, slot, :, :n] = k[0]
                self.values[i, slot, :, :n] = v[0]
            self.pos[slot] = n
            self.token[slot] = stream.tokens[-1][0]
            self.seen[slot] = False
            self.seen[slot, torch.cat(stream.tokens, dim=1)[0]] = True
            s = stream.sampling
            t = s.temperature if s.temperature > 0 else 1.0
            self.temperature[slot] = t
            self.top_k[slot] = (
                min(s.top_k, self.t3.cfg.speech_vocab) if s.top_k > 0 else self.t3.cfg.speech_vocab
            )
            self.top_p_on[slot] = s.top_p < 1.0
            self.top_p_cut[slot] = 1 - s.top_p
            self.penalty[slot] = s.repetition_penalty
            self.greedy[slot] = s.greedy
        ticket = object()
        stream.slot, stream.slot_ticket, stream.static = slot, ticket, self
        stream.cache = KVCache()  # the slot holds it now
        self._owner[slot] = ticket
        weakref.finalize(stream, self._release, slot, ticket)  # a stream dropped unfinished
        return slot

    def release(self, stream: TokenStream) -> None:
        """Give ``stream``'s slot back (it finished)."""
        if stream.slot is not None:
            self._release(stream.slot, stream.slot_ticket)
            stream.slot, stream.static = None, None

    def _release(self, slot: int, ticket: object) -> None:
        with self._lock:  # also called by a finaliser, on whichever thread collects the stream
            if self._owner.get(slot) is ticket:
                del self._owner[slot]
                self._free.append(slot)
                self._free.sort()

    # ------------------------------------------------------------------ the step

    def _step(self, bucket: int) -> tuple[Tensor, Tensor]:
        """One position for the first ``bucket`` slots, at fixed shapes: writes each row's key and
        value at ``pos``, returns (probabilities ``[bucket, vocab]``, the graph path's token
        ``[bucket, 1]``) and advances nothing (:meth:`step` does)."""
        t3, n = self.t3, bucket
        pos, token = self.pos[:n], self.token[:n]
        x = t3.speech_emb(token) + t3.tfmr.wpe(pos[:, None])  # [n, 1, width]
        mask = (self._positions[None, :] <= pos[:, None])[:, None, None, :]  # [n, 1, 1, T]
        rows = torch.arange(n, device=self.device)
        for i, block in enumerate(t3.tfmr.h):
            x = self._block(cast(Block, block), x, i, n, rows, pos, mask)
        logits = t3.logits(t3.tfmr.ln_f(x))[:, 0]  # [n, vocab]
        probs = torch.softmax(self._process(logits, n), dim=-1)
        drawn = torch.argmax(probs / self.q[:n], dim=-1, keepdim=True)
        return probs, torch.where(self.greedy[:n], logits.argmax(dim=-1, keepdim=True), drawn)

    def _block(
        self, block: Block, x: Tensor, i: int, n: int, rows: Tensor, pos: Tensor, mask: Tensor
    ) -> Tensor:
        attn, h = block.attn, block.ln_1(x)
        q, k, v = attn.c_attn(h).split(attn.width, dim=2)
        q, k, v = (t.view(n, 1, attn.heads, attn.head_dim).transpose(1, 2) for t in (q, k, v))  # [n, H, 1, D]
        keys, values = self.keys[i, :n], self.values[i, :n]  # [n, H, T, D]
        keys[rows, :, pos] = k[:, :, 0]
        values[rows, :, pos] = v[:, :, 0]
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        out = attn.c_proj(out.transpose(1, 2).reshape(n, 1, -1).contiguous())
        x = out + x
        mlp = block.mlp
        return x + mlp.c_proj(new_gelu(mlp.c_fc(block.ln_2(x))))

    def _process(self, logits: Tensor, n: int) -> Tensor:
        """:func:`.sampling.process_logits` with per-row settings and the seen mask, at fixed shapes
        (in the logits' dtype; a float32 setting rounds back as the eager path's Python scalar does)."""
        dtype = logits.dtype
        scores = (logits / self.temperature[:n]).to(dtype)
        top = torch.topk(scores, scores.shape[-1] if n else 1, dim=-1)[0]
        kth = top.gather(1, self.top_k[:n] - 1)
        scores = scores.masked_fill(scores < kth, -float("inf"))
        sorted_logits, sorted_idx = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= self.top_p_cut[:n]
        remove[..., -1:] = 0
        remove = remove & self.top_p_on[:n]
        scores = scores.masked_fill(remove.scatter(1, sorted_idx, remove), -float("inf"))
        p = self.penalty[:n]
        penalised = torch.where(scores < 0, (scores * p).to(dtype), (scores / p).to(dtype))
        return torch.where(self.seen[:n], penalised, scores)

    def bucket_for(self, slots: Sequence[int]) -> int:
        top = max(slots) + 1
        return next(b for b in self.buckets if b >= top)

    def step(self, streams: Sequence[TokenStream]) -> list[int | None]:
        """The next token of each admitted stream (:meth:`admit`), one batched step."""
        slots = [s.slot for s in streams]
        assert all(s is not None for s in slots)
        idx = [int(s) for s in slots if s is not None]
        bucket = self.bucket_for(idx)
        self.steps, self.rows = self.steps + 1, self.rows + len(idx)
        with torch.inference_mode():
            if self.graphs:
                for s, i in zip(streams, idx, strict=True):
                    self.q[i].exponential_(generator=s.generator)
                probs, token = self._replay(bucket)
            else:
                probs, token = self._step(bucket)
                tokens = torch.cat(
                    [
                        token[i : i + 1] if s.sampling.greedy
                        else torch.multinomial(probs[i : i + 1], 1, generator=s.generator)
                        for s, i in zip(streams, idx, strict=True)
                    ]
                )  # fmt: skip
            rows = torch.tensor(idx).to(self.device, non_blocking=True)
            if self.graphs:
                tokens = token.index_select(0, rows)
            self.pos[rows] += 1
            self.token[rows] = tokens
            self.seen[rows, tokens[:, 0]] = True
            values = tokens[:, 0].tolist()  # the one sync of a step: the engine needs the tokens
        out = [s._took(tokens[j : j + 1], values[j]) for j, s in enumerate(streams)]
        for s in streams:
            if s.done:
                self.release(s)
        return out

    # ------------------------------------------------------------------ CUDA graphs

    def capture(self) -> None:
        """Record each bucket's step as a CUDA graph (after a warm-up run on a side stream, as
        PyTorch's graph guide does). The steps write only into this object's buffers."""
        if not self.graphs:
            return
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for b in self.buckets:
                self._step(b)
        torch.cuda.current_stream(self.device).wait_stream(side)
        pos = self.pos.clone()
        for b in self.buckets:
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph):
                out = self._step(b)
            self._graphs[b] = (graph, out)
        self.pos.copy_(pos)  # capture wrote garbage at the rows' next positions only
        log.info("T3 static decode: captured %d CUDA graphs (buckets %s)", len(self._graphs), self.buckets)

    def _replay(self, bucket: int) -> tuple[Tensor, Tensor]:
        hit = self._graphs.get(bucket)
        if hit is None:
            return self._step(bucket)
        hit[0].replay()
        return hit[1]
