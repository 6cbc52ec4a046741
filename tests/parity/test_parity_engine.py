"""End to end: the engine's STREAMED audio equals the official wrapper's final waveform.

Same tiny checkpoint, text and seed; the engine streams in chunks of 1, 1, 1, 1, 2, then 3 frames, and the
concatenation must equal the official output (same length, max abs diff <= 1e-4). For an ICL clone
the official wrapper cuts the reference part proportionally and is sometimes one sample short
(see ``official_cut`` in test_parity_codec.py): then its clip has one extra leading sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.parity._official import import_qwen_tts, load_official, official_voice_items, run_official
from voxcast.config import EngineConfig
from voxcast.engine.engine import Engine

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(import_qwen_tts() is None, reason="qwen_tts (official package) not importable"),
]

TEXT = "Hello there, this is a short test of the speech system."
REF_TEXT = "This is what the reference clip says."
FRAMES = 14
TOL = 1e-4
SAMPLES_PER_FRAME = 1920


def _engine(path: Path) -> Iterator[Engine]:
    engine = Engine.load(EngineConfig(model=str(path), device="cpu", warmup=False, chunk_frames=3))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def cv(tiny_model_dir: Callable[[str], Path]) -> Iterator[tuple[Path, Engine]]:
    path = tiny_model_dir("custom_voice")
    for engine in _engine(path):
        yield path, engine


@pytest.fixture(scope="module")
def base(tiny_model_dir: Callable[[str], Path]) -> Iterator[tuple[Path, Engine]]:
    path = tiny_model_dir("base")
    for engine in _engine(path):
        yield path, engine


def _streamed(engine: Engine, request: dict, voice: object = None) -> np.ndarray:
    chunks = list(engine.synthesize({"text": TEXT, "max_frames": FRAMES, **request}, voice))
    assert [c.frames for c in chunks][:6] == [1, 1, 1, 1, 2, 3]  # the ramped schedule
    return np.concatenate([c.pcm for c in chunks])


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_custom_voice_stream_equals_official_waveform(cv: tuple[Path, Engine], greedy: bool) -> None:
    path, engine = cv
    run = run_official(
        load_official(path),
        TEXT,
        seed=5,
        greedy=greedy,
        max_frames=FRAMES,
        speaker="ryan",
        language="English",
    )
    ours = _streamed(engine, {"voice": "ryan", "language": "english", "seed": 5, "greedy": greedy})
    official = run.wavs[0]
    assert ours.shape == official.shape
    assert np.abs(ours - official).max() <= TOL


def _clip() -> np.ndarray:
    sr = 24000
    t = np.arange(int(2.4 * sr)) / sr
    rng = np.random.default_rng(1)
    wav = 0.3 * np.sin(2 * np.pi * 170 * t) + 0.05 * rng.standard_normal(t.size)
    return wav.astype(np.float32)


@pytest.mark.parametrize("x_vector_only", [False, True], ids=["icl", "x-vector"])
def test_voice_clone_stream_equals_official_waveform(base: tuple[Path, Engine], x_vector_only: bool) -> None:
    path, engine = base
    audio = _clip()
    ref_text = None if x_vector_only else REF_TEXT
    wrapper = load_official(path)
    items = official_voice_items(wrapper, audio, 24000, ref_text, x_vector_only)
    run = run_official(wrapper, TEXT, seed=9, max_frames=FRAMES, voice_items=items, language="English")
    voice = engine.model.make_voice_prompt(audio, 24000, ref_text=ref_text, x_vector_only=x_vector_only)
    ours = _streamed(engine, {"language": "english", "seed": 9}, voice)
    official = run.wavs[0]
    extra = official.shape[0] - ours.shape[0]
    assert extra in ((0, 1) if not x_vector_only else (0,))
    assert np.abs(official[extra:] - ours).max() <= TOL
