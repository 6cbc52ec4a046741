"""int8 Linears for CPU decoding, whatever the model: fbgemm's dynamically quantized Linear, and
voxcast's own kernel (:mod:`.native`) for the few rows of a decode step.

Decoding reads every weight once per step, so it is bound by memory bandwidth; int8 weights read a
quarter of float32's bytes. PyTorch's dynamic quantization (per-output-channel int8 weights,
activations quantized per call, fbgemm/x86 kernels) is the fast general path; for one or two rows
voxcast's kernel reads nearer memory bandwidth and rounds the activations far less than fbgemm's 8
bits. An :class:`Int8Linear` holds both and picks per call shape (:attr:`Int8Linear.kernel_rows`).
The two round differently (other codes, other audio), so which one a model uses is a fixed rule,
not a load-time timing, which a loaded host would make otherwise: the kernel wherever it builds
(:func:`choose_int8_kernel`). It was the faster wherever measured: one decode row through 28
gate/up weights in 0.77x fbgemm's time on an AMD Zen 2 (AVX2), a frame 1.01-1.07x faster on a Zen 3,
the VNNI variant faster still (``docs/cpu-kernels.md``). Not bit-exact against float32: each model
family measures and documents what it changes.

Used by Qwen3-TTS's talker and code predictor (:mod:`voxcast.models.qwen3_tts.accel.quant`) and
Chatterbox Turbo's T3 (:mod:`voxcast.models.chatterbox_turbo.t3_quant`).
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
from torch.ao.nn.quantized.modules.utils import _quantize_weight

from voxcast.kernels import native as int8_kernel
from voxcast.kernels.rows_linear import set_flags

__all__ = [
    "KERNEL_ROWS",
    "Int8Linear",
    "choose_int8_kernel",
    "dynamic_linear",
    "layouts_to_store",
    "quantize_weight",
    "stored_tensors",
    "use_int8_kernel",
]

logger = logging.getLogger(__name__)

#: Most rows (positions x streams) a call may have to run on voxcast's kernel: a decode step of one or
#: two streams, Qwen's code predictor's first step of one. More rows go to fbgemm (faster for them).
KERNEL_ROWS = 2


def quantize_weight(weight: Tensor, bias: Tensor | None) -> DynamicLinear:
    """fbgemm's dynamically quantized Linear of a float ``weight [out, in]`` and ``bias``: the same
    int8 weights, scales and kernel as ``torch.ao.quantization.quantize_dynamic`` with
    ``per_channel_dynamic_qconfig``, built directly (quantize_dynamic deep-copies its input and packs
    each weight three times; fbgemm's prepack is the slow part)."""
    # torch.ao.quantization announces its move to torchao, quantize_per_channel its deprecation
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        observer = torch.ao.quantization.per_channel_dynamic_qconfig.weight()
        observer(weight)
        qweight = _quantize_weight(weight.float(), observer)
    return dynamic_linear(qweight, None if bias is None else bias.detach())


def dynamic_linear(qweight: Tensor, bias: Tensor | None) -> DynamicLinear:
    """fbgemm's dynamically quantized Linear for a per-channel int8 weight (packed here)."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Built 1 x 1 so that its constructor's placeholder weight packs at no cost; then resized.
        q = DynamicLinear(1, 1, dtype=torch.qint8)
        q.in_features, q.out_features = int(qweight.shape[1]), int(qweight.shape[0])
        q.set_weight_bias(qweight, bias)
    return q


class Int8Linear(nn.Module):
    """An int8 Linear: fbgemm's dynamically quantized one, and voxcast's kernel for a few rows.

    :meth:`pack_kernel` lays the same int8 weights out for :mod:`voxcast.kernels.native`; calls of at
    most :attr:`kernel_rows` rows then run there (0: never). The choice is made per call shape, so a
    recorded step keeps the kernel it was recorded with.
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
        #: Kernel layouts read from a store of int8 weights, by variant (used by :meth:`pack_kernel`).
        self._layouts = layouts or {}
        #: The kernel's float32 scales and bias, where known without unpacking ``q`` (from the store).
        self._kernel_args: tuple[Tensor, Tensor | None] | None = None

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None) -> Int8Linear:
        """The int8 Linear of a float ``weight [out, in]`` and ``bias``."""
        return cls(quantize_weight(weight, bias))

    @classmethod
    def from_stored(cls, tensors: dict[str, Tensor], name: str) -> Int8Linear:
        """The int8 Linear that ``name``'s stored int8 weights, scales, bias and kernel layouts give
        (:mod:`.int8_store`): bitwise the one quantization built."""
        int8, scale, bias = tensors[f"{name}.int8"], tensors[f"{name}.scale"], tensors.get(f"{name}.bias")
        zero = torch.zeros(scale.shape[0], dtype=torch.int64)
        with warnings.catch_warnings():  # quantized tensor creation announces its deprecation
            warnings.simplefilter("ignore")
            qweight = torch._make_per_channel_quantized_tensor(int8, scale, zero, 0)
        prefix = f"{name}.packed."
        layouts = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        linear = cls(dynamic_linear(qweight, bias), layouts=layouts)
        # what pack_kernel needs besides a layout, so that it need not unpack fbgemm's weights again
        linear._kernel_args = (
            scale.float().contiguous(),
            None if bias is None else bias.float().contiguous(),
        )
        return linear

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
        """What a store of int8 weights keeps of this Linear under ``name``."""
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
        """Whether the kernel's current layout came from the store (or there is none to store)."""
        return self.packed is None or self.variant in self._layouts

    def drop_kernel(self) -> None:
        self.packed = self.scale = self.bias = None
        self.variant = None

    def forward(self, x: Tensor) -> Tensor:
        if self.packed is not None and x.numel() <= self.kernel_rows * self.in_features:
            assert self.scale is not None
            return int8_kernel.linear(x, self.packed, self.scale, self.bias, self.variant)
        return self.q(x)


def layouts_to_store(module: nn.Module) -> bool:
    """Whether some :class:`Int8Linear` of ``module`` runs on a kernel layout the store lacks."""
    return any(isinstance(m, Int8Linear) and not m.layout_stored for m in module.modules())


def stored_tensors(module: nn.Module) -> dict[str, Tensor]:
    """Every :class:`Int8Linear` of ``module`` as the int8 store keeps it, by module name."""
    out: dict[str, Tensor] = {}
    for name, m in module.named_modules():
        if isinstance(m, Int8Linear):
            out.update(m.stored_tensors(name))
    return out


def use_int8_kernel(module: nn.Module, on: bool, variant: str | None = None) -> int:
    """Pack (on) or drop (off) every :class:`Int8Linear`'s kernel weights and route up to
    :data:`KERNEL_ROWS` rows to the kernel; returns how many Linears use it. Needs
    :func:`voxcast.kernels.native.load` to have succeeded for ``on``; ``variant`` defaults to the
    CPU's fastest.
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


def choose_int8_kernel(
    module: nn.Module, kernel: bool | None, variant: str | None = None
) -> dict[str, object]:
    """Route ``module``'s int8 decode rows to voxcast's kernel: where it builds (``kernel`` True or
    None), or never (False). Not by timing it against fbgemm: the two give other bits, and the same
    request must give the same audio whatever the host's load when the model was loaded.

    Returns:
        ``{"kernel": used, "variant": the variant used (None: not used)}``.
    """
    if kernel is False or not int8_kernel.load():
        return {"kernel": False, "variant": None}
    variant = int8_kernel.resolve(variant)
    use_int8_kernel(module, True, variant)
    return {"kernel": True, "variant": variant}
