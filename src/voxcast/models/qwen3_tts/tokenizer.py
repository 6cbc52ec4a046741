"""The Qwen2 byte-level BPE text tokenizer, built with the ``tokenizers`` library.

Built from the checkpoint's ``vocab.json`` + ``merges.txt`` + the added tokens listed in
``tokenizer_config.json``, with the pipeline of transformers' Qwen2 converter: NFC normalisation,
the real Qwen2 pre-tokenizer regex, byte-level mapping, byte-level decoding. The official wrapper
loads its tokenizer with ``fix_mistral_regex=True``, which swaps in a different regex and splits
CamelCase words differently ("McDonald's iPhone": 17 tokens instead of 15); we keep Qwen2's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from voxcast.errors import CheckpointError

__all__ = ["QWEN2_PRETOKENIZE_REGEX", "TOKENIZER_FILES", "TextTokenizer", "build_backend"]

#: The Qwen2 pre-tokenizer pattern (transformers ``models/qwen2/tokenization_qwen2.py``).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)

#: Files a checkpoint needs for the tokenizer.
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def _read_merges(path: Path) -> list[tuple[str, str]]:
    merges: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#version"):
            continue
        a, _, b = line.partition(" ")
        merges.append((a, b))
    return merges


def build_backend(
    vocab: dict[str, int], merges: list[tuple[str, str]], added: dict[int, tuple[str, bool]]
) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` for Qwen2 BPE.

    Args:
        vocab: token -> id of the BPE vocabulary.
        merges: merge rules in rank order.
        added: id -> (content, special) of the added tokens; each must get its listed id.

    Raises:
        CheckpointError: an added token would not receive its listed id.
    """
    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for idx in sorted(added):
        content, special = added[idx]
        token = AddedToken(
            content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False
        )
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        got = tok.token_to_id(content)
        if got != idx:
            raise CheckpointError(f"tokenizer: added token {content!r} got id {got}, expected {idx}")
    return tok


class TextTokenizer:
    """Text <-> ids for prompts. ``encode`` never adds special tokens of its own."""

    def __init__(self, backend: Tokenizer) -> None:
        self._tok = backend
        added = backend.get_added_tokens_decoder()
        self._added = tuple(t.content for t in added.values())
        self._added_ids = frozenset(added)

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        """Load from a checkpoint directory holding :data:`TOKENIZER_FILES`.

        Raises:
            CheckpointError: a file is missing or malformed.
        """
        root = Path(path)
        missing = [f for f in TOKENIZER_FILES if not (root / f).is_file()]
        if missing:
            raise CheckpointError(f"{root}: tokenizer files missing: {', '.join(missing)}")
        try:
            vocab = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
            merges = _read_merges(root / "merges.txt")
            tcfg = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
            added = {
                int(i): (str(t["content"]), bool(t.get("special", False)))
                for i, t in (tcfg.get("added_tokens_decoder") or {}).items()
            }
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{root}: cannot read the tokenizer: {e}") from e
        return cls(build_backend(vocab, merges, added))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings such as ``<|im_start|>`` map to their ids)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def stable_prefix(self, text: str) -> str:
        """The longest prefix of ``text`` whose tokens are final whatever text follows.

        Tokens are made per pre-tokenizer piece (the Qwen2 regex: a word with its leading space, a
        digit, a run of punctuation, a run of spaces) within the segments between added tokens, and
        a piece's extent depends only on the text up to its end plus one character of look-ahead.
        So in the last segment every piece but the last is final: more text can only extend the last
        one ("do" -> "don't"), merge it with a combining mark, or turn a run of spaces into a space
        and a word. Text that could still become an added token (``<|im_`` before ``end|>``) would
        end the segment there instead, so the prefix stops where both readings agree. The encoding of
        the prefix is then a prefix of the encoding of ``text + more`` for any ``more``
        (tests/model/qwen3_tts/test_text_stream.py checks this on random splits).
        """
        enc = self._tok.encode(text, add_special_tokens=False)
        start = 0  # the last segment: after the last complete added token
        for tid, (_, end) in zip(enc.ids, enc.offsets, strict=True):
            if tid in self._added_ids:
                start = end
        seg = text[start:]
        pieces = self._pieces(seg)
        if not pieces:
            return text
        cut = pieces[-1][1][0]  # every piece but the last
        partial = self._partial_added(seg)
        if partial is not None:  # also a prefix of the segment as ended by that added token
            cut = min(cut, _common_boundary(pieces, self._pieces(seg[:partial])))
        return text[: start + cut]

    def _pieces(self, text: str) -> list[tuple[str, tuple[int, int]]]:
        return list(self._tok.pre_tokenizer.pre_tokenize_str(text)) if text else []

    def _partial_added(self, text: str) -> int | None:
        """Where the longest suffix of ``text`` that is a proper prefix of an added token starts."""
        best = None
        for token in self._added:
            for n in range(min(len(token) - 1, len(text)), 0, -1):
                if text.endswith(token[:n]):
                    if best is None or len(text) - n < best:
                        best = len(text) - n
                    break
        return best

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (special tokens kept)."""
        return str(self._tok.decode(ids, skip_special_tokens=False))

    def token_id(self, token: str) -> int:
        """The id of one token string.

        Raises:
            KeyError: unknown token.
        """
        idx = self._tok.token_to_id(token)
        if idx is None:
            raise KeyError(token)
        return int(idx)

    @property
    def vocab_size(self) -> int:
        """Number of ids including added tokens."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))


def _common_boundary(a: list[tuple[str, tuple[int, int]]], b: list[tuple[str, tuple[int, int]]]) -> int:
    """The end of the last piece up to which two piece lists agree (0 when the first pieces differ)."""
    end = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        end = x[1][1]
    return end
