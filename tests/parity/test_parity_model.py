"""Parity of prompts and codes with the official qwen-tts 0.1.1 pipeline on the same tiny checkpoints.

For every mode the prefill embeddings must be bitwise equal and the generated codes identical, in
greedy mode and with seeded sampling (official: ``torch.manual_seed(seed)`` before the call; ours:
the seed in :class:`SamplingParams`). Texts avoid CamelCase words (the official wrapper loads its
tokenizer with a different pre-tokenizer regex, which splits those differently).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.fixtures.models import eos_prone_copy
from tests.parity._official import import_qwen_tts, load_official, official_voice_items, run_official
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(import_qwen_tts() is None, reason="qwen_tts (official package) not importable"),
]

TEXT = "Hello there, this is a short test of the speech system."
REF_TEXT = "This is what the reference clip says."
FRAMES = 16
_OURS: dict[Path, Qwen3TTS] = {}


def _ours(path: Path) -> Qwen3TTS:
    if path not in _OURS:
        _OURS[path] = Qwen3TTS.from_pretrained(str(path))
    return _OURS[path]


def _codes(model: Qwen3TTS, prompt: Any, *, seed: int, greedy: bool, max_frames: int) -> torch.Tensor:
    gen = model.new_generator(prompt, SamplingParams(seed=seed, greedy=greedy), max_frames=max_frames)
    frames = []
    while (frame := gen.step()) is not None:
        frames.append(frame)
    return torch.stack(frames) if frames else torch.zeros(0, 16, dtype=torch.long)


def _compare(
    path: Path,
    ours_kw: dict[str, Any],
    official_kw: dict[str, Any],
    *,
    greedy: bool,
    seed: int = 11,
    frames: int = FRAMES,
) -> None:
    model, wrapper = _ours(path), load_official(path)
    run = run_official(wrapper, TEXT, greedy=greedy, seed=seed, max_frames=frames, **official_kw)
    prompt = model.build_prompt(TEXT, **ours_kw)
    assert run.prefill is not None and run.trailing is not None and run.codes is not None
    assert torch.equal(prompt.embeds, run.prefill), "prefill embeddings differ"
    assert torch.equal(prompt.trailing, run.trailing), "trailing text embeddings differ"
    codes = _codes(model, prompt, seed=seed, greedy=greedy, max_frames=frames)
    assert codes.shape == run.codes.shape
    assert torch.equal(codes, run.codes)


@pytest.fixture(scope="module")
def reference_clip() -> tuple[np.ndarray, int]:
    sr = 24000
    t = np.arange(int(2.4 * sr)) / sr
    rng = np.random.default_rng(0)
    wav = (
        0.3 * np.sin(2 * np.pi * 180 * t)
        + 0.1 * np.sin(2 * np.pi * 410 * t)
        + 0.02 * rng.standard_normal(t.size)
    )
    return wav.astype(np.float32), sr


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize(
    ("speaker", "language"),
    [("ryan", "english"), ("aiden", "auto"), ("eric", "chinese"), ("dylan", "auto")],
    ids=["language", "auto", "dialect", "dialect-auto"],
)
def test_custom_voice(tiny_model_dir: Any, speaker: str, language: str, greedy: bool) -> None:
    _compare(
        tiny_model_dir("custom_voice"),
        {"speaker": speaker, "language": language},
        {"speaker": speaker, "language": language.capitalize()},
        greedy=greedy,
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_custom_voice_streaming_text(tiny_model_dir: Any, greedy: bool) -> None:
    _compare(
        tiny_model_dir("custom_voice"),
        {"speaker": "vivian", "language": "english", "non_streaming_text": False},
        {"speaker": "vivian", "language": "English", "non_streaming_mode": False},
        greedy=greedy,
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_custom_voice_instruct_17b(tiny_model_dir: Any, greedy: bool) -> None:
    kw = {"speaker": "serena", "instruct": "Speak slowly, in a calm and warm tone."}
    _compare(
        tiny_model_dir("custom_voice", "tiny-1.7b"),
        {**kw, "language": "english"},
        {**kw, "language": "English"},
        greedy=greedy,
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_voice_design(tiny_model_dir: Any, greedy: bool) -> None:
    kw = {"instruct": "A deep, slightly hoarse male voice, speaking fast."}
    _compare(
        tiny_model_dir("voice_design"), {**kw, "language": "auto"}, {**kw, "language": "Auto"}, greedy=greedy
    )


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize(
    ("x_vector_only", "non_streaming"),
    [(False, False), (False, True), (True, False)],
    ids=["icl-streaming-text", "icl-non-streaming-text", "x-vector"],
)
def test_voice_clone(
    tiny_model_dir: Any,
    reference_clip: tuple[np.ndarray, int],
    x_vector_only: bool,
    non_streaming: bool,
    greedy: bool,
) -> None:
    path = tiny_model_dir("base")
    model, wrapper = _ours(path), load_official(path)
    audio, sr = reference_clip
    items = official_voice_items(wrapper, audio, sr, REF_TEXT, x_vector_only)
    voice = model.make_voice_prompt(audio, sr, REF_TEXT, x_vector_only=x_vector_only)
    assert torch.equal(voice.x_vector, items[0].ref_spk_embedding.float())
    if not x_vector_only:
        assert torch.equal(voice.ref_codes, items[0].ref_code.long())
    _compare(
        path,
        {"voice": voice, "language": "english", "non_streaming_text": non_streaming},
        {"voice_items": items, "language": "English", "non_streaming_mode": non_streaming},
        greedy=greedy,
    )


def test_official_voice_prompt_roundtrip(tiny_model_dir: Any, reference_clip: tuple[np.ndarray, int]) -> None:
    """A VoicePrompt built from the official prompt item gives the same prefill as ours."""
    path = tiny_model_dir("base")
    model, wrapper = _ours(path), load_official(path)
    audio, sr = reference_clip
    item = official_voice_items(wrapper, audio, sr, REF_TEXT, False)[0]
    theirs = VoicePrompt(
        item.ref_spk_embedding.float(), item.ref_code.long(), REF_TEXT, None, False, model.identity
    )
    ours = model.make_voice_prompt(audio, sr, REF_TEXT)
    a = model.build_prompt(TEXT, voice=theirs).embeds
    b = model.build_prompt(TEXT, voice=ours).embeds
    assert torch.equal(a, b)


def test_eos_and_frame_budget(tiny_model_dir: Any) -> None:
    """A budget of N frames equals official max_new_tokens N + 1, for several seeds."""
    path = tiny_model_dir("custom_voice")
    for seed, frames in [(1, 1), (2, 3), (3, 9)]:
        _compare(path, {"speaker": "sohee"}, {"speaker": "sohee"}, greedy=False, seed=seed, frames=frames)


@pytest.fixture(scope="module")
def eos_prone_model(tiny_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny custom voice checkpoint with the end-of-speech logit scaled up (speech ends early)."""
    return eos_prone_copy(tiny_model_dir("custom_voice"), tmp_path_factory.mktemp("eos"))


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_stops_at_eos_like_official(eos_prone_model: Path, greedy: bool) -> None:
    model = _ours(eos_prone_model)
    for seed in range(3):
        _compare(
            eos_prone_model, {"speaker": "ryan"}, {"speaker": "ryan"}, greedy=greedy, seed=seed, frames=40
        )
        gen = model.new_generator(
            model.build_prompt(TEXT, speaker="ryan"), SamplingParams(seed=seed, greedy=greedy), max_frames=40
        )
        while gen.step() is not None:
            pass
        assert gen.finish_reason == "eos"
        assert gen.frames >= 2


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_bfloat16(tiny_model_dir: Any, greedy: bool) -> None:
    """Both implementations loaded in bfloat16 agree too (prefill and codes)."""
    path = tiny_model_dir("custom_voice")
    model = Qwen3TTS.from_pretrained(str(path), dtype=torch.bfloat16)
    run = run_official(
        load_official(path, torch.bfloat16),
        TEXT,
        greedy=greedy,
        seed=4,
        max_frames=FRAMES,
        speaker="ryan",
        language="English",
    )
    prompt = model.build_prompt(TEXT, speaker="ryan", language="english")
    assert run.prefill is not None and run.prefill.dtype == torch.bfloat16
    assert torch.equal(prompt.embeds, run.prefill)
    assert torch.equal(_codes(model, prompt, seed=4, greedy=greedy, max_frames=FRAMES), run.codes)
