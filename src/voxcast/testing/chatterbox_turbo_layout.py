"""A whole random-weight Chatterbox Turbo checkpoint folder in the official layout, for tests and
benchmarks: ``t3_turbo_v1.safetensors``, ``s3gen_meanflow.safetensors`` (flow, HiFT, CAMPPlus, S3
tokenizer), ``ve.safetensors``, GPT-2 tokenizer files, and a ``config.json`` naming the family.

The tokenizer is a small GPT-2 byte-level BPE trained in milliseconds on a built-in English text (the
256 byte symbols, a few hundred merges, ``<|endoftext|>``) plus Turbo's paralinguistic tags as added
tokens; ``transformers``' ``AutoTokenizer`` loads the same files (the official loader).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["TAGS", "make_checkpoint", "make_conds", "make_test_checkpoint", "make_tokenizer"]

#: Paralinguistic tags the Turbo tokenizer holds as added tokens (public model card).
TAGS = (
    "[clear throat]", "[sigh]", "[shush]", "[cough]", "[groan]", "[sniff]", "[gasp]", "[chuckle]",
    "[laugh]",
)  # fmt: skip
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today? "
    "Thank you for calling; your call is important to us. Please hold while we connect you. "
    "Press one for sales, two for support, or stay on the line for an operator. "
    "It was the best of times, it was the worst of times, it was the age of wisdom. "
    "Numbers like 42, 1999 and 3.14 are read aloud; so are names such as Alice and Bob. "
)


def make_tokenizer(out: str | Path, merges: int = 400) -> Path:
    """Write ``vocab.json``, ``merges.txt``, ``tokenizer_config.json`` and ``special_tokens_map.json``
    into ``out`` (created); returns the folder."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + merges, initial_alphabet=alphabet, show_progress=False, special_tokens=[]
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    state = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = dict(state["vocab"])
    eot = len(vocab)
    vocab["<|endoftext|>"] = eot
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    added = {str(eot): {"content": "<|endoftext|>", "special": True}}
    for i, tag in enumerate(TAGS):
        added[str(eot + 1 + i)] = {"content": tag, "special": False}
    for entry in added.values():
        entry.update(lstrip=False, rstrip=False, single_word=False, normalized=not entry["special"])
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": 1024,
        "add_prefix_space": False,
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "added_tokens_decoder": added,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    special = {k: "<|endoftext|>" for k in ("bos_token", "eos_token", "unk_token")}
    (folder / "special_tokens_map.json").write_text(json.dumps(special), encoding="utf-8")
    return folder


def make_conds(path: str | Path, seed: int = 0, prompt_tokens: int = 60, t3_tokens: int = 90) -> Path:
    """Write a random built-in voice ``conds.pt`` in the official structure (``torch.save`` of
    ``{"t3": T3Cond fields, "gen": S3Gen's ref dict}``: tensors and None only)."""
    g = torch.Generator().manual_seed(seed)
    speaker = torch.nn.functional.normalize(torch.randn(1, 256, generator=g), dim=1)
    conds = {
        "t3": {
            "speaker_emb": speaker,
            "clap_emb": None,
            "cond_prompt_speech_tokens": torch.randint(0, 6561, (1, t3_tokens), generator=g),
            "cond_prompt_speech_emb": None,
            "emotion_adv": 0.5 * torch.ones(1, 1, 1),
        },
        "gen": {
            "prompt_token": torch.randint(0, 6561, (1, prompt_tokens), generator=g),
            "prompt_token_len": torch.tensor([prompt_tokens]),
            "prompt_feat": torch.randn(1, 2 * prompt_tokens, 80, generator=g) - 5.0,
            "prompt_feat_len": None,
            "embedding": torch.randn(1, 192, generator=g),
        },
    }
    torch.save(conds, str(path))
    return Path(path)


def make_checkpoint(out: str | Path, size: str = "tiny", seed: int = 0, conds: bool = True) -> Path:
    """Write a whole random checkpoint folder (``size``: "tiny" or "full"); returns it.

    "tiny": a 2-layer T3 64 wide, a small HiFT, estimator and S3 tokenizer (S3Gen's encoder, CAMPPlus
    and the VoiceEncoder have one size). "full": the published sizes (~3 GB; under a minute).
    """
    from voxcast.testing.chatterbox_turbo import (
        campplus_state,
        flow_state,
        hift_state,
        make_t3,
        s3_tokenizer_state,
        ve_state,
    )  # fmt: skip

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    make_t3(folder, size=size, seed=seed)
    s3gen: dict[str, torch.Tensor] = {}
    s3gen.update(flow_state(size, seed=seed + 1))
    s3gen.update(hift_state(size, seed=seed + 2))
    s3gen.update(campplus_state(seed=seed + 3))
    s3gen.update(s3_tokenizer_state(size, seed=seed + 4))
    save_file({k: v.contiguous() for k, v in s3gen.items()}, str(folder / "s3gen_meanflow.safetensors"))
    save_file({k: v.contiguous() for k, v in ve_state(seed + 5).items()}, str(folder / "ve.safetensors"))
    make_tokenizer(folder)
    if conds:
        make_conds(folder / "conds.pt", seed=seed + 6)
    return folder


def make_test_checkpoint(
    out: str | Path, kind: str, size: str = "tiny", seed: int = 0, *, ends_speech: bool = False
) -> Path:
    """The family's test-checkpoint builder (``TestCheckpoints.builder``): :func:`make_checkpoint`
    with a built-in voice, into ``out`` (which must not exist or be empty). ``kind`` is the family's
    one kind; its sampled speech always ends (``ends_speech`` changes nothing).

    Raises:
        ValueError: an unknown size, or ``out`` is not an empty folder.
    """
    from voxcast.testing.chatterbox_turbo import SIZES

    if size not in SIZES:
        raise ValueError(f"--size {size} is not a Chatterbox Turbo size ({', '.join(SIZES)})")
    folder = Path(out)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} exists and is not an empty folder")
    return make_checkpoint(folder, size, seed=seed)
