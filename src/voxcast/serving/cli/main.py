"""The ``voxcast`` command: one entry point, one module per group of subcommands.

Subcommand modules expose ``add_parsers(subparsers)`` and set ``func`` on their parsers; a module
that is not importable (e.g. serving extras not installed) simply contributes no commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

__all__ = ["main"]

_MODULES = (
    "voxcast.serving.cli.synth",
    "voxcast.serving.cli.testmodel",
    "voxcast.serving.cli.queue",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxcast", description="Streaming text-to-speech serving.")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            logging.getLogger(__name__).debug("commands of %s unavailable: %s", name, e)
            continue
        add = getattr(module, "add_parsers", None) or module.add_parser
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
