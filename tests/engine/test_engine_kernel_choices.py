"""Same request, same seed, same bytes, whatever a load-time timing found.

The engine times some kernels at load (a loaded host times them differently), but a timing may only
pick among kernels that compute the same bits: each test loads the tiny checkpoint once with every
timing won by PyTorch's kernel and once with every timing won by the other (voxcast's, oneDNN, blocks
of outputs), as a quiet and a busy host might find, and compares the audio's bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.fixtures.engines import run_together
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine
from voxcast.kernels import int8_linear, native, rows_linear
from voxcast.models.qwen3_tts.accel import apply, f32_rows

Factory = Callable[[str], Path]
TEXT = "Hello there, how are you doing today? This is a longer sentence, spoken slowly."
OTHER = "Another stream speaking at the same time, a little longer than the first one."
REQUEST = {"text": TEXT, "voice": "vivian", "seed": 5, "max_frames": 24, "non_streaming_text": False}


def _timing_won_by(monkeypatch: pytest.MonkeyPatch, second: bool) -> None:
    """Every load-time kernel timing (``time_both(first, second)``: PyTorch's kernel first) finds
    ``second`` 10x faster, or 10x slower; nothing is remembered from an earlier load."""
    won = (10.0, 1.0) if second else (1.0, 10.0)
    # every module that times kernels, or once did (raising=False: whether or not it does now), and
    # the per-process memory of earlier timings that rows_linear once kept
    for module in (rows_linear, int8_linear, f32_rows):
        monkeypatch.setattr(module, "time_both", lambda *a, **k: won, raising=False)
    monkeypatch.setattr(rows_linear, "_CHOSEN", {}, raising=False)  # as in a fresh process


@pytest.fixture
def two_threads() -> Iterator[None]:
    """Two intra-op threads, so the one-row blocks (one per thread) are timed too."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _audio(engine: Engine, request: dict[str, Any]) -> bytes:
    return np.concatenate([c.pcm for c in engine.synthesize(dict(request))]).tobytes()


def _concurrent(engine: Engine) -> list[bytes | None]:
    """Two seeded streams started together (their rows share batched steps)."""
    requests = [REQUEST, {**REQUEST, "text": OTHER, "seed": 9}]
    return run_together([lambda r=r: _audio(engine, r) for r in requests])


def _row_bits(engine: Engine) -> dict[str, bytes]:
    """Each float32 projection's output for 1, 2, 3 and 5 rows (one stream's decode step, batched
    steps of several streams), whatever runs it: a batched row's bits show up in the audio only where
    they flip a code, which the tiny model's rarely do."""
    g = torch.Generator().manual_seed(0)
    out: dict[str, bytes] = {}
    with torch.inference_mode():
        for name, m in engine.model.talker.named_modules():  # type: ignore[attr-defined]
            if isinstance(m, (rows_linear.Linear, rows_linear.FusedLinear)):
                for rows in (1, 2, 3, 5):
                    x = torch.randn(rows, 1, m.in_features, generator=g)
                    out[f"{name}[{rows}]"] = m(x).numpy().tobytes()
    return out


def _renders(
    monkeypatch: pytest.MonkeyPatch, model: Path, concurrent: bool = False, **config: Any
) -> dict[bool, dict[str, Any]]:
    """What the engine renders when every timing favours PyTorch's kernel (False) or the other
    (True): ``audio`` (one stream, then two at once with ``concurrent``) and ``rows``
    (:func:`_row_bits`)."""
    out: dict[bool, dict[str, Any]] = {}
    for second in (False, True):
        with monkeypatch.context() as m:
            _timing_won_by(m, second)
            engine = Engine.load(EngineConfig(model=str(model), device="cpu", warmup=False, **config))
        try:
            audio = [_audio(engine, REQUEST)] + (_concurrent(engine) if concurrent else [])
            out[second] = {"audio": audio, "rows": _row_bits(engine)}
        finally:
            engine.close()
    return out


@pytest.mark.parametrize("full_size", [False, True])
def test_float32_audio_does_not_depend_on_the_timings(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch, two_threads: None, full_size: bool
) -> None:
    """The audio decoder's short GEMMs, batched rows and one-row blocks, and (``full_size``: the
    tiny model taken for a real one, which gets voxcast's compiled kernels) the float32 row kernels
    and the code predictor's packed weights: one stream, and two at once."""
    if full_size:
        if not f32_rows.available():
            pytest.skip("voxcast's kernels cannot be built here")
        monkeypatch.setattr(apply, "_small", lambda talker: False)
    renders = _renders(monkeypatch, tiny_model_dir("custom_voice"), concurrent=True, threads=2)
    assert len(renders[False]["audio"][0]) == 24 * 1920 * 4
    assert renders[True]["audio"] == renders[False]["audio"]
    differ = [k for k, v in renders[False]["rows"].items() if renders[True]["rows"][k] != v]
    assert not differ, f"{len(differ)} of {len(renders[False]['rows'])} projections, e.g. {differ[:3]}"


@pytest.mark.skipif(not native.load(), reason="the int8 kernel cannot be built here")
def test_int8_audio_does_not_depend_on_the_timings(
    tiny_model_dir: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8 decode rows: voxcast's kernel or fbgemm (they round differently) is not a timing's choice."""
    renders = _renders(monkeypatch, tiny_model_dir("custom_voice"), quant="int8")
    assert renders[True]["audio"] == renders[False]["audio"]
