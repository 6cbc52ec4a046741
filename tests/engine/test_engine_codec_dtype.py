"""``VOXCAST_CODEC_DTYPE``: the audio decoder in bfloat16 while the talker stays in float32."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from voxcast.config import EngineConfig
from voxcast.engine import engine as engine_module
from voxcast.engine.engine import Engine

Factory = Callable[[str], Path]


def test_codec_dtype_option_parsing() -> None:
    assert EngineConfig.from_env({}).codec_dtype == "auto"
    assert EngineConfig.from_env({"VOXCAST_CODEC_DTYPE": "BFloat16"}).codec_dtype == "bfloat16"
    with pytest.raises(ValueError, match="VOXCAST_CODEC_DTYPE"):
        EngineConfig.from_env({"VOXCAST_CODEC_DTYPE": "int8"})


def test_bfloat16_codec_streams_float32_audio_close_to_float32(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without native bfloat16 the engine would fall back to float32 (test_engine_precision.py); the
    # tiny decoder is small enough to run emulated, so this runs the bfloat16 path on any CPU.
    monkeypatch.setattr(engine_module, "native_bfloat16", lambda device: True)
    model = str(tiny_model_dir("custom_voice"))
    request = {"text": "The decoder may run in bfloat16.", "voice": "ryan", "greedy": True, "max_frames": 10}
    pcm = {}
    for dtype in ("auto", "bfloat16"):
        engine = Engine.load(EngineConfig(model=model, device="cpu", warmup=False, codec_dtype=dtype))
        try:
            if dtype == "bfloat16":
                assert next(engine.model.codec_decoder.parameters()).dtype == torch.bfloat16
                assert engine.model.talker.codec_head.weight.dtype == torch.float32
            chunks = list(engine.synthesize(request))
            assert all(c.pcm.dtype == np.float32 for c in chunks)
            pcm[dtype] = np.concatenate([c.pcm for c in chunks])
        finally:
            engine.close()
    assert pcm["auto"].shape == pcm["bfloat16"].shape
    np.testing.assert_allclose(pcm["bfloat16"], pcm["auto"], rtol=0, atol=2e-2)
