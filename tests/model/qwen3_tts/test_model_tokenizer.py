"""The Qwen2 tokenizer: real vocabulary (when present) against transformers, and the test tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from voxcast.errors import CheckpointError
from voxcast.models.qwen3_tts.tokenizer import TextTokenizer, build_backend
from voxcast.testing.qwen3_tts import _write_small_tokenizer, reference_dir

REF = reference_dir()
needs_reference = pytest.mark.skipif(REF is None, reason="reference tokenizer (../shared) not present")

TEMPLATE = "<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n"
TEXTS = [
    "Hello world, this is a test. 123",
    "McDonald's iPhone CamelCase words",
    "  leading spaces\n\nand  newlines\ttabs",
    "Ünïcödé café naïve — “quotes”",
    "中文测试，你好。日本語のテスト",
    "numbers 3.14159 and 2,048 items!",
]


@pytest.fixture(scope="module")
def real() -> TextTokenizer:
    assert REF is not None
    return TextTokenizer.from_dir(REF / "common")


@pytest.fixture(scope="module")
def hf() -> object:
    transformers = pytest.importorskip("transformers")
    assert REF is not None
    return transformers.AutoTokenizer.from_pretrained(str(REF / "common"))


@needs_reference
@pytest.mark.parametrize("text", TEXTS)
def test_equals_transformers_qwen2(real: TextTokenizer, hf: Any, text: str) -> None:
    s = TEMPLATE.format(text)
    assert real.encode(s) == hf(s)["input_ids"]
    assert real.decode(real.encode(s)) == s


@needs_reference
def test_known_ids(real: TextTokenizer) -> None:
    ids = real.encode(TEMPLATE.format("Hello world"))
    assert ids[:3] == [151644, 77091, 198]
    assert ids[-5:] == [151645, 198, 151644, 77091, 198]
    assert real.encode("McDonald's iPhone") == [25286, 18234, 594, 12167]  # Qwen2 regex, not Mistral's
    assert real.token_id("<tts_pad>") == 151671
    assert real.token_id("<tts_text_bos>") == 151672
    assert real.token_id("<tts_text_eod>") == 151673
    assert real.vocab_size == 151676


def test_small_test_tokenizer(tmp_path: Path) -> None:
    _write_small_tokenizer(tmp_path)
    tok = TextTokenizer.from_dir(tmp_path)
    ids = tok.encode(TEMPLATE.format("hi"))
    assert ids[:3] == [151644, 77091, 198] and ids[-5:] == [151645, 198, 151644, 77091, 198]
    assert tok.encode("user") == [872] and tok.encode("system") == [8948]
    assert tok.decode(tok.encode("any text, ünïcode 中文")) == "any text, ünïcode 中文"
    with pytest.raises(KeyError):
        tok.token_id("<no such token>")


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"vocab\.json.*merges\.txt.*tokenizer_config\.json"):
        TextTokenizer.from_dir(tmp_path)


def test_malformed_files(tmp_path: Path) -> None:
    _write_small_tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="cannot read"):
        TextTokenizer.from_dir(tmp_path)


def test_added_token_at_wrong_id() -> None:
    vocab = {chr(c): i for i, c in enumerate(range(33, 60))}
    with pytest.raises(CheckpointError, match="expected 5"):
        build_backend(vocab, [], {5: ("<special>", True)})


def test_added_token_config_roundtrip(tmp_path: Path) -> None:
    _write_small_tokenizer(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["added_tokens_decoder"]["151671"]["content"] == "<tts_pad>"
