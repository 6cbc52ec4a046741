"""int8 weights for CPU decoding (``VOXCAST_QUANT=int8``): the talker's and code predictor's Linears.

Decoding reads every weight once per frame (the code predictor's 15 times), so it is bound by memory
bandwidth; int8 weights read a quarter of the bytes. On this CPU ``torch._weight_int8pack_mm`` is
several times slower than the float32 matrix-vector product, while PyTorch's dynamic quantization
(per-output-channel int8 weights, activations quantized per call, fbgemm/x86 kernels) is 3-4x faster,
so that is what is used. Not bit-exact: codes agree with float32 greedy codes only partly (measured by
``scripts/bench_decode.py --quant int8``). Norms and the talker's ``codec_head`` (read elsewhere for
its device/dtype; one matrix per frame) stay in float32, embeddings as loaded (float32, or their
stored bfloat16 widened on lookup: :class:`.checkpoint.WidenedEmbedding`).
"""

from __future__ import annotations

import logging
import time
import warnings

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.nn.quantized.modules.utils import _quantize_weight

from voxcast.models.qwen3_tts.talker import DecoderLayer, Talker

__all__ = ["QUANT_MODES", "quantize_int8"]

logger = logging.getLogger(__name__)

#: Accepted values of the ``quant`` option.
QUANT_MODES = ("none", "int8")


def _int8(*linears: nn.Linear) -> nn.Module:
    """One dynamically quantized Linear computing the given Linears' outputs side by side.

    The same int8 weights, scales and kernel as ``torch.ao.quantization.quantize_dynamic`` with
    ``per_channel_dynamic_qconfig`` (a test compares them), built directly: quantize_dynamic deep-copies
    its input, initialises a fresh float Linear and packs each weight three times (fbgemm prepack is
    the slow part), which made loading 0.6B with int8 weights take ~12 s on 2 cores.
    """
    # torch.ao.quantization announces its move to torchao, quantize_per_channel its deprecation
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weight = torch.cat([lin.weight for lin in linears]) if len(linears) > 1 else linears[0].weight
        bias = None if linears[0].bias is None else torch.cat([lin.bias for lin in linears])
        observer = torch.ao.quantization.per_channel_dynamic_qconfig.weight()
        observer(weight)
        qweight = _quantize_weight(weight.float(), observer)
        # Built 1 x 1 so that its constructor's placeholder weight packs at no cost; then resized.
        q = DynamicLinear(1, 1, dtype=torch.qint8)
        q.in_features, q.out_features = int(weight.shape[1]), int(weight.shape[0])
        q.set_weight_bias(qweight, bias)
    return q


def _layer(layer: DecoderLayer) -> None:
    att, mlp = layer.self_attn, layer.mlp
    att.qkv_int8 = _int8(att.q_proj, att.k_proj, att.v_proj)
    att.o_proj = _int8(att.o_proj)  # type: ignore[assignment]
    mlp.gate_up_int8 = _int8(mlp.gate_proj, mlp.up_proj)
    mlp.down_proj = _int8(mlp.down_proj)  # type: ignore[assignment]
    # The float32 originals are no longer read: free them.
    del att.q_proj, att.k_proj, att.v_proj, mlp.gate_proj, mlp.up_proj


def quantize_int8(talker: Talker) -> None:
    """Replace the decoder blocks' projections and the code predictor's heads with int8 versions (CPU).

    Raises:
        ValueError: the model is not on the CPU.
    """
    if talker.codec_head.weight.device.type != "cpu":
        raise ValueError("int8 weights are implemented for the CPU only")
    t0 = time.perf_counter()
    cp = talker.code_predictor
    for layer in list(talker.model.layers) + list(cp.model.layers):
        assert isinstance(layer, DecoderLayer)
        _layer(layer)
    for g, head in enumerate(cp.lm_head):
        assert isinstance(head, nn.Linear)
        cp.lm_head[g] = _int8(head)
    if isinstance(cp.small_to_mtp_projection, nn.Linear):
        cp.small_to_mtp_projection = _int8(cp.small_to_mtp_projection)
    logger.info(
        "talker and code predictor projections quantized to int8 (dynamic, per channel) in %.2f s",
        time.perf_counter() - t0,
    )
