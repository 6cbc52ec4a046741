"""The exception hierarchy of voxcast.

Every error a caller can act on is a :class:`VoxcastError`. Adapters (RunPod, RQ, CLI) turn these
into structured errors with :meth:`VoxcastError.to_dict`; nothing else is matched by message.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "INPUT_ERROR_CODES",
    "Cancelled",
    "CheckpointError",
    "EngineUnavailable",
    "InvalidRequest",
    "InvalidVoicePrompt",
    "OverCapacity",
    "RequestIdInUse",
    "StorageError",
    "VoiceNotFound",
    "VoxcastError",
]


class VoxcastError(Exception):
    """Base class. ``code`` is a stable machine-readable name; ``field`` names the input at fault."""

    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description: ``{"code", "message", "field"}``."""
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


class InvalidRequest(VoxcastError):
    """The request cannot be served as given (bad text, unknown speaker, wrong mode, bad audio...)."""

    code = "invalid_request"


class VoiceNotFound(InvalidRequest):
    """A voice id that no registry knows."""

    code = "voice_not_found"


class InvalidVoicePrompt(InvalidRequest):
    """Bytes that are not a valid voxcast voice prompt (corrupt, foreign, other schema or model)."""

    code = "invalid_voice_prompt"


class RequestIdInUse(InvalidRequest):
    """A request id that names another job (a different request) that still exists."""

    code = "request_id_in_use"


class CheckpointError(VoxcastError):
    """A model directory or hub id that is missing, incomplete or of an unknown kind."""

    code = "checkpoint_error"


class StorageError(VoxcastError):
    """The blob store failed (unreachable, missing bucket, corrupt object)."""

    code = "storage_error"


class EngineUnavailable(VoxcastError):
    """The engine is not loaded, is shutting down, or its worker thread died."""

    code = "engine_unavailable"


class OverCapacity(VoxcastError):
    """One more real-time stream would not keep the running ones viable (admission control): retry
    after ``retry_after_s``, or on another instance. Only entry points that choose to be refused get
    it (HTTP, the WebSocket); queue jobs wait for room instead."""

    code = "over_capacity"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Cancelled(VoxcastError):
    """The request was cancelled by its caller."""

    code = "cancelled"


INPUT_ERROR_CODES = frozenset(
    {InvalidRequest.code, VoiceNotFound.code, InvalidVoicePrompt.code, RequestIdInUse.code}
)
"""The ``code`` of every error that blames the caller's input (an :class:`InvalidRequest`): a
command that reads such an error from a job's result exits 2, like one that finds it itself."""
