"""Static-shape decode steps for ``torch.compile`` and CUDA graphs (``VOXCAST_COMPILE``).

The eager decode path slices each KV cache to the positions filled so far, so every step has a new
shape. Here a step attends over the WHOLE preallocated cache with a boolean mask and writes its
keys/values with ``index_copy_`` at a position held in a tensor, so a step's shapes never change:

- **code predictor**: one frame is 15 forwards at positions 0-1, 2, ..., 15 of a 16-slot cache that
  is shared per batch size (fixed addresses). Two graphs (2 positions, then 1), compiled with
  ``mode="reduce-overhead"`` on CUDA: CUDA graphs replay the ~150 kernels of a step in one launch.
  A batch of B streams runs in the graphs of the next power of two (:func:`batch_bucket`, padded
  with rows of zeros), and warm-up compiles every bucket up to ``max_active``
  (:meth:`StaticDecode.prepare`), so no request waits for a compile and a handful of graphs serve every
  batch size (measured on an H200 before buckets: each new batch size compiled while streams waited,
  4 streams 266 ms a frame against 19 ms for one, and past PyTorch's recompile limit the step fell
  back to eager).
- **talker**: one decode position of one stream. The cache length is rounded up to a power of two
  (:func:`bucket`), so a handful of graphs serve every request; compiled without CUDA graphs (each
  stream has its own cache, at its own address).

Prefill and batched talker rows stay eager. Masked positions contribute exact zeros, but the fused
kernels round differently from the eager ones, so outputs equal the eager path only up to float
rounding (tests compare greedy codes and hidden states within a tolerance). On a CPU the full-cache
attention reads more than the sliced one; ``VOXCAST_COMPILE=auto`` turns this on for CUDA only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.kernels.int8_linear import Int8Linear
from voxcast.kernels.rows_linear import set_flags

if TYPE_CHECKING:
    from voxcast.models.qwen3_tts.kv_cache import KVCache
    from voxcast.models.qwen3_tts.layers import DecoderLayer
    from voxcast.models.qwen3_tts.talker import Talker

__all__ = ["StaticDecode", "batch_bucket", "bucket", "static_decode_for", "use_static_decode"]

logger = logging.getLogger(__name__)

#: Smallest talker cache length used with compiled steps; lengths are powers of two from here.
MIN_BUCKET = 256


#: Compiled graphs kept per function before PyTorch gives up and runs it eagerly (its default, 8, is
#: fewer than the batch and cache-length buckets a long-running server meets).
RECOMPILE_LIMIT = 64


def bucket(length: int) -> int:
    """The talker cache length for ``length`` positions: the next power of two, at least 256."""
    return max(MIN_BUCKET, 1 << max(0, length - 1).bit_length())


def batch_bucket(rows: int) -> int:
    """The rows a compiled code-predictor step runs for ``rows`` streams: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the newer name first
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
            return


