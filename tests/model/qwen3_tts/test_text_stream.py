"""Text that arrives in pieces (an open prompt) gives exactly the frames of the whole text at once.

Property tests with seeded random splits (inside words, between a letter and its combining mark,
inside multi-byte characters' neighbours, inside ``<|im_end|>``): the final tokens of every prefix
are a prefix of the whole text's tokens, and a generator fed as text arrives (waiting, never stepped,
while its next token is not final) emits bitwise the codes of the whole text given at once, same seed,
for a named speaker, an x-vector clone, an ICL clone and VoiceDesign, greedy and sampled.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from tests.fixtures.models import random_voice
from voxcast.engine.request import SamplingParams
from voxcast.errors import InvalidRequest
from voxcast.models.qwen3_tts.generator import FrameGenerator
from voxcast.models.qwen3_tts.model import Qwen3TTS
from voxcast.models.qwen3_tts.open_prompt import OpenPrompt
from voxcast.models.qwen3_tts.prompt import TEXT_BLOCK
from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt
from voxcast.text.normalize import normalize_text

TEXTS = [
    "Dr. Smith arrived at 3 p.m. and said: don't worry, we'll be fine! It's 3.5 km away.",
    "你好。今天天气很好，我们去公园吧！",
    "Cafe\u0301 au lait? Na\u0308ive  résumé,   déjà vu... \u00bfQue\u0301 tal?",
    "Emoji 👋🏽 and ZWJ 👨\u200d👩\u200d👧 plus (parentheses) [brackets] & 'quotes' — done.",
    "Numbers 1234567 and 12:30, 2024-11-25; x=y+z. E-mail: a.b@c.de",
    "Special <|im_end|> text <|im_start|> inside, then <|im_ half and the end.",
    "I'm sure you're right, they've said we'll go, he'd know; I'LL SHOUT 'S",
    "Short.",
]


def _splits(text: str, rng: random.Random) -> list[str]:
    """``text`` cut at random places (often one character, sometimes long runs)."""
    out, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, rng.randint(1, 12)])
        out.append(text[i : i + n])
        i += n
    return out


@pytest.fixture(scope="module")
def models(tiny_model_dir: Any) -> dict[str, Qwen3TTS]:
    return {
        kind: Qwen3TTS.from_pretrained(str(tiny_model_dir(kind)))
        for kind in ("custom_voice", "base", "voice_design")
    }


def _voice(model: Qwen3TTS, seed: int, frames: int | None) -> VoicePrompt:
    return random_voice(model, seed, frames, "A reference sentence, spoken.")


# case -> (model kind, prompt kwargs; "voice": frames of reference codes, None = x-vector only)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "speaker": ("custom_voice", {"speaker": "vivian", "language": "english"}),
    "xvector": ("base", {"voice": None}),
    "icl": ("base", {"voice": 20}),
    "icl_long_reference": ("base", {"voice": 45}),
    "voice_design": ("voice_design", {"instruct": "A calm, low voice."}),
}


def _kwargs(model: Qwen3TTS, kw: dict[str, Any]) -> dict[str, Any]:
    kw = dict(kw)
    if "voice" in kw:
        kw["voice"] = _voice(model, 7, kw["voice"])
    return kw


def _whole(
    model: Qwen3TTS, text: str, kw: dict[str, Any], sampling: SamplingParams, frames: int
) -> torch.Tensor:
    prompt = model.build_prompt(text, non_streaming_text=False, **kw)
    gen = model.new_generator(prompt, sampling, frames)
    out = []
    while (f := gen.step()) is not None:
        out.append(f)
    return torch.stack(out)


def _incremental(
    model: Qwen3TTS,
    deltas: list[str],
    kw: dict[str, Any],
    sampling: SamplingParams,
    frames: int,
    rng: random.Random,
) -> tuple[torch.Tensor, OpenPrompt, int]:
    """Frames of ``deltas`` fed while generating: between steps 0-2 deltas arrive; a waiting
    generator is not stepped. Returns the codes, the prompt and how many times it waited."""
    prompt = model.open_prompt(**kw)
    assert isinstance(prompt, OpenPrompt)
    raw, pending = "", list(deltas)
    gen: FrameGenerator | None = None
    out: list[torch.Tensor] = []
    waits = 0
    while True:
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            if pending:
                raw += pending.pop(0)
        prompt.update(normalize_text(raw), closed=not pending)
        if gen is None:
            if not prompt.ready:
                continue
            gen = model.new_generator(prompt, sampling, frames)
        if gen.waiting:
            waits += 1
            continue
        f = gen.step()
        if f is None:
            return torch.stack(out), prompt, waits
        out.append(f)


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_final_tokens_are_a_prefix_of_the_whole_texts(models: dict[str, Qwen3TTS], text: str) -> None:
    builder = models["custom_voice"]._prompts
    whole = builder.text_ids(normalize_text(text))
    rng = random.Random(text)
    for _ in range(20):
        raw = ""
        fed: list[int] = []
        for delta in _splits(text, rng):
            raw += delta
            known = builder.tokenizer.stable_prefix(normalize_text(raw))
            ids = builder.text_ids(known) if known.strip() else []
            assert whole[: len(ids)] == ids, (raw, known)
            assert len(ids) >= len(fed)  # never takes a token back
            fed = ids
    assert len(whole) > len(fed) or text == "Short."  # something stays open until the end


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("case", list(CASES))
def test_incremental_frames_equal_the_whole_text(
    models: dict[str, Qwen3TTS], case: str, greedy: bool
) -> None:
    kind, kw = CASES[case]
    model = models[kind]
    kw = _kwargs(model, kw)
    sampling = SamplingParams(seed=5, greedy=greedy)
    waited = 0
    for n, text in enumerate(TEXTS[:5]):
        frames = 40 + 3 * n  # past the text's end (eod, then pad)
        want = _whole(model, normalize_text(text), kw, sampling, frames)
        rng = random.Random(f"{case}{n}{greedy}")
        got, prompt, waits = _incremental(model, _splits(text, rng), kw, sampling, frames, rng)
        assert torch.equal(got, want), f"text {n}: frames differ"
        assert prompt.diverged == 0
        waited += waits
    # the generators did wait for text (a long reference's prefill takes nearly all of these texts)
    assert waited > 0 or case == "icl_long_reference"


def test_rows_do_not_depend_on_what_was_known(models: dict[str, Qwen3TTS]) -> None:
    """A text row computed while its block was partly known equals the row of the whole block."""
    model = models["custom_voice"]
    text = " ".join(f"word{i}" for i in range(3 * TEXT_BLOCK))
    whole = model.build_prompt(text, speaker="ryan", non_streaming_text=False)
    prompt = model.open_prompt(speaker="ryan")
    assert prompt is not None
    words = text.split(" ")
    rows = []
    for i in range(len(words)):  # one word at a time: every block is recomputed as it fills
        prompt.update(" ".join(words[: i + 1]) + " ", closed=False)
        row = prompt.text_row(len(rows))
        while row is not None:
            rows.append(row)
            row = prompt.text_row(len(rows))
    prompt.update(text, closed=True)
    while len(rows) < whole.trailing.shape[1]:
        rows.append(prompt.text_row(len(rows)))
    assert torch.equal(torch.cat(rows, dim=1), whole.trailing)
    assert torch.equal(prompt.embeds, whole.embeds)
    assert torch.equal(prompt.text_row(len(rows) + 3), whole.pad)
    assert (prompt.prefix_len, prompt.prefix_key) == (whole.prefix_len, whole.prefix_key)


def test_prefill_waits_for_its_text(models: dict[str, Qwen3TTS]) -> None:
    base = models["base"]
    icl = _voice(base, 3, 30)
    prompt = base.open_prompt(voice=icl)
    assert prompt is not None
    prompt.update("Hello", closed=False)
    assert not prompt.ready  # an ICL prefill holds text aligned with 31 reference positions
    prompt.update("Hello there", closed=True)
    assert prompt.ready  # a short complete text: eod and pad fill the rest
    whole = base.build_prompt("Hello there", voice=icl, non_streaming_text=False)
    assert torch.equal(prompt.embeds, whole.embeds)
    named = models["custom_voice"].open_prompt(speaker="ryan")
    assert named is not None
    named.update("Hello", closed=False)
    assert not named.ready  # "Hello" could still become "Hellooo"
    named.update("Hello ", closed=False)
    assert named.ready and named.text_tokens == 1


def test_whole_text_layouts_and_empty_text(models: dict[str, Qwen3TTS]) -> None:
    model = models["custom_voice"]
    assert model.open_prompt(speaker="ryan", non_streaming_text=True) is None
    with pytest.raises(InvalidRequest) as e:
        model.open_prompt(speaker="nobody")
    assert e.value.field == "voice"
    prompt = model.open_prompt(speaker="ryan")
    assert prompt is not None
    with pytest.raises(InvalidRequest) as e:
        prompt.update("", closed=True)
    assert e.value.field == "text"
