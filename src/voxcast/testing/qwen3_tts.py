"""Random-weight checkpoints in the official layout, for tests and benchmarks (no download needed).

:func:`make_test_model` writes a folder that both :meth:`voxcast.models.qwen3_tts.Qwen3TTS.from_pretrained`
and the official ``Qwen3TTSModel.from_pretrained(dir)`` load: ``config.json`` (written here, the
official ``save_pretrained`` cannot), ``model.safetensors``, ``generation_config.json``,
``preprocessor_config.json``, the text tokenizer and ``speech_tokenizer/``.

Sizes: "tiny" (talker width 64, 2 layers; 0.6B-shaped, i.e. the code predictor has the talker's
width, except voice_design which only exists as 1.7B), "tiny-1.7b" (1.7B-shaped: a narrower code
predictor behind ``small_to_mtp_projection``, instruct honoured on custom_voice), and the real
"0.6b" / "1.7b" shapes (configs from the reference folder). Every special id, the 151936-token text
vocabulary, the codec vocabulary and the frame maths are the real ones.

The text tokenizer is copied from the reference folder when it exists (never commit those files);
otherwise a small byte-level BPE is built with the real special-token ids.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from voxcast.models.qwen3_tts.checkpoint import Qwen3TTSNet
from voxcast.models.qwen3_tts.config import Qwen3TTSConfig

__all__ = ["KINDS", "SIZES", "TINY_EOS_SCALE", "make_test_model", "model_config_dict", "reference_dir"]

logger = logging.getLogger(__name__)

KINDS = ("base", "custom_voice", "voice_design")
SIZES = ("tiny", "tiny-1.7b", "0.6b", "1.7b")
#: Tiny checkpoints scale the end-of-speech row of ``talker.codec_head`` by this, so that sampling
#: (top-k 50) essentially never ends speech early: with the row at full scale a 40-frame request
#: drew it about once in 60 seeds, and a test expecting 40 frames got 32. Tests that want early ends
#: scale the row back up (tests/fixtures/models.py: eos_prone_copy).
TINY_EOS_SCALE = 0.25
#: Demo checkpoints (``ends_speech``) scale the row by this instead: measured on the seed-0 tiny
#: CustomVoice checkpoint with the demo sentence (45 characters, ~3 s of real speech), seed 8 (the
#: demo's) ended by end-of-speech after 37 frames (3.0 s) and greedy decoding after 36; over seeds
#: 0-11 the lengths ranged 2-77 frames, and seed 7 ran to the limit. A random model cannot read, so the length is not
#: tied to the text; what the demo needs is the normal path: speech that ends, gets cached, replays.
DEMO_EOS_SCALE = 3.0

#: Where the published configs and tokenizer live (``$VOXCAST_QWEN3_REFERENCE`` overrides).
DEFAULT_REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "qwen3-tts-reference"

_DIR_KIND = {"base": "Base", "custom_voice": "CustomVoice", "voice_design": "VoiceDesign"}

# Facts from the published configs (used when the reference folder is absent).
_LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
    "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
}  # fmt: skip
_DIALECTS = {"beijing_dialect": 2074, "sichuan_dialect": 2062}
_SPEAKERS = {
    "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
    "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878,
}  # fmt: skip
_SPEAKER_DIALECT = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
_GENERATION = {
    "do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
    "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
    "subtalker_top_k": 50, "max_new_tokens": 8192,
}  # fmt: skip
_PREPROCESSOR = {
    "padding_side": "left", "padding_value": 0.0, "processor_class": "Qwen3TTSProcessor",
    "return_attention_mask": True,
}  # fmt: skip


def reference_dir() -> Path | None:
    """The reference folder (published configs + tokenizer), or None when it is not on this machine."""
    env = os.environ.get("VOXCAST_QWEN3_REFERENCE")
    path = Path(env) if env else DEFAULT_REFERENCE
    return path if (path / "configs").is_dir() else None


def _transformer(hidden: int, inter: int, layers: int, heads: int, kv: int, head_dim: int) -> dict[str, Any]:
    return {
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000, "attention_bias": False,
        "attention_dropout": 0, "initializer_range": 0.02, "use_cache": True,
    }  # fmt: skip


def _tiny_config(kind: str, shaped_17b: bool) -> dict[str, Any]:
    cp_hidden = 32 if shaped_17b else 64
    cp = _transformer(cp_hidden, 64, 1, 4, 2, 16)
    cp.update({
        "model_type": "qwen3_tts_talker_code_predictor", "vocab_size": 2048, "num_code_groups": 16,
        "max_position_embeddings": 65536, "layer_types": ["full_attention"], "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": 28,
    })  # fmt: skip
    custom = kind == "custom_voice"
    talker = _transformer(64, 128, 2, 4, 2, 16)
    talker.update({
        "model_type": "qwen3_tts_talker", "code_predictor_config": cp, "vocab_size": 3072,
        "text_vocab_size": 151936, "text_hidden_size": 32, "num_code_groups": 16,
        "max_position_embeddings": 32768, "position_id_per_seconds": 13, "sliding_window": None,
        "use_sliding_window": False,
        "rope_scaling": {"interleaved": True, "mrope_section": [3, 3, 2], "rope_type": "default",
                         "type": "default"},
        "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
        "codec_pad_id": 2148, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
        "codec_language_id": {**_LANGUAGES, **(_DIALECTS if custom else {})},
        "spk_id": dict(_SPEAKERS) if custom else {},
        "spk_is_dialect": {k: _SPEAKER_DIALECT.get(k, False) for k in _SPEAKERS} if custom else {},
    })  # fmt: skip
    out: dict[str, Any] = {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "assistant_token_id": 77091, "im_start_token_id": 151644, "im_end_token_id": 151645,
        "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": "1b7" if shaped_17b else "0b6",
        "tts_model_type": kind, "talker_config": talker, "transformers_version": "4.57.3",
    }  # fmt: skip
    if kind == "base":
        from voxcast.testing.qwen3_tts_parts import tiny_speaker_encoder_config

        out["speaker_encoder_config"] = tiny_speaker_encoder_config(64)
    return out


def model_config_dict(kind: str, size: str = "tiny") -> dict[str, Any]:
    """The ``config.json`` content of a test checkpoint.

    Raises:
        ValueError: unknown kind/size, a combination that was never released (0.6B VoiceDesign),
            or a full size when the reference configs are not on this machine.
    """
    if kind not in KINDS or size not in SIZES:
        raise ValueError(f"kind must be one of {KINDS} and size one of {SIZES}; got {kind!r}, {size!r}")
    if size.startswith("tiny"):
        return _tiny_config(kind, shaped_17b=size == "tiny-1.7b" or kind == "voice_design")
    if kind == "voice_design" and size == "0.6b":
        raise ValueError("there is no 0.6B VoiceDesign model")
    ref = reference_dir()
    if ref is None:
        raise ValueError(f"size {size!r} needs the reference configs ($VOXCAST_QWEN3_REFERENCE)")
    path = ref / "configs" / f"{size.upper()}-{_DIR_KIND[kind]}" / "config.json"
    return dict(json.loads(path.read_text(encoding="utf-8")))


@torch.no_grad()
def _random_state(config: Qwen3TTSConfig, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Random weights for every key, one tensor at a time (meta model -> names and shapes)."""
    with torch.device("meta"):
        net = Qwen3TTSNet(config)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, p in net.state_dict().items():
        shape = tuple(p.shape)
        if name.endswith(".bias"):
            t = torch.randn(shape, generator=gen) * 0.02
        elif len(shape) == 1:  # norm weights
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif "embedding" in name:
            t = torch.randn(shape, generator=gen)
        else:  # Linear / Conv weights: unit-variance outputs
            t = torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))
        out[name] = t.to(dtype).contiguous()
    return out


