"""The one configuration step: apply validated speed-ups to a loaded Qwen3-TTS model, report why.

:func:`apply` runs once at load, before any request. Each choice is either forced by
:class:`AccelConfig` (True/False) or, where None, decided for this machine; the returned
:class:`AccelReport` records what was chosen and the measurements behind it (logged by the engine
after warm-up and written into every benchmark's JSON).

A load-time timing depends on what else the host runs at that moment, so it only ever chooses
among kernels that compute the same bits (one-row blocks, the code predictor's packed weights).
Kernels that round differently (batched rows on oneDNN or MKL, int8 rows on voxcast's kernel or
fbgemm, a batch's float32 rows on voxcast's row kernels or oneDNN) are chosen by fixed rules: the
CPU's features, whether the library builds, whether the bits match; so the same request with the
same seed gives the same audio in every process on the machine, however loaded it was at start.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

import torch

from voxcast.kernels.rows_linear import (
    FusedLinear,
    onednn_available,
    split_rows_faster,
    use_onednn_rows,
    use_split_rows,
)
from voxcast.models.qwen3_tts.accel.cp_trace import use_traced_steps
from voxcast.models.qwen3_tts.accel.graphs import use_static_decode
from voxcast.models.qwen3_tts.accel.talker_trace import use_traced_step
from voxcast.models.qwen3_tts.layers import MLP

if TYPE_CHECKING:
    from voxcast.kernels.int8_store import StoredInt8
    from voxcast.models.qwen3_tts.codec_encoder import CodecEncoder
    from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder
    from voxcast.models.qwen3_tts.talker import Talker

__all__ = ["AccelConfig", "AccelReport", "apply"]

logger = logging.getLogger(__name__)

QUANT_MODES = ("none", "int8")


@dataclass(frozen=True)
class AccelConfig:
    """What to apply (see ``Qwen3TTS.from_pretrained`` for each option). None: this machine's default.

    Raises:
        ValueError: an unknown ``quant`` mode.
    """

    quant: str = "none"
    compile: bool = False
    trace_steps: bool = False
    onednn_rows: bool | None = None
    row_parts: int | None = None
    int8_kernel: bool | None = None
    int8_variant: str | None = None
    fused_ops: bool | None = None
    f32_rows: bool | None = None
    batch_graphs: bool = False

    def __post_init__(self) -> None:
        if self.quant not in QUANT_MODES:
            raise ValueError(f"quant must be 'none' or 'int8', not {self.quant!r}")


@dataclass
class AccelReport:
    """What :func:`apply` chose, with the load-time measurements (None: not measured).

    Attributes:
        int8_kernel / int8_variant: int8 decode rows on voxcast's kernel (where it builds).
        fused_ops: norms, rotary embeddings and decode attention as fused C++ operations.
        onednn_rows: batched float32 decode rows on oneDNN (where this PyTorch has it).
        row_parts / row_kernel: float32 decode rows as this many blocks of outputs in one bmm
            (bitwise ``F.linear``; timed).
        f32_rows: float32 decode rows on voxcast's BLAS-order kernels (what was checked and timed).
        batch_graphs: frames of a batch as one static-shape function over cache slots
            (:mod:`.batch_frames`; CUDA graphs on CUDA), set up by the model.
        int8_store: with int8 weights, "read" (from the int8 store), "written" (quantized, then
            stored) or None (quantized; the store is off or could not be written).
    """

    quant: str = "none"
    compile: bool = False
    trace_steps: bool = False
    int8_kernel: bool = False
    int8_variant: str | None = None
    fused_ops: bool = False
    onednn_rows: bool = False
    row_parts: int = 1
    row_kernel: dict[str, object] | None = None
    f32_rows: dict[str, object] | None = None
    int8_store: str | None = None
    batch_graphs: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


#: Float32 talkers with fewer weight bytes than this (the tiny test and demo checkpoints, ~37 MB)
#: skip the kernels voxcast compiles (C++: float32 row kernels, fused operations) unless a setting
#: asks for them: their decode steps take well under a millisecond, so nothing can be gained, while
#: building the library on a fresh machine took 97 s. Real checkpoints are 0.6B (~1.8 GB) and up.
#: Int8 weights (asked for explicitly) keep their kernels at any size.
NATIVE_MIN_BYTES = 256 * 1024 * 1024


def _small(talker: Talker) -> bool:
    return sum(p.numel() * p.element_size() for p in talker.parameters()) < NATIVE_MIN_BYTES


def apply(
    talker: Talker,
    cfg: AccelConfig,
    *,
    identity: str,
    device: torch.device,
    dtype: torch.dtype,
    codec_encoder: CodecEncoder | None = None,
    speaker_encoder: SpeakerEncoder | None = None,
    stored: StoredInt8 | None = None,
) -> AccelReport:
    """Apply ``cfg`` to a loaded model's parts once, at load: its ``talker`` (and code predictor) and
    the voice build's encoders (where it has them).

    Args:
        identity: the checkpoint's identity (the int8 store's key).
        device, dtype: where and in which dtype the talker runs.
        stored: the checkpoint's int8 weights read from the int8 store (:mod:`voxcast.kernels.int8_store`), used
            instead of quantizing with ``quant=int8``; without them the quantized weights are stored
            for next time.
    """
    report = AccelReport(
        quant=cfg.quant, compile=cfg.compile, trace_steps=cfg.trace_steps, batch_graphs=cfg.batch_graphs
    )
    if cfg.quant != "int8" and _small(talker):  # left to measurement: PyTorch's kernels, no build
        cfg = dataclasses.replace(
            cfg,
            int8_kernel=False if cfg.int8_kernel is None else cfg.int8_kernel,
            fused_ops=False if cfg.fused_ops is None else cfg.fused_ops,
            f32_rows=False if cfg.f32_rows is None else cfg.f32_rows,
        )
        logger.info("small model: voxcast's compiled kernels are not used (nothing to gain; no build)")
    if cfg.quant == "int8":
        from voxcast.kernels import int8_store
        from voxcast.kernels.int8_linear import layouts_to_store, stored_tensors
        from voxcast.models.qwen3_tts.accel.quant import quantize_int8

        sources = quantize_int8(talker, stored.tensors if stored is not None else None)
        _choose_int8_kernel(talker, cfg, report)
        report.int8_store = "read" if stored is not None else None
        # quantized here, or read without the layout of the kernel chosen now: store (again) for next time
        if (stored is None or layouts_to_store(talker)) and int8_store.save(
            identity, stored_tensors(talker), sources
        ):
            report.int8_store = "written"
    else:
        talker.fuse()  # one matmul for q/k/v and for gate/up (bitwise the same outputs)
    report.fused_ops = _choose_fused_ops(talker, cfg, device, dtype)
    # The row choices concern float32 Linears on the CPU run eagerly or recorded.
    if device.type == "cpu" and dtype == torch.float32 and cfg.quant == "none" and not cfg.compile:
        _choose_fp32_rows(talker, cfg, report)
    if cfg.compile:
        use_static_decode(talker)  # compiled on first use (the engine's warm-up)
    elif cfg.trace_steps:  # recorded by prepare_batches or on first use
        use_traced_steps(talker.code_predictor)
        use_traced_step(talker)
    if report.fused_ops:  # the voice build's encoders too (not bit-exact either)
        if codec_encoder is not None:
            codec_encoder.use_fast_elu(True)
        if speaker_encoder is not None:
            speaker_encoder.use_gemm_convs(True)
    return report


def _timing_weight(talker: Talker) -> torch.Tensor:
    """A weight every decode step reads (the first layer's gate/up), for the load-time kernel timing."""
    mlp = talker.model.layers[0].mlp
    assert isinstance(mlp, MLP)
    return mlp.gate_up.weight if isinstance(mlp.gate_up, FusedLinear) else mlp.gate_proj.weight


def _choose_int8_kernel(talker: Talker, cfg: AccelConfig, report: AccelReport) -> None:
    """int8 decode rows on voxcast's kernel: forced, or (auto) wherever it builds."""
    from voxcast.kernels.int8_linear import choose_int8_kernel

    choice = choose_int8_kernel(talker, cfg.int8_kernel, cfg.int8_variant)
    if choice["kernel"]:
        report.int8_kernel, report.int8_variant = True, cast(str, choice["variant"])


def _choose_fused_ops(talker: Talker, cfg: AccelConfig, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether float32 CPU norms, rotary embeddings and decode attention run fused; None = with int8
    weights (float32 weights keep PyTorch's, bitwise the official implementation's), where the
    library builds. Never with ``compile``: the compiled steps fuse their element-wise work
    themselves and cannot trace into these operations."""
    from voxcast.models.qwen3_tts.accel import decode_ops

    if cfg.fused_ops is False or (cfg.fused_ops is None and cfg.quant != "int8"):
        return False
    if cfg.compile:
        if cfg.fused_ops:
            logger.warning("fused decode operations are off with compile (the compiled steps fuse)")
        return False
    if device.type != "cpu" or dtype != torch.float32 or not decode_ops.available():
        return False
    return decode_ops.use_fused_ops(talker, True) > 0


def _choose_fp32_rows(talker: Talker, cfg: AccelConfig, report: AccelReport) -> None:
    """Float32 CPU decode rows: oneDNN for batched rows, blocks of outputs (timed: bitwise the same),
    voxcast's row kernels (where their bits match)."""
    from voxcast.models.qwen3_tts.accel import f32_rows

    if onednn_available():  # auto: on (a fixed rule; see voxcast.kernels.rows_linear)
        onednn = cfg.onednn_rows is not False
        use_onednn_rows(talker, onednn)
        report.onednn_rows = onednn
    parts = cfg.row_parts
    threads = torch.get_num_threads()
    if parts is None and threads >= 2:
        report.row_kernel = split_rows_faster(_timing_weight(talker), threads)
        parts = int(report.row_kernel["parts"])  # type: ignore[call-overload]
    if parts is not None:  # None here: one intra-op thread, nothing to split
        report.row_parts = max(1, parts)
        use_split_rows(talker, report.row_parts)
    cp_layers = talker.code_predictor.model.layers
    report.f32_rows = f32_rows.choose(talker, cp_layers, cfg.f32_rows)
