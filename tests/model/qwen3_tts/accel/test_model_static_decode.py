"""Static-shape decode steps (``VOXCAST_COMPILE``, :mod:`voxcast.models.qwen3_tts.accel.graphs`).

The static path attends over the whole preallocated cache with a mask and writes keys/values at a
position held in a tensor. Traced with the "eager" backend it runs the same ops as the eager path
except the masked attention, so greedy codes must equal the eager path's and hidden states agree
within float rounding. The inductor backend (generated C++ on a CPU) is checked once on the tiny
model; CUDA graphs only where a GPU exists.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.model.qwen3_tts.test_model_batching import batched_codes
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.accel.graphs import batch_bucket, bucket, use_static_decode
from voxcast.models.qwen3_tts.model import Qwen3TTS

TEXT = "The static path must say exactly what the eager path says."


def _codes(
    model: Qwen3TTS, *, greedy: bool = True, frames: int = 12, speaker: str = "ryan"
) -> list[list[int]]:
    gen = model.new_generator(
        model.build_prompt(TEXT, speaker=speaker), SamplingParams(seed=11, greedy=greedy), frames
    )
    out = []
    while (f := gen.step()) is not None:
        out.append(f.tolist())
    return out


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir: Any) -> str:
    return str(tiny_model_dir("custom_voice"))


def test_bucket_rounds_up_to_powers_of_two() -> None:
    assert bucket(1) == 256
    assert bucket(256) == 256
    assert bucket(257) == 512
    assert bucket(3000) == 4096


def test_static_path_equals_eager_codes(checkpoint: str) -> None:
    eager = Qwen3TTS.from_pretrained(checkpoint)
    static = Qwen3TTS.from_pretrained(checkpoint)
    use_static_decode(static.talker, backend="eager")
    for greedy in (True, False):
        assert _codes(static, greedy=greedy) == _codes(eager, greedy=greedy)
    # the talker cache is bucketed so that few graphs serve every request
    gen = static.new_generator(static.build_prompt(TEXT, speaker="ryan"), SamplingParams(greedy=True), 5)
    assert gen._cache[0].max_len == 256


def test_static_talker_step_matches_eager_hidden(checkpoint: str) -> None:
    model = Qwen3TTS.from_pretrained(checkpoint)
    talker = model.talker
    prompt = model.build_prompt(TEXT, speaker="vivian")
    with torch.inference_mode():
        cache = talker.new_cache(prompt.length + 4)
        talker(prompt.embeds, cache, 0)
        x = prompt.pad + talker.codec_embed(torch.tensor([[5]]))
        h_eager, l_eager = talker(x, cache, prompt.length)
        use_static_decode(talker, backend="eager")
        assert talker.static is not None
        h_static, l_static = talker.static.talker_step(x, cache, prompt.length)
    torch.testing.assert_close(h_static, h_eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(l_static, l_eager, rtol=0, atol=1e-5)


def test_batch_bucket_rounds_up_to_powers_of_two() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]


def test_static_path_in_batched_steps(checkpoint: str) -> None:
    """Batched rows keep the eager talker (per-row caches) and use the static code predictor; three
    streams run in the four-row graphs, padded, and say what each says alone."""
    model = Qwen3TTS.from_pretrained(checkpoint)
    use_static_decode(model.talker, backend="eager")
    speakers = ("ryan", "vivian", "serena")
    gens = [
        model.new_generator(model.build_prompt(TEXT, speaker=s), SamplingParams(greedy=True), 8)
        for s in speakers
    ]
    batched = batched_codes(gens)
    eager = Qwen3TTS.from_pretrained(checkpoint)
    assert batched == [_codes(eager, frames=8, speaker=s) for s in speakers]
    assert 4 in model.talker.code_predictor._caches and 3 not in model.talker.code_predictor._caches


def test_prepare_compiles_every_batch_bucket_up_to_max_active(checkpoint: str) -> None:
    model = Qwen3TTS.from_pretrained(checkpoint)
    use_static_decode(model.talker, backend="eager")
    model.prepare_batches(5)
    assert sorted(model.talker.code_predictor._caches) == [1, 2, 4, 8]


def test_static_decode_refuses_int8(checkpoint: str) -> None:
    model = Qwen3TTS.from_pretrained(checkpoint, quant="int8")
    with pytest.raises(ValueError, match="int8"):
        use_static_decode(model.talker, backend="eager")


@pytest.mark.slow
def test_inductor_on_cpu_keeps_greedy_codes(checkpoint: str) -> None:
    """Generated kernels round differently; on the tiny model greedy codes still agree."""
    eager = Qwen3TTS.from_pretrained(checkpoint)
    compiled = Qwen3TTS.from_pretrained(checkpoint)
    use_static_decode(compiled.talker, backend="inductor")
    want, got = _codes(eager, frames=6), _codes(compiled, frames=6)
    agree = sum(a == b for fa, fb in zip(want, got, strict=True) for a, b in zip(fa, fb, strict=True))
    assert agree / (16 * len(want)) >= 0.9


@pytest.mark.gpu
def test_cuda_graphs_keep_greedy_codes(checkpoint: str) -> None:
    eager = Qwen3TTS.from_pretrained(checkpoint, device="cuda")
    compiled = Qwen3TTS.from_pretrained(checkpoint, device="cuda")
    use_static_decode(compiled.talker)  # inductor, CUDA graphs for the code predictor
    assert compiled.talker.static is not None
    want, got = _codes(eager, frames=10), _codes(compiled, frames=10)
    agree = sum(a == b for fa, fb in zip(want, got, strict=True) for a, b in zip(fa, fb, strict=True))
    assert agree / (16 * len(want)) >= 0.9


def test_compile_option_parsing() -> None:
    from voxcast.config import EngineConfig

    assert not EngineConfig.from_env({}).resolved_compile()
    auto = EngineConfig.from_env({"VOXCAST_COMPILE": "auto", "VOXCAST_DEVICE": "cpu"})
    assert not auto.resolved_compile()  # auto = CUDA only
    assert EngineConfig.from_env({"VOXCAST_COMPILE": "ON"}).resolved_compile()
    with pytest.raises(ValueError, match="VOXCAST_COMPILE"):
        EngineConfig.from_env({"VOXCAST_COMPILE": "fast"})
    env = {"VOXCAST_PREFIX_CACHE": "0", "VOXCAST_DECODE_THREAD": "off"}
    cfg = EngineConfig.from_env(env)
    assert not cfg.prefix_cache and cfg.decode_thread == "off"


def test_model_compile_flag_enables_static_steps(checkpoint: str) -> None:
    model = Qwen3TTS.from_pretrained(checkpoint, compile=True)
    assert model.talker.static is not None
    assert model.talker.code_predictor.static is model.talker.static
