"""The floating-point types the engine really computes in, given what the device does fast.

bfloat16 halves the bytes of every weight and, where the hardware computes it natively (CUDA GPUs
from Ampere on; CPUs with AVX-512 BF16 or AMX), runs the audio decoder 2.3-2.7x faster than
float32. Where it does not, PyTorch emulates it, and on the CPU that is catastrophic: measured on an
AVX2-only AMD Zen 3 (2 cores, scripts/bench_codec.py), the audio decoder took 4144 ms per frame in
bfloat16 against 62 ms in float32, its large GEMMs and long convolutions falling back to reference
kernels; on an AVX-512 CPU without its BF16 extension, oneDNN's emulation still took 3.3x
float32's time. A configuration that asks for bfloat16 there gets float32 instead, with a warning
naming the setting, rather than a server that cannot keep up with a single stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

__all__ = ["Precision", "log_fallbacks", "native_bfloat16", "resolve_precision"]

log = logging.getLogger(__name__)


def native_bfloat16(device: str) -> bool:
    """Whether ``device`` ("cpu", "cuda", "cuda:N") computes bfloat16 matmuls and convs natively."""
    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False))
    if not torch.backends.mkldnn.is_available():
        return False
    return _cpu_has("_is_avx512_bf16_supported") or _cpu_has("_is_amx_tile_supported")


def _cpu_has(probe: str) -> bool:
    """``torch.cpu.<probe>()``, False where this torch lacks the probe.

    Not oneDNN's ``_is_mkldnn_bf16_supported``: that answers yes for any AVX-512 CPU, where oneDNN
    emulates bfloat16 in AVX-512 code. Measured on an Intel Xeon with AVX-512 and VNNI but neither
    AVX-512 BF16 nor AMX (2 cores, scripts/bench_codec.py --full): the audio decoder took 104 ms per
    frame in bfloat16 against 32 ms in float32 (chunk 4), 2.5-3.7x slower at every chunk size.
    """
    fn = getattr(torch.cpu, probe, None)
    return bool(fn()) if callable(fn) else False


@dataclass(frozen=True)
class Precision:
    """The dtypes in use: ``model`` (talker and code predictor) and ``codec`` (audio decoder).

    ``fallbacks`` names each setting that asked for bfloat16 on a device without it.
    """

    model: str
    codec: str
    fallbacks: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"model": self.model, "codec": self.codec, "fallbacks": list(self.fallbacks)}


def resolve_precision(
    model_dtype: str, codec_dtype: str, native_bf16: bool, quant: str = "none"
) -> Precision:
    """Pick the dtypes for a resolved model dtype and a ``codec_dtype`` setting.

    "auto" is the model's dtype, except with int8 weights (``quant``) on a device with native
    bfloat16: the audio decoder then runs in bfloat16 (2.1-2.7x faster on an AVX-512 BF16 CPU,
    within ~1.7e-3 of float32), since int8 has given up bit-exactness for speed already and the
    float32 decoder would cost more per frame than the int8 talker and code predictor together.

    Args:
        model_dtype: "float32" or "bfloat16" (``EngineConfig.resolved_dtype()``).
        codec_dtype: "auto", "float32" or "bfloat16" (``EngineConfig.codec_dtype``).
        native_bf16: :func:`native_bfloat16` of the device.
        quant: the weights' quantization ("none" or "int8", ``EngineConfig.quant``).

    Returns:
        The dtypes to use; bfloat16 becomes float32 where it is not native.
    """
    fallbacks: list[str] = []
    model = model_dtype
    if model == "bfloat16" and not native_bf16:
        model = "float32"
        fallbacks.append("VOXCAST_DTYPE")
    codec = codec_dtype
    if codec == "auto":
        codec = "bfloat16" if quant == "int8" and native_bf16 else model
    if codec == "bfloat16" and not native_bf16:
        codec = "float32"
        fallbacks.append("VOXCAST_CODEC_DTYPE")
    return Precision(model, codec, tuple(fallbacks))


def log_fallbacks(precision: Precision, device: str) -> None:
    """One warning per setting that asked for bfloat16 where it would be emulated."""
    for name in precision.fallbacks:
        log.warning(
            "%s resolves to bfloat16, but %s has no native bfloat16 (emulated, it runs 3 to 70 times "
            "slower than float32): using float32",
            name,
            device,
        )
