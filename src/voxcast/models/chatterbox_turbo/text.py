"""Turbo's text side: the official punctuation clean-up (``punc_norm``) and its GPT-2 byte-level BPE.

The checkpoint's tokenizer files are read with the ``tokenizers`` library (``transformers`` is not
needed at run time): ``tokenizer.json`` as it is where the folder has one, else ``vocab.json`` +
``merges.txt`` with GPT-2's pipeline (byte-level pre-tokenizer with GPT-2's regex, no normaliser) and
the added tokens of ``tokenizer_config.json`` / ``added_tokens.json`` (the paralinguistic tags such as
``[laugh]`` are added tokens: they pass through as one id each). ``transformers``' ``GPT2TokenizerFast``
adds no start or end token, and neither does :meth:`TurboTokenizer.encode`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from voxcast.errors import CheckpointError

__all__ = ["TurboTokenizer", "punc_norm"]

#: What the official ``punc_norm`` says for empty text.
EMPTY_TEXT = "You need to add some text for me to talk."
_REPLACE = (
    ("…", ", "),
    (":", ","),
    ("—", "-"),
    ("–", "-"),
    (" ,", ","),
    ("“", '"'),
    ("”", '"'),
    ("‘", "'"),
    ("’", "'"),
)
_ENDERS = (".", "!", "?", "-", ",")


def punc_norm(text: str) -> str:
    """The official ``tts_turbo.punc_norm``: capitalise the first letter, collapse whitespace, replace
    LLM punctuation (ellipsis, colon, dashes, curly quotes), end with a full stop if no punctuation."""
    if not text:
        return EMPTY_TEXT
    if text[0].islower():
        text = text[0].upper() + text[1:]
    text = " ".join(text.split())
    for old, new in _REPLACE:
        text = text.replace(old, new)
    text = text.rstrip(" ")
    if not text.endswith(_ENDERS):
        text += "."
    return text


def _added_tokens(root: Path) -> dict[int, tuple[str, bool]]:
    """id -> (content, special) from ``tokenizer_config.json`` and ``added_tokens.json``."""
    added: dict[int, tuple[str, bool]] = {}
    config = root / "tokenizer_config.json"
    if config.is_file():
        for i, t in (
            json.loads(config.read_text(encoding="utf-8")).get("added_tokens_decoder") or {}
        ).items():
            added[int(i)] = (str(t["content"]), bool(t.get("special", False)))
    extra = root / "added_tokens.json"
    if extra.is_file():
        for content, i in json.loads(extra.read_text(encoding="utf-8")).items():
            added.setdefault(int(i), (str(content), False))
    return added


class TurboTokenizer:
    """Text -> GPT-2 token ids (after :func:`punc_norm`, which the caller applies)."""

    def __init__(self, backend: Tokenizer) -> None:
        self._tok = backend

    @property
    def vocab_size(self) -> int:
        """Ids in use, added tokens included."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @classmethod
    def from_dir(cls, path: str | Path) -> TurboTokenizer:
        """Load from a checkpoint folder (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``).

        Raises:
            CheckpointError: no tokenizer files, or files that cannot be read.
        """
        root = Path(path)
        if (root / "tokenizer.json").is_file():
            try:
                return cls(Tokenizer.from_file(str(root / "tokenizer.json")))
            except Exception as e:  # tokenizers raises plain Exception for a malformed file
                raise CheckpointError(f"{root}: cannot read tokenizer.json: {e}") from e
        if not ((root / "vocab.json").is_file() and (root / "merges.txt").is_file()):
            raise CheckpointError(f"{root}: no tokenizer.json, nor vocab.json + merges.txt")
        try:
            vocab = json.loads((root / "vocab.json").read_text(encoding="utf-8"))
            merges = []
            for line in (root / "merges.txt").read_text(encoding="utf-8").splitlines():
                if line and not line.startswith("#version"):
                    a, _, b = line.partition(" ")
                    merges.append((a, b))
            added = _added_tokens(root)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{root}: cannot read the tokenizer: {e}") from e
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        for idx in sorted(added):
            content, special = added[idx]
            token = AddedToken(content, special=special, normalized=not special)
            (tok.add_special_tokens if special else tok.add_tokens)([token])
            if tok.token_to_id(content) != idx:
                raise CheckpointError(f"{root}: added token {content!r} does not get its id {idx}")
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no start or end token)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)
