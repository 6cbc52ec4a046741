"""The code blocks of the README and docs/, as the docs tests run them.

A fenced block whose info string is ``python``, ``bash`` or ``sh`` is run unless the line before it
(blank lines aside) is a marker ``<!-- docs-test: skip (why) -->``; other blocks (layouts, JSON
samples) are text. A marker ``<!-- docs-test: env NAME=value ... -->`` runs the block with those
environment variables (what the prose around it tells the reader to set). Checkpoint names in a
block and in its environment are replaced by tiny random-weight checkpoints of the same kind
(:data:`CHECKPOINT_NAMES`), so every block runs offline on the CPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHECKPOINT_NAMES", "RUN_LANGS", "Block", "checkpoint_kind", "doc_files", "read_blocks"]

REPO = Path(__file__).resolve().parents[2]

RUN_LANGS = frozenset({"python", "bash", "sh"})
"""Languages of the blocks that are run."""

CHECKPOINT_NAMES = re.compile(
    r"[\w./-]*/Qwen3-TTS-12Hz-[\d.]+B-(?P<qwen>CustomVoice|Base)\b|[\w.-]+/chatterbox-turbo(?![\w.])"
)
"""Checkpoint names in the docs (a hub id or a folder of one): each stands for a tiny checkpoint of
its kind (:func:`checkpoint_kind`); ``docs/chatterbox-turbo.md`` is a page, not one."""
_KINDS = {"CustomVoice": "custom_voice", "Base": "base", None: "chatterbox_turbo"}


def checkpoint_kind(name: re.Match[str]) -> str:
    """The kind of tiny checkpoint that stands in for a :data:`CHECKPOINT_NAMES` match."""
    return _KINDS[name.group("qwen")]


_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")
_SKIP = re.compile(r"^skip\s*\((.+)\)$")
_ENV = re.compile(r"^env((?:\s+[A-Z_][A-Z0-9_]*=\S+)+)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its text and why it is skipped (if it is)."""

    path: Path
    line: int
    lang: str
    source: str
    skip: str | None
    env: dict[str, str]

    @property
    def name(self) -> str:
        """``README.md:64``: where the block starts (the line of its opening fence)."""
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGS and self.skip is None


def doc_files() -> list[Path]:
    """The README and every page under docs/ (not the monitoring configs)."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def read_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip, env = _marker(before.strip(), f"{path.name}:{i + 1}")
        source = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(path, i + 1, fence.group(1), source, skip, env))
        i = end + 1
    return blocks


def _marker(line: str, where: str) -> tuple[str | None, dict[str, str]]:
    """``(skip reason, environment)`` from the line before a block.

    Raises:
        ValueError: a ``docs-test`` marker that is neither form (a typo would silently run or skip).
    """
    marker = _MARKER.match(line)
    if marker is None:
        return None, {}
    if skip := _SKIP.match(marker.group(1)):
        return skip.group(1), {}
    if env := _ENV.match(marker.group(1)):
        return None, dict(pair.split("=", 1) for pair in env.group(1).split())
    raise ValueError(f"{where}: not a docs-test marker: {line!r} (skip (why) or env NAME=value)")
