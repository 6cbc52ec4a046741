"""The ``voxcast`` command: one entry point, one module per group of subcommands.

Subcommand modules expose ``add_parsers(subparsers)`` and set ``func`` on their parsers; a module
that is not importable (e.g. serving extras not installed) simply contributes no commands.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from voxcast.logs import redact, setup_logging
from voxcast.serving.cli.errors import describe

__all__ = ["main"]

_MODULES = (
    "voxcast.serving.cli.synth",
    "voxcast.serving.cli.testmodel",
    "voxcast.serving.cli.kernels",
    "voxcast.serving.cli.queue",
    "voxcast.serving.cli.store",
    "voxcast.serving.cli.voices",
    "voxcast.serving.http.main",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxcast", description="Streaming text-to-speech serving.")
    parser.add_argument("--log-level", help="logging level (default: VOXCAST_LOG_LEVEL or INFO)")
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


#: Exit code of a command whose standard output was closed early (128 + SIGPIPE, as a shell reports).
_SIGPIPE_EXIT = 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail again
    (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code.

    Exit codes: 0 success; 1 the work failed (a failed job, a service that cannot be reached); 2 bad
    input (arguments, request fields, files); 3 a prerender finished with failed prompts; 130
    interrupted; 141 the reader of standard output went away (``voxcast status JOB | head -1``: the
    shell's code for a pipe closed early, and nothing printed about it). Errors are one line on stderr (credentials in URLs redacted), never a traceback,
    unless ``--log-level DEBUG``.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        setup_logging(args.log_level)
    except ValueError as e:
        parser.error(str(e))
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit (where Python would print it)
        return code
    except BrokenPipeError:
        _silence_stdout()
        return _SIGPIPE_EXIT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        code, message = describe(e)
        logging.getLogger(__name__).debug("command failed", exc_info=True)
        print(f"error: {redact(message)}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
