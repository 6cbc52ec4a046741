"""int8 weights for CPU decoding (``VOXCAST_QUANT=int8``): the talker's and code predictor's Linears.

Decoding reads every weight once per frame (the code predictor's 15 times), so it is bound by memory
bandwidth; int8 weights read a quarter of the bytes. On this CPU ``torch._weight_int8pack_mm`` is
several times slower than the float32 matrix-vector product, while PyTorch's dynamic quantization
(per-output-channel int8 weights, activations quantized per call, fbgemm/x86 kernels) is 3-4x faster,
so that is what is used. Not bit-exact: codes agree with float32 greedy codes only partly (measured by
``scripts/bench_decode.py --quant int8``). Norms and the talker's ``codec_head`` (read elsewhere for
its device/dtype; one matrix per frame) stay in float32, embeddings as loaded (float32, or their
stored bfloat16 widened on lookup: :class:`.checkpoint.WidenedEmbedding`).

Decode rows (one stream's step, the code predictor's two-position first step) can run on voxcast's
own kernel instead (:mod:`voxcast.kernels.native`: the same int8 weights and scales, activations rounded far
less than fbgemm's 8 bits, read nearer memory bandwidth). Each quantized Linear is a
:class:`voxcast.kernels.int8_linear.Int8Linear` holding both; the model uses the kernel wherever it
builds (:func:`voxcast.kernels.int8_linear.choose_int8_kernel`: a fixed rule, since the two round
differently) and sets its ``kernel_rows``.
Prefills and wider batches keep fbgemm, whose integer GEMM is the faster for many rows.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor, nn

from voxcast.kernels.int8_linear import Int8Linear, quantize_weight
from voxcast.models.qwen3_tts.layers import DecoderLayer
from voxcast.models.qwen3_tts.talker import Talker

__all__ = [
    "QUANT_MODES",
    "quantize_int8",
]

logger = logging.getLogger(__name__)

#: Accepted values of the ``quant`` option.
QUANT_MODES = ("none", "int8")


def _int8(*linears: nn.Linear) -> Int8Linear:
    """One int8 Linear computing the given Linears' outputs side by side (weights concatenated).

    Built directly (:func:`voxcast.kernels.int8_linear.quantize_weight`): quantize_dynamic made
    loading 0.6B with int8 weights take ~12 s on 2 cores.
    """
    with torch.no_grad():
        weight = torch.cat([lin.weight for lin in linears]) if len(linears) > 1 else linears[0].weight
        bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
    return Int8Linear(quantize_weight(weight, bias))


def quantize_int8(talker: Talker, stored: dict[str, Tensor] | None = None) -> list[str]:
    """Replace the decoder blocks' projections and the code predictor's heads with int8 versions (CPU).

    Args:
        stored: the int8 store's tensors (:mod:`voxcast.kernels.int8_store`) for this checkpoint: those modules are
            built from them (no quantization, and their float weights are never read).

    Returns:
        The talker's float weights the int8 modules replace (what the store records as its sources).

    Raises:
        ValueError: the model is not on the CPU.
    """
    if talker.codec_head.weight.device.type != "cpu":
        raise ValueError("int8 weights are implemented for the CPU only")
    t0 = time.perf_counter()
    sources: list[str] = []

    def make(parent: nn.Module, path: str, attr: str, *parts: str) -> None:
        """``parent.<attr>`` becomes the int8 Linear of ``parent``'s Linears ``parts`` side by side."""
        name = f"{path}.{attr}"
        sources.extend(f"{path}.{p}.weight" for p in parts)
        if stored is not None and f"{name}.int8" in stored:
            setattr(parent, attr, Int8Linear.from_stored(stored, name))
        else:
            setattr(parent, attr, _int8(*(getattr(parent, p) for p in parts)))
        for p in parts:
            if p != attr:
                delattr(parent, p)  # the float originals are no longer read: free them

    cp = talker.code_predictor
    blocks = [("model.layers", talker.model.layers), ("code_predictor.model.layers", cp.model.layers)]
    for prefix, layers in blocks:
        for i, layer in enumerate(layers):
            assert isinstance(layer, DecoderLayer)
            make(layer.self_attn, f"{prefix}.{i}.self_attn", "qkv", "q_proj", "k_proj", "v_proj")
            make(layer.self_attn, f"{prefix}.{i}.self_attn", "o_proj", "o_proj")
            make(layer.mlp, f"{prefix}.{i}.mlp", "gate_up", "gate_proj", "up_proj")
            make(layer.mlp, f"{prefix}.{i}.mlp", "down_proj", "down_proj")
    for g, head in enumerate(cp.lm_head):
        assert isinstance(head, nn.Linear)
        make(cp.lm_head, "code_predictor.lm_head", str(g), str(g))
    if isinstance(cp.small_to_mtp_projection, nn.Linear):
        make(cp, "code_predictor", "small_to_mtp_projection", "small_to_mtp_projection")
    logger.info(
        "talker and code predictor projections %s int8 (dynamic, per channel) in %.2f s",
        "read as" if stored is not None else "quantized to",
        time.perf_counter() - t0,
    )
    return sources