def layer_step(
    layer: DecoderLayer,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    pos: Tensor,
    mask: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
) -> Tensor:
    """One decoder block over ``x [B, L, H]`` at positions ``pos [L]`` of a whole static cache.

    ``mask [L, S]`` (True = attend) hides the cache slots after each position; ``k_cache``/``v_cache``
    ``[B, H_kv, S, D]`` are written in place.
    """
    att = layer.self_attn
    b, n, _ = x.shape
    q, k, v = att._qkv_rope(layer.input_layernorm(x), cos, sin)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    out = F.scaled_dot_product_attention(
        q,
        k_cache,
        v_cache,
        attn_mask=mask,
        scale=att.head_dim**-0.5,
        enable_gqa=att.heads != att.kv_heads,
    )
    x = x + att.o_proj(out.transpose(1, 2).reshape(b, n, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _layers(
    layers: nn.ModuleList,
    h: Tensor,
    cos: Tensor,
    sin: Tensor,
    pos: Tensor,
    mask: Tensor,
    ks: list[Tensor],
    vs: list[Tensor],
) -> Tensor:
    """:func:`layer_step` through a stack of decoder blocks, each with its own cache tensors."""
    for layer, k, v in zip(layers, ks, vs, strict=True):
        h = layer_step(layer, h, cos, sin, pos, mask, k, v)  # type: ignore[arg-type]
    return h


class StaticDecode:
    """Compiled static-shape steps for one talker and its code predictor.

    Args:
        talker: the loaded talker (float weights; int8 modules are not traced).
        backend: ``torch.compile`` backend ("inductor"; "eager" traces without generating code,
            which tests use to check the static path quickly).
        cuda_graphs: replay the code predictor's steps as CUDA graphs (CUDA devices only).
    """

    def __init__(self, talker: Talker, *, backend: str = "inductor", cuda_graphs: bool | None = None) -> None:
        device = talker.codec_head.weight.device
        if cuda_graphs is None:
            cuda_graphs = device.type == "cuda"
        if cuda_graphs and device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.talker = talker
        self.device = device
        _raise_recompile_limit()
        cp_mode = "reduce-overhead" if cuda_graphs and backend == "inductor" else None
        self._cp = torch.compile(
            self._cp_forward, backend=backend, mode=cp_mode, dynamic=False, fullgraph=True
        )
        self._talker = torch.compile(self._talker_forward, backend=backend, dynamic=False, fullgraph=True)
        n = talker.code_predictor.cfg.num_code_groups
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        # Code-predictor step masks: step 0 writes positions 0-1, step g >= 1 writes position g + 1.
        self._cp_pos = [torch.arange(0, 2, device=device)] + [
            torch.tensor([g + 1], device=device) for g in range(1, n - 1)
        ]
        self._cp_mask = [causal[p] for p in self._cp_pos]
        self._cp_rope: list[tuple[Tensor, Tensor]] = []
        self._cuda_graphs = cp_mode is not None
        self._static_ids: set[int] = set()  # tensors already marked as fixed graph inputs
        self._positions = torch.arange(bucket(1) * 64, device=device)  # grows on demand
        logger.info("compiled static decode steps (backend=%s, cuda_graphs=%s)", backend, cuda_graphs)

    def cache_length(self, length: int) -> int:
        """The talker cache length compiled steps use for ``length`` positions (:func:`bucket`)."""
        return bucket(length)

    # ------------------------------------------------------------------ code predictor

    def _cp_forward(
        self,
        embeds: Tensor,
        cos: Tensor,
        sin: Tensor,
        pos: Tensor,
        mask: Tensor,
        ks: list[Tensor],
        vs: list[Tensor],
    ) -> Tensor:
        cp = self.talker.code_predictor
        h = _layers(cp.model.layers, cp.small_to_mtp_projection(embeds), cos, sin, pos, mask, ks, vs)
        return cp.model.norm(h)

    @staticmethod
    def batch_rows(rows: int) -> int:
        """The rows the compiled code-predictor step runs for ``rows`` streams (:func:`batch_bucket`)."""
        return batch_bucket(rows)

    def prepare(self, max_batch: int) -> None:
        """Compile (and on CUDA record) the code predictor's steps for every batch bucket up to
        ``max_batch`` streams, running one frame of zeros through each (twice: CUDA graph trees
        record on a later call than the first)."""
        cp = self.talker.code_predictor
        w = self.talker.codec_head.weight
        rows = 1
        with torch.inference_mode():
            while True:
                x = torch.zeros(rows, 1, w.shape[1], dtype=w.dtype, device=w.device)
                for _ in range(2):
                    cp.predict_frame(x, x, lambda logits: logits.argmax(-1))
                if rows >= max_batch:
                    break
                rows *= 2

    def cp_step(self, embeds: Tensor, cache: list[KVCache], step: int) -> Tensor:
        """Normed hidden states ``[B, L, hidden]`` of intra-frame step ``step`` (0..14).

        ``cache`` may hold more rows than ``embeds`` (a :func:`batch_bucket`): the step runs padded
        with rows of zeros and returns the first B rows."""
        cp = self.talker.code_predictor
        b, rows = embeds.shape[0], cache[0].k.shape[0]
        if rows > b:
            embeds = torch.cat((embeds, embeds.new_zeros(rows - b, *embeds.shape[1:])))
        if not self._cp_rope:
            for p in self._cp_pos:
                cos, sin = cp._rope(int(p[0]), len(p), embeds.dtype, embeds.device)
                self._cp_rope.append((cos, sin))
        cos, sin = self._cp_rope[step]
        if self._cuda_graphs and id(cache[0].k) not in self._static_ids:
            # The shared per-batch-size caches live at fixed addresses: mark them (and the step
            # tables) static so that CUDA graphs update them in place instead of copying them.
            tables = [t for pair in self._cp_rope for t in pair] + self._cp_pos + self._cp_mask
            for t in [c.k for c in cache] + [c.v for c in cache] + tables:
                torch._dynamo.mark_static_address(t)
                self._static_ids.add(id(t))
        out = self._cp(
            embeds,
            cos,
            sin,
            self._cp_pos[step],
            self._cp_mask[step],
            [c.k for c in cache],
            [c.v for c in cache],
        )[:b]
        return out.clone() if self.device.type == "cuda" else out  # CUDA graph outputs are reused

    # ------------------------------------------------------------------ talker

    def _talker_forward(
        self,
        embeds: Tensor,
        cos: Tensor,
        sin: Tensor,
        pos: Tensor,
        mask: Tensor,
        ks: list[Tensor],
        vs: list[Tensor],
    ) -> tuple[Tensor, Tensor]:
        t = self.talker
        h = t.model.norm(_layers(t.model.layers, embeds, cos, sin, pos, mask, ks, vs))
        return h, t.codec_head(h)

    def talker_step(self, embeds: Tensor, cache: list[KVCache], start: int) -> tuple[Tensor, Tensor]:
        """One decode position of one stream: ``(hidden [1, 1, H], logits [1, 1, vocab])``."""
        size = cache[0].capacity  # allocated whole (new_cache without reserve)
        if self._positions.shape[0] < size:
            self._positions = torch.arange(size, device=self.device)
        positions = self._positions[:size]
        pos = positions[start : start + 1]
        mask = (positions <= start)[None, :]  # [1, S]
        cos_t, sin_t = self.talker._rope(start + 1, embeds)
        cos, sin = cos_t[pos][None, None], sin_t[pos][None, None]  # [1, 1, 1, D]
        return self._talker(embeds, cos, sin, pos, mask, [c.k for c in cache], [c.v for c in cache])


def static_decode_for(talker: Talker, **kwargs: Any) -> StaticDecode:
    """Build :class:`StaticDecode` for a talker with float weights.

    Raises:
        ValueError: the talker has int8 weights (``quant=int8``): those modules are not compiled.
    """
    if any(isinstance(m, Int8Linear) for m in talker.model.layers.modules()):
        raise ValueError("compile works on float weights; it cannot be combined with quant=int8")
    return StaticDecode(talker, **kwargs)


def use_static_decode(talker: Talker, *, backend: str = "inductor", cuda_graphs: bool | None = None) -> None:
    """Run ``talker``'s single-stream steps and its code predictor's steps through compiled
    static-shape graphs (CUDA graphs for the code predictor on CUDA). Not bit-exact."""
    # voxcast's float32 row kernels (.f32_rows) and oneDNN's linear (no fake tensor form) cannot be
    # traced: PyTorch's kernels again
    set_flags(talker, "f32_rows", False)
    set_flags(talker, "onednn_rows", False)
    set_flags(talker, "row_packed", None)
    talker.static = static_decode_for(talker, backend=backend, cuda_graphs=cuda_graphs)
    talker.code_predictor.static = talker.static
