"""The ``voxcast`` command: one entry point, one module per group of subcommands.

Subcommand modules expose ``add_parsers(subparsers)`` and set ``func`` on their parsers. A module that
is not importable (a package its commands need is not installed: a client-only install has no torch)
still lists its commands; each says what is missing and what to install, and exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from voxcast.logs import redact, setup_logging
from voxcast.serving.cli.errors import INSTALL_HINT, describe

__all__ = ["main"]

#: Each module of subcommands and the commands it adds (listed here so that a module that cannot be
#: imported still shows its commands, each saying what to install).
_MODULES: dict[str, tuple[str, ...]] = {
    "voxcast.serving.cli.synth": ("synth",),
    "voxcast.serving.cli.testmodel": ("make-test-model",),
    "voxcast.serving.cli.kernels": ("build-kernels",),
    "voxcast.serving.cli.queue": (
        "worker", "enqueue", "listen", "status", "workers", "cancel", "register-voice", "prerender",
    ),
    "voxcast.serving.cli.store": ("export",),
    "voxcast.serving.cli.voices": ("voices",),
    "voxcast.serving.http.main": ("serve",),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxcast", description="Streaming text-to-speech serving.")
    parser.add_argument("--log-level", help="logging level (default: VOXCAST_LOG_LEVEL or INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, commands in _MODULES.items():
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            logging.getLogger(__name__).debug("commands of %s unavailable: %s", name, e)
            for command in commands:
                _unavailable(sub, command, e)
            continue
        add = getattr(module, "add_parsers", None) or module.add_parser
        add(sub)
    return parser


def _unavailable(sub: Any, command: str, error: ImportError) -> None:
    """A command whose module cannot be imported: listed, and it says what is missing (exit 1)."""
    missing = error.name or str(error)
    p = sub.add_parser(command, help=f"(unavailable: needs {missing})", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def run(_: argparse.Namespace) -> int:
        print(
            f"error: voxcast {command} needs the package {missing!r}, not installed: {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 1

    p.set_defaults(func=run)


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
