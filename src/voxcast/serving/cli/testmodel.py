"""``voxcast make-test-model``: write a random-weight checkpoint in the official layout.

For tests, demos and benchmarks without downloading weights. Qwen3-TTS (``--kind base``,
``custom_voice``, ``voice_design``): ``--size tiny`` (a few tens of MB, built in seconds) or the real
shapes ``0.6b`` / ``1.7b`` (bf16, GBs). Chatterbox Turbo (``--kind chatterbox_turbo``): ``--size tiny``
or ``full`` (the published sizes, ~3 GB), with a built-in voice (``conds.pt``) and a stop bias so that
sampled speech ends. Every CLI option has an environment variable (``VOXCAST_TESTMODEL_KIND``,
``..._SIZE``, ``..._OUT``, ``..._SEED``).

The kinds, sizes and builders are those the model families register
(:attr:`voxcast.models.family.ModelFamily.test_checkpoints`), so a family added to the registry (or
named in ``VOXCAST_FAMILIES``) is built here too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxcast.models import registry

if TYPE_CHECKING:
    from voxcast.models.base import ModelFamily, TestCheckpoints

__all__ = ["add_parser", "add_parsers", "builders", "run"]


def builders() -> dict[str, tuple[ModelFamily, TestCheckpoints]]:
    """``--kind`` -> the family that builds it and how (family descriptors only: no torch).

    Raises:
        ValueError: ``VOXCAST_FAMILIES`` names a module that is no model family.
    """
    registry.register_from_env(os.environ)
    return _registered()


def _registered() -> dict[str, tuple[ModelFamily, TestCheckpoints]]:
    return {
        kind: (f, f.test_checkpoints)
        for f in registry.families()
        if f.test_checkpoints is not None
        for kind in f.test_checkpoints.kinds
    }


def add_parser(sub: Any) -> None:
    """Register ``make-test-model`` on an ``argparse`` subparsers object."""
    env = os.environ
    try:
        kinds = builders()
    except ValueError:  # a bad VOXCAST_FAMILIES: every command's parser (and --help) is built here;
        kinds = _registered()  # the commands that read it (this one's run) report it, exit 2
    sizes = "; ".join(f"{k}: {', '.join(tc.sizes)}" for k, (_, tc) in kinds.items())
    p = sub.add_parser("make-test-model", help="write a random-weight checkpoint (official layout)")
    p.add_argument(
        "--kind",
        choices=tuple(kinds),
        default=env.get("VOXCAST_TESTMODEL_KIND", "custom_voice"),
        help="model type (env VOXCAST_TESTMODEL_KIND; default custom_voice)",
    )
    p.add_argument(
        "--size",
        choices=tuple(dict.fromkeys(size for _, tc in kinds.values() for size in tc.sizes)),
        default=env.get("VOXCAST_TESTMODEL_SIZE", "tiny"),
        help=f"per kind: {sizes} (env VOXCAST_TESTMODEL_SIZE; default tiny)",
    )
    p.add_argument(
        "--out",
        default=env.get("VOXCAST_TESTMODEL_OUT"),
        required="VOXCAST_TESTMODEL_OUT" not in env,
        help="output folder, must not exist or be empty (env VOXCAST_TESTMODEL_OUT)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=int(env.get("VOXCAST_TESTMODEL_SEED", "0")),
        help="weights seed (env VOXCAST_TESTMODEL_SEED; default 0)",
    )
    p.add_argument(
        "--ends-speech",
        action="store_true",
        help="a tiny checkpoint whose speech ends by itself (end-of-speech drawn within a few seconds, "
        "as a real model's would; the demo uses it). Default: tiny checkpoints run to their frame limit, "
        "which tests rely on",
    )
    p.set_defaults(func=run)


add_parsers = add_parser


def run(args: argparse.Namespace) -> int:
    """Build the checkpoint; prints its path. Returns the exit code."""
    t0 = time.perf_counter()
    try:
        out = build(Path(args.out), args.kind, args.size, args.seed, ends_speech=args.ends_speech)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{out} ({args.size} {args.kind}, seed {args.seed}, {time.perf_counter() - t0:.1f} s)")
    return 0


def build(out: Path, kind: str, size: str, seed: int = 0, *, ends_speech: bool = False) -> Path:
    """Write a random-weight checkpoint of ``kind`` and ``size`` with its family's builder.

    Raises:
        ValueError: an unknown kind, a size its family does not build, or ``out`` not empty.
    """
    kinds = builders()
    if kind not in kinds:
        raise ValueError(f"--kind {kind} is no family's test checkpoint ({', '.join(kinds)})")
    family, tc = kinds[kind]
    if size not in tc.sizes:
        raise ValueError(f"--size {size} is not a {family.name} size ({', '.join(tc.sizes)})")
    module, _, name = tc.builder.partition(":")
    make = getattr(importlib.import_module(module), name)
    return Path(make(out, kind, size, seed=seed, ends_speech=ends_speech))
