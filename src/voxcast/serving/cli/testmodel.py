"""``voxcast make-test-model``: write a random-weight checkpoint in the official layout.

For tests, demos and benchmarks without downloading weights. Qwen3-TTS (``--kind base``,
``custom_voice``, ``voice_design``): ``--size tiny`` (a few tens of MB, built in seconds) or the real
shapes ``0.6b`` / ``1.7b`` (bf16, GBs). Chatterbox Turbo (``--kind chatterbox_turbo``): ``--size tiny``
or ``full`` (the published sizes, ~3 GB), with a built-in voice (``conds.pt``) and a stop bias so that
sampled speech ends. Every CLI option has an environment variable (``VOXCAST_TESTMODEL_KIND``,
``..._SIZE``, ``..._OUT``, ``..._SEED``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

__all__ = ["KINDS", "SIZES", "add_parser", "add_parsers", "run"]

# Spelled out here so that building the parser imports no torch (``voxcast --help`` stays fast);
# tests/integration/test_model_cli.py checks they equal voxcast.testing.qwen3_tts's.
KINDS = ("base", "custom_voice", "voice_design")
SIZES = ("tiny", "tiny-1.7b", "0.6b", "1.7b")
TURBO = "chatterbox_turbo"
TURBO_SIZES = ("tiny", "full")


def add_parser(sub: Any) -> None:
    """Register ``make-test-model`` on an ``argparse`` subparsers object."""
    env = os.environ
    p = sub.add_parser("make-test-model", help="write a random-weight checkpoint (official layout)")
    p.add_argument(
        "--kind",
        choices=(*KINDS, TURBO),
        default=env.get("VOXCAST_TESTMODEL_KIND", "custom_voice"),
        help="model type (env VOXCAST_TESTMODEL_KIND; default custom_voice)",
    )
    p.add_argument(
        "--size",
        choices=tuple(dict.fromkeys((*SIZES, *TURBO_SIZES))),
        default=env.get("VOXCAST_TESTMODEL_SIZE", "tiny"),
        help="Qwen3-TTS: tiny, tiny-1.7b, 0.6b or 1.7b; Chatterbox Turbo: tiny or full "
        "(env VOXCAST_TESTMODEL_SIZE; default tiny)",
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
    from pathlib import Path

    t0 = time.perf_counter()
    try:
        if args.kind == TURBO:
            out = _make_turbo(Path(args.out), args.size, args.seed)
        else:
            from voxcast.testing.qwen3_tts import make_test_model

            out = make_test_model(
                args.out, args.kind, args.size, seed=args.seed, ends_speech=args.ends_speech
            )
    except ValueError as e:
        print(f"make-test-model: {e}", file=sys.stderr)
        return 2
    print(f"{out} ({args.size} {args.kind}, seed {args.seed}, {time.perf_counter() - t0:.1f} s)")
    return 0


def _make_turbo(out: Any, size: str, seed: int) -> Any:
    if size not in TURBO_SIZES:
        raise ValueError(f"--size {size} is not a Chatterbox Turbo size ({', '.join(TURBO_SIZES)})")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder")
    from voxcast.testing.chatterbox_turbo_layout import make_checkpoint

    return make_checkpoint(out, size, seed=seed)
