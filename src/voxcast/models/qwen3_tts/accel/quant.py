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
less than fbgemm's 8 bits, read nearer memory bandwidth). Each quantized Linear is an
:class:`Int8Linear` holding both; the model measures at load which is faster
(:func:`int8_kernel_faster`) and sets :attr:`Int8Linear.kernel_rows`.
Prefills and wider batches keep fbgemm, whose integer GEMM is the faster for many rows.
"""

from __future__ import annotations

import logging
import time
import warnings

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.nn.quantized.modules.utils import _quantize_weight

from voxcast.kernels import native as int8_kernel
from voxcast.kernels.rows_linear import set_flags, time_both
from voxcast.models.qwen3_tts.layers import DecoderLayer
from voxcast.models.qwen3_tts.talker import Talker

__all__ = [
    "KERNEL_ROWS",
    "QUANT_MODES",
    "Int8Linear",
    "int8_kernel_faster",
    "layouts_to_store",
    "quantize_int8",
    "stored_tensors",
    "use_int8_kernel",
]

logger = logging.getLogger(__name__)

#: Accepted values of the ``quant`` option.
QUANT_MODES = ("none", "int8")


def _int8(*linears: nn.Linear) -> DynamicLinear:
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
    return _dynamic(qweight, bias)


def _dynamic(qweight: Tensor, bias: Tensor | None) -> DynamicLinear:
    """fbgemm's dynamically quantized Linear for a per-channel int8 weight (packed here)."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Built 1 x 1 so that its constructor's placeholder weight packs at no cost; then resized.
        q = DynamicLinear(1, 1, dtype=torch.qint8)
        q.in_features, q.out_features = int(qweight.shape[1]), int(qweight.shape[0])
        q.set_weight_bias(qweight, bias)
    return q


def _from_stored(tensors: dict[str, Tensor], name: str) -> Int8Linear:
    """The :class:`Int8Linear` that ``name``'s stored int8 weights, scales, bias and kernel layouts
    give (:mod:`.int8_store`): bitwise the one quantization built."""
    int8, scale, bias = tensors[f"{name}.int8"], tensors[f"{name}.scale"], tensors.get(f"{name}.bias")
    zero = torch.zeros(scale.shape[0], dtype=torch.int64)
    with warnings.catch_warnings():  # quantized tensor creation announces its deprecation
        warnings.simplefilter("ignore")
        qweight = torch._make_per_channel_quantized_tensor(int8, scale, zero, 0)
    prefix = f"{name}.packed."
    layouts = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    linear = Int8Linear(_dynamic(qweight, bias), layouts=layouts)
    # what pack_kernel needs besides a layout, so that it need not unpack fbgemm's weights again
    linear._kernel_args = (scale.float().contiguous(), None if bias is None else bias.float().contiguous())
    return linear


#: Most rows (positions x streams) a call may have to run on voxcast's kernel: a decode step of one or
#: two streams, the code predictor's first step of one. More rows go to fbgemm (faster for them).
KERNEL_ROWS = 2


class Int8Linear(nn.Module):
    """An int8 Linear: fbgemm's dynamically quantized one, and voxcast's kernel for a few rows.

    :meth:`pack_kernel` lays the same int8 weights out for :mod:`voxcast.kernels.native`; calls of at most
    :attr:`kernel_rows` rows then run there (0: never). The choice is made per call shape, so a
    recorded step (:mod:`voxcast.models.qwen3_tts.accel.cp_trace`, :mod:`voxcast.models.qwen3_tts.accel.talker_trace`) keeps the kernel it was recorded with.
    """

    kernel_rows = 0

    def __init__(self, q: DynamicLinear, layouts: dict[str, Tensor] | None = None) -> None:
        super().__init__()
        self.q = q
        self.in_features, self.out_features = q.in_features, q.out_features
        self.packed: Tensor | None = None
        self.scale: Tensor | None = None
        self.bias: Tensor | None = None
        #: The kernel variant :attr:`packed` is laid out for (:data:`voxcast.kernels.native.VARIANTS`).
        self.variant: str | None = None
        #: Kernel layouts read from the int8 store, by variant (used by :meth:`pack_kernel`).
        self._layouts = layouts or {}
        #: The kernel's float32 scales and bias, where known without unpacking ``q`` (from the store).
        self._kernel_args: tuple[Tensor, Tensor | None] | None = None

    def pack_kernel(self, variant: str | None = None) -> bool:
        """Prepare the kernel's copy of the weights for a variant (default: this CPU's fastest); False
        where its shape or scheme does not fit."""
        variant = int8_kernel.resolve(variant)
        if self.in_features % int8_kernel.INPUT_MULTIPLE[variant]:
            return False
        stored = self._layouts.get(variant)
        if stored is not None and self._kernel_args is not None:  # fbgemm's weights stay packed
            self.packed, self.variant = stored, variant
            self.scale, self.bias = self._kernel_args
            return True
        weight, bias = self.q._weight_bias()
        per_channel = (torch.per_channel_affine, torch.per_channel_symmetric)
        if weight.qscheme() not in per_channel or bool(weight.q_per_channel_zero_points().any()):
            return False
        self.packed = int8_kernel.pack(weight.int_repr(), variant)
        self.variant = variant
        self.scale = weight.q_per_channel_scales().float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        return True

    def stored_tensors(self, name: str) -> dict[str, Tensor]:
        """What the int8 store keeps of this Linear under ``name`` (:mod:`.int8_store`)."""
        weight, bias = self.q._weight_bias()
        out = {f"{name}.int8": weight.int_repr(), f"{name}.scale": weight.q_per_channel_scales()}
        if bias is not None:
            out[f"{name}.bias"] = bias.detach()
        layouts = dict(self._layouts)
        if self.packed is not None and self.variant is not None:
            layouts[self.variant] = self.packed
        out.update({f"{name}.packed.{v}": t for v, t in layouts.items()})
        return out

    @property
    def layout_stored(self) -> bool:
        """Whether the kernel's current layout came from the int8 store (or there is none to store)."""
        return self.packed is None or self.variant in self._layouts

    def drop_kernel(self) -> None:
        self.packed = self.scale = self.bias = None
        self.variant = None

    def forward(self, x: Tensor) -> Tensor:
        if self.packed is not None and x.numel() <= self.kernel_rows * self.in_features:
            assert self.scale is not None
            return int8_kernel.linear(x, self.packed, self.scale, self.bias, self.variant)
        return self.q(x)


