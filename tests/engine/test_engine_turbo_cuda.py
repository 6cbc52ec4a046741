"""Chatterbox Turbo on a CUDA device (tiny random checkpoint): the engine streams in float32 and
bfloat16, seeds reproduce, the stream equals the one-pass decode of the same tokens and noise, and
float32 CUDA audio stays close to the CPU's.

All marked ``gpu``: skipped where no CUDA device exists (conftest)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.models.base import LoadOptions
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo
from voxcast.models.chatterbox_turbo.s3gen_stream import TAIL, TurboAudioStream, one_pass

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(turbo_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[Engine]:
    eng = Engine.load(EngineConfig(model=str(turbo_model_dir), device="cuda", dtype=request.param))
    yield eng
    eng.close()


def test_streams_and_reproduces(engine: Engine) -> None:
    runs = []
    for _ in range(2):
        stream = engine.synthesize({"text": "Hello there, how are you today?", "seed": 5})
        chunks = list(stream)
        runs.append(np.concatenate([c.pcm for c in chunks]))
        assert stream.timing.finish_reason == "eos" and len(chunks) >= 1
        assert len(runs[-1]) == (stream.timing.frames + 3) * 960
    assert np.isfinite(runs[0]).all() and np.array_equal(runs[0], runs[1])


def test_cuda_stream_equals_one_pass_and_the_cpu(turbo_model_dir: Path) -> None:
    tokens = torch.randint(0, 6561, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    out = {}
    for device in ("cpu", "cuda"):
        m = ChatterboxTurbo.from_pretrained(turbo_model_dir, LoadOptions(device=device))
        v = m.builtin
        assert v is not None
        s = TurboAudioStream(
            m.flow, m.hift, v.prompt_tokens.to(device), v.prompt_mel.transpose(1, 2).to(device),
            v.xvector.to(device), 9,
        )  # fmt: skip
        streamed = np.concatenate([*(s.push(tokens[i : i + 5]) for i in range(0, 70, 5)), s.finish()])
        ref = one_pass(
            m.flow, m.hift, s.prompt_tokens, s.prompt_mel, s.xvector,
            torch.tensor([tokens + list(TAIL)], device=device), s.noise, s.hift_stream,
        ).float().cpu().numpy()  # fmt: skip
        assert np.abs(streamed - ref).max() < 1e-3, device
        out[device] = streamed
    # TF32 convolutions and matmuls on CUDA: close, not equal
    assert np.abs(out["cuda"] - out["cpu"]).max() < 5e-2
