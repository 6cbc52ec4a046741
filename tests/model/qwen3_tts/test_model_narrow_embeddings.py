"""Embedding tables stored in bfloat16 stay bfloat16 in a float32 model: same outputs, half the bytes."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import voxcast.models.qwen3_tts.model as model_module
from voxcast.engine.request import SamplingParams
from voxcast.models.qwen3_tts.checkpoint import WidenedEmbedding, load_network, locate_checkpoint
from voxcast.models.qwen3_tts.config import Qwen3TTSConfig
from voxcast.models.qwen3_tts.model import Qwen3TTS


@pytest.fixture(scope="module")
def bf16_checkpoint(tiny_model_dir: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Base checkpoint with every floating tensor stored in bfloat16, as the real ones are."""
    out = tmp_path_factory.mktemp("bf16") / "base"
    shutil.copytree(tiny_model_dir("base"), out)
    weights = out / "model.safetensors"
    state = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in load_file(weights).items()}
    save_file(state, str(weights), metadata={"format": "pt"})
    return out


def _embeddings(net: nn.Module) -> dict[str, nn.Embedding]:
    return {n: m for n, m in net.named_modules() if isinstance(m, nn.Embedding)}


def test_tables_stay_narrow_and_lookups_are_bitwise_equal(bf16_checkpoint: Path) -> None:
    files = locate_checkpoint(bf16_checkpoint)
    config = Qwen3TTSConfig.from_file(files.config)
    narrow = load_network(files, config)
    wide = load_network(files, config, narrow_embeddings=False)
    a, b = _embeddings(narrow), _embeddings(wide)
    assert a.keys() == b.keys() and len(a) >= 3  # text, talker codec, code predictor codec tables
    for name, emb in a.items():
        assert isinstance(emb, WidenedEmbedding) and emb.weight.dtype == torch.bfloat16, name
        assert type(b[name]) is nn.Embedding and b[name].weight.dtype == torch.float32
        ids = torch.randint(0, emb.num_embeddings, (2, 7))
        out = emb(ids)
        assert out.dtype == torch.float32 and torch.equal(out, b[name](ids)), name
        assert emb.weight.nbytes * 2 == b[name].weight.nbytes
    # everything else is float32 as asked
    others = [p for n, p in narrow.named_parameters() if not any(n.startswith(k + ".") for k in a)]
    assert others and all(p.dtype == torch.float32 for p in others)


def test_float32_tables_are_left_alone(tiny_model_dir: Any) -> None:
    files = locate_checkpoint(tiny_model_dir("base"))
    net = load_network(files, Qwen3TTSConfig.from_file(files.config))
    assert all(type(m) is nn.Embedding for m in _embeddings(net).values())


def _codes(model: Qwen3TTS) -> torch.Tensor:
    voice = model.make_voice_prompt(
        0.1 * torch.sin(torch.arange(36000) / 24000 * 2 * torch.pi * 160).numpy(), 24000, ref_text="Hi."
    )
    gen = model.new_generator(
        model.build_prompt("Narrow tables, same codes.", voice=voice), SamplingParams(seed=4), 12
    )
    gen.prefill()
    frames = []
    while (f := gen.step()) is not None:
        frames.append(f)
    return torch.stack(frames)


def test_generation_is_unchanged(bf16_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A voice clone (speaker encoder, codec encoder, ICL prompt, code predictor) on both loads."""
    first = Qwen3TTS.from_pretrained(str(bf16_checkpoint))
    assert isinstance(first.talker.model.text_embedding, WidenedEmbedding)
    narrow = _codes(first)
    monkeypatch.setattr(
        model_module, "load_network", functools.partial(load_network, narrow_embeddings=False)
    )
    second = Qwen3TTS.from_pretrained(str(bf16_checkpoint))
    assert type(second.talker.model.text_embedding) is nn.Embedding
    wide = _codes(second)
    assert narrow.shape == (12, 16) and torch.equal(narrow, wide)