def quantize_int8(talker: Talker, stored: dict[str, Tensor] | None = None) -> list[str]:
    """Replace the decoder blocks' projections and the code predictor's heads with int8 versions (CPU).

    Args:
        stored: the int8 store's tensors (:mod:`.int8_store`) for this checkpoint: those modules are
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
            setattr(parent, attr, _from_stored(stored, name))
        else:
            setattr(parent, attr, Int8Linear(_int8(*(getattr(parent, p) for p in parts))))
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


def layouts_to_store(talker: Talker) -> bool:
    """Whether some :class:`Int8Linear` runs on a kernel layout the int8 store does not hold yet."""
    return any(isinstance(m, Int8Linear) and not m.layout_stored for m in talker.modules())


def stored_tensors(talker: Talker) -> dict[str, Tensor]:
    """Every :class:`Int8Linear` of ``talker`` as the int8 store keeps it, by module name."""
    out: dict[str, Tensor] = {}
    for name, m in talker.named_modules():
        if isinstance(m, Int8Linear):
            out.update(m.stored_tensors(name))
    return out


def use_int8_kernel(module: nn.Module, on: bool, variant: str | None = None) -> int:
    """Pack (on) or drop (off) every :class:`Int8Linear`'s kernel weights and route up to
    :data:`KERNEL_ROWS` rows to the kernel; returns how many Linears use it. Needs
    :func:`voxcast.kernels.native.load` to have succeeded for ``on``; ``variant`` defaults to the CPU's fastest.
    """
    n = 0
    for m in module.modules():
        if isinstance(m, Int8Linear):
            if on and m.pack_kernel(variant):
                n += 1
            else:
                m.drop_kernel()
    set_flags(module, "kernel_rows", KERNEL_ROWS if on else 0)
    return n


def int8_kernel_faster(talker: Talker, reps: int = 6, margin: float = 0.95) -> dict[str, object]:
    """Time one decode row through every talker layer's gate/up projection on fbgemm and on the kernel.

    The layers' weights together exceed the caches, so these are the streaming figures a decode
    step sees. The kernel must be packed (:func:`use_int8_kernel`). Returns ``{"pytorch_ms",
    "voxcast_ms", "voxcast"}``: the kernel is chosen where it takes at most ``margin`` of fbgemm's time.
    """
    linears: list[Int8Linear] = []
    for layer in talker.model.layers:
        m = getattr(getattr(layer, "mlp", None), "gate_up", None)
        if isinstance(m, Int8Linear) and m.packed is not None:
            linears.append(m)
    if not linears or len(linears) != len(talker.model.layers):
        return {"pytorch_ms": None, "voxcast_ms": None, "voxcast": False}
    x = torch.randn(1, 1, linears[0].in_features)

    def run(kernel: bool) -> None:
        for m in linears:
            assert m.packed is not None and m.scale is not None
            if kernel:
                int8_kernel.linear(x, m.packed, m.scale, m.bias, m.variant)
            else:
                m.q(x)

    pytorch_ms, voxcast_ms = time_both(lambda: run(False), lambda: run(True), reps)
    choice = voxcast_ms <= margin * pytorch_ms
    logger.info(
        "int8 decode row: %.2f ms in fbgemm, %.2f ms in voxcast's kernel: using %s",
        pytorch_ms,
        voxcast_ms,
        "voxcast's" if choice else "fbgemm",
    )
    return {"pytorch_ms": pytorch_ms, "voxcast_ms": voxcast_ms, "voxcast": choice}
