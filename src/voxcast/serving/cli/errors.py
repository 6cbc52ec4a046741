"""How a ``voxcast`` command ends on an error: one line, an exit code (see :func:`voxcast.serving.cli.main.main`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxcast.errors import INPUT_ERROR_CODES, InvalidRequest, VoxcastError

__all__ = ["INSTALL_HINT", "CommandError", "describe", "exit_code_of", "with_field"]


class CommandError(Exception):
    """``voxcast`` prints ``error: <message>`` and exits with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


INSTALL_HINT = (
    "install voxcast with its dependencies (pip install -e '.[serve]' from a clone), or, for the queue "
    "client commands alone, pip install -r requirements-client.txt (docs/queue.md)"
)


def describe(e: Exception) -> tuple[int, str]:
    """(exit code, one-line message) of an error that ended a command."""
    if isinstance(e, CommandError):
        return e.code, str(e)
    if isinstance(e, VoxcastError):
        return (2 if isinstance(e, InvalidRequest) else 1), with_field(e.field, e.message)
    if type(e).__module__.split(".")[0] == "redis":  # redis is an optional extra
        return 1, f"Redis: {type(e).__name__}: {e}"
    if isinstance(e, ModuleNotFoundError) and e.name:  # a client-only install running a model command
        return 1, f"this command needs the package {e.name!r}, not installed: {INSTALL_HINT}"
    if isinstance(e, FileNotFoundError):
        return 2, f"no such file: {e.filename}" if e.filename else str(e)
    if isinstance(e, (OSError, ValueError)):
        return 2, f"{e}"
    return 1, f"{type(e).__name__}: {e}"


def with_field(field: str | None, message: str) -> str:
    """``field: message``, the field named once (schema messages already start with it)."""
    return f"{field}: {message}" if field and not message.startswith(f"{field}:") else message


def exit_code_of(error: Mapping[str, Any] | None) -> int:
    """Exit code of a job that ended with the structured ``error`` (``{"code", "message", "field"}``):
    2 when it blames the input (a worker found the voice unknown, the audio unreadable), else 1."""
    return 2 if error is not None and error.get("code") in INPUT_ERROR_CODES else 1
