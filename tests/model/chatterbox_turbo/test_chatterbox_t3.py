"""Chatterbox Turbo's T3 on a tiny random checkpoint: loading (clear errors, unused tensors dropped),
token streams (limits, stop token, seeds, independent streams) and the cached voice prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from voxcast.errors import CheckpointError
from voxcast.models.chatterbox_turbo.config import T3Config
from voxcast.models.chatterbox_turbo.sampling import TurboSampling, process_logits
from voxcast.models.chatterbox_turbo.t3 import T3, T3_FILE, load_t3
from voxcast.testing.chatterbox_turbo import make_t3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("t3")
    make_t3(path, "tiny", seed=3)
    return path


@pytest.fixture(scope="module")
def t3(folder: Path) -> T3:
    return load_t3(folder)


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(1, 256, generator=g),
        torch.randint(0, 6561, (1, 20), generator=g),
        torch.randint(0, 50276, (1, 10), generator=g),
    )


def test_the_config_is_read_from_the_tensors(t3: T3) -> None:
    assert t3.cfg == T3Config(
        layers=2, width=64, heads=1, positions=8196, text_vocab=50276, speech_vocab=6563
    )
    names = {n for n, _ in t3.named_parameters()}
    assert "text_head.weight" not in names and not any("wte" in n for n in names)  # never read: not loaded


def test_a_missing_file_or_tensor_is_a_clear_error(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=T3_FILE):
        load_t3(tmp_path)
    state = load_file(str(folder / T3_FILE))
    del state["tfmr.h.1.mlp.c_fc.bias"]
    save_file(state, str(tmp_path / T3_FILE))
    with pytest.raises(CheckpointError, match=r"missing \['tfmr.h.1.mlp.c_fc.bias'\]"):
        load_t3(tmp_path)
    del state["speech_emb.weight"]
    save_file(state, str(tmp_path / T3_FILE))
    with pytest.raises(CheckpointError, match=r"speech_emb\.weight"):
        load_t3(tmp_path)


def test_a_seed_reproduces_and_streams_are_independent(t3: T3) -> None:
    speaker, prompt, text = _inputs(1)
    cond = t3.conditioning(speaker, prompt)
    alone = [t3.stream(text, conditioning=cond, seed=s, max_tokens=120).all() for s in (1, 2)]
    assert alone[0] != alone[1]
    a, b = (t3.stream(text, conditioning=cond, seed=s, max_tokens=120) for s in (1, 2))
    got: list[list[int]] = [[], []]
    while not (a.done and b.done):  # interleaved, each with its own generator
        for i, s in enumerate((a, b)):
            if (tok := s.next()) is not None:
                got[i].append(tok)
    assert got == alone


def test_the_stop_token_ends_a_stream_and_the_limit_caps_it(t3: T3) -> None:
    speaker, prompt, text = _inputs(2)
    cond = t3.conditioning(speaker, prompt)
    ended = t3.stream(text, conditioning=cond, seed=0, max_tokens=500)
    tokens = ended.all()
    assert ended.done and 0 < len(tokens) < 500 and t3.cfg.stop_speech not in tokens
    assert int(ended.tokens[-1]) == t3.cfg.stop_speech and ended.next() is None
    capped = t3.stream(text, conditioning=cond, sampling=TurboSampling(greedy=False), seed=0, max_tokens=3)
    assert len(capped.all()) <= 3


def test_a_prefix_serves_many_requests_unchanged(t3: T3) -> None:
    speaker, prompt, text = _inputs(3)
    prefix = t3.prefix(t3.conditioning(speaker, prompt))
    length = prefix.length
    runs = [t3.stream(text, prefix=prefix, seed=9, max_tokens=80).all() for _ in range(2)]
    assert runs[0] == runs[1] and prefix.length == length == 21
    with pytest.raises(ValueError, match="conditioning or prefix"):
        t3.stream(text)


def test_the_processors_run_in_turbos_order() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    s = TurboSampling(temperature=0.5, top_k=3, top_p=1.0, repetition_penalty=2.0)
    out = process_logits(logits, torch.tensor([[0, 3]]), s)
    # temperature first (x2), top-k keeps 3, then the penalty divides the positive seen score and
    # leaves the filtered one at -inf
    assert out[0, 0] == 2.0 and out[0, 1] == 2.0 and out[0, 2] == 1.0
    assert torch.isinf(out[0, 3]) and torch.isinf(out[0, 4])
