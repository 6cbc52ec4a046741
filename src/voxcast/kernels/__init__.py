"""Optional CPU speed-ups, free of model imports: voxcast's C++ library (sources here, built on first
use into ``VOXCAST_KERNEL_DIR``, ``~/.cache/voxcast/kernels`` by default) and its Python bindings (:mod:`.native`), plus generic layer kernels (:mod:`.rows_linear`: decode rows on
oneDNN or split blocks; :mod:`.seanet_gemm`: SEANet convolutions as matrix products).

A model family applies them through its own ``accel`` step (e.g.
:mod:`voxcast.models.qwen3_tts.accel`); see ``docs/cpu-kernels.md``.
"""
