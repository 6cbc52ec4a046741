"""Speed-ups applied to a loaded Qwen3-TTS model, apart from the model code itself.

- :mod:`.quant`: int8 weights for the talker and code predictor (voxcast's kernel or fbgemm);
- :mod:`.f32_rows`: float32 decode rows on voxcast's kernels in the BLAS's own summing order;
- :mod:`.decode_ops`: fused norms, rotary embedding and decode attention (C++);
- :mod:`.cp_trace`, :mod:`.talker_trace`: recorded decode steps (bitwise the eager ones);
- :mod:`.graphs`: compiled static-shape steps (CUDA graphs on CUDA; not bit-exact).

The kernels themselves live in :mod:`voxcast.kernels`.
"""
