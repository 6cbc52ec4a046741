"""Chatterbox Turbo's T3 against the official chatterbox-tts 0.1.7 ``T3.inference_turbo`` on the same
random weights: the same speech tokens, greedy and with seeded sampling (Turbo's processor order:
temperature, top-k, top-p, repetition penalty), from the conditioning or from a cached voice prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.parity._official_chatterbox import import_chatterbox, official_t3, official_tokens
from voxcast.models.chatterbox_turbo.sampling import TurboSampling
from voxcast.models.chatterbox_turbo.t3 import T3, load_t3
from voxcast.testing.chatterbox_turbo import SIZES, make_t3

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(import_chatterbox("models.t3.t3") is None, reason="chatterbox-tts not installed"),
]


def _inputs(seed: int, prompt_len: int = 30, text_len: int = 14) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    speaker = torch.randn(1, 256, generator=g)
    prompt = torch.randint(0, 6561, (1, prompt_len), generator=g)
    text = torch.randint(0, 50276, (1, text_len), generator=g)
    return speaker, prompt, text


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("t3")
    make_t3(root / "ends", "tiny", seed=1)  # the stop bias raised: sampled speech ends
    make_t3(root / "plain", "tiny", seed=2, stop_bias=0.0)  # greedy runs to the limit
    return {"ends": root / "ends", "plain": root / "plain"}


def _pair(folder: Path) -> tuple[T3, object]:
    layers, width, _ = SIZES["tiny"]
    return load_t3(folder), official_t3(folder, layers, width, heads=1)


def test_greedy_tokens_equal_the_official(checkpoints: dict[str, Path]) -> None:
    ours, official = _pair(checkpoints["plain"])
    for seed in (0, 1):
        speaker, prompt, text = _inputs(seed)
        # the official loop has no greedy mode: top-k 1 without the other processors is argmax
        want = official_tokens(
            official, speaker, prompt, text, temperature=1.0, top_k=1, top_p=1.0, repetition_penalty=1.0,
            max_gen_len=39,
        )  # fmt: skip
        cond = ours.conditioning(speaker, prompt)
        got = ours.stream(text, conditioning=cond, sampling=TurboSampling(greedy=True), max_tokens=40).all()
        assert len(want) == 40 and got == want


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_seeded_sampling_equals_the_official(checkpoints: dict[str, Path], seed: int) -> None:
    ours, official = _pair(checkpoints["ends"])
    speaker, prompt, text = _inputs(seed + 10)
    torch.manual_seed(seed)
    want = official_tokens(official, speaker, prompt, text, max_gen_len=300)
    got = ours.stream(text, conditioning=ours.conditioning(speaker, prompt), seed=seed, max_tokens=301).all()
    assert got == want and 0 < len(want) < 300  # it ended on the stop token, as the official did


def test_a_cached_voice_prefix_gives_the_same_tokens(checkpoints: dict[str, Path]) -> None:
    ours, official = _pair(checkpoints["ends"])
    speaker, prompt, text = _inputs(5)
    prefix = ours.prefix(ours.conditioning(speaker, prompt))
    first = ours.stream(text, prefix=prefix, seed=4, max_tokens=301).all()
    again = ours.stream(text, prefix=prefix, seed=4, max_tokens=301).all()  # the prefix is not consumed
    torch.manual_seed(4)
    assert first == again == official_tokens(official, speaker, prompt, text, max_gen_len=300)