def _write_tokenizer(out: Path) -> None:
    ref = reference_dir()
    common = ref / "common" if ref is not None else None
    if common is not None and (common / "vocab.json").is_file():
        for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            shutil.copyfile(common / name, out / name)
        return
    _write_small_tokenizer(out)


# Added tokens of the Qwen2/Qwen3-TTS tokenizer at ids 151643.. (special flag per token).
_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False), ("<|audio_start|>", True),
    ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
]  # fmt: skip
_FIRST_ADDED = 151643
#: Whole-word tokens at their real Qwen2 ids (the prompt templates use them).
_WORDS = {"assistant": 77091, "user": 872, "system": 8948}


def _byte_symbols() -> list[str]:
    """GPT-2's byte -> printable character table, in vocabulary order (so "\\n" is id 198)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    rest = [b for b in range(256) if b not in bs]
    chars = [chr(b) for b in bs] + [chr(256 + i) for i in range(len(rest))]
    return chars


def _write_small_tokenizer(out: Path) -> None:
    """A byte-level BPE with 256 byte tokens, merges for the template words, filler up to 151642."""
    vocab: dict[str, int] = {c: i for i, c in enumerate(_byte_symbols())}
    merges: list[str] = []
    taken = set(_WORDS.values())
    next_id = 256
    for word, word_id in _WORDS.items():
        for n in range(2, len(word) + 1):
            merges.append(f"{word[: n - 1]} {word[n - 1]}")
            if n == len(word):
                vocab[word] = word_id
            elif word[:n] not in vocab:
                while next_id in taken:
                    next_id += 1
                vocab[word[:n]] = next_id
                taken.add(next_id)
    used = set(vocab.values())
    for i in range(_FIRST_ADDED):
        if i not in used:
            vocab[f"<|filler_{i}|>"] = i
    added = {
        str(_FIRST_ADDED + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                "single_word": False, "special": special}
        for i, (c, special) in enumerate(_ADDED)
    }  # fmt: skip
    tcfg = {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }  # fmt: skip
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n", encoding="utf-8")


def make_test_model(
    out_dir: str | Path, kind: str, size: str = "tiny", seed: int = 0, *, ends_speech: bool = False
) -> Path:
    """Write a random-weight checkpoint folder in the official layout.

    Args:
        out_dir: folder to create (must not exist or be empty).
        kind: "base", "custom_voice" or "voice_design".
        size: "tiny", "tiny-1.7b", "0.6b" or "1.7b" (see the module docstring).
        seed: the same seed gives the same weights; the global RNG is not touched.
        ends_speech: a tiny checkpoint whose speech ends by end-of-speech (:data:`DEMO_EOS_SCALE`)
            instead of running to the frame limit (:data:`TINY_EOS_SCALE`, what tests expect).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ValueError: bad kind/size (see :func:`model_config_dict`) or a non-empty ``out_dir``.
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty")
    raw = model_config_dict(kind, size)
    config = Qwen3TTSConfig.from_dict(copy.deepcopy(raw))
    out.mkdir(parents=True, exist_ok=True)
    full = not size.startswith("tiny")
    state = _random_state(config, seed, torch.bfloat16 if full else torch.float32)
    if not full:
        scale = DEMO_EOS_SCALE if ends_speech else TINY_EOS_SCALE
        state["talker.codec_head.weight"][config.talker.codec_eos_token_id] *= scale
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    del state
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(_GENERATION, indent=2) + "\n", encoding="utf-8")
    (out / "preprocessor_config.json").write_text(
        json.dumps(_PREPROCESSOR, indent=2) + "\n", encoding="utf-8"
    )
    _write_tokenizer(out)
    from voxcast.testing.qwen3_tts_parts import write_random_speech_tokenizer

    write_random_speech_tokenizer(out / "speech_tokenizer", "full" if full else "tiny", seed)
    logger.info("wrote a random %s %s checkpoint to %s (seed %d)", size, kind, out, seed)
    return out
