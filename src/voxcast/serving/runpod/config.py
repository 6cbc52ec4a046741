"""Settings of the RunPod serverless adapter, built from an environment mapping.

Only the adapter's own knobs live here; the model, device, storage and chunking come from the
service configuration (``voxcast.service.ServiceConfig``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from voxcast.envvars import env_bool, env_int

__all__ = [
    "DEFAULT_INLINE_MAX_BYTES",
    "DEFAULT_MAX_MESSAGE_AUDIO_BYTES",
    "MAX_MESSAGE_AUDIO_BYTES_LIMIT",
    "RunpodConfig",
]

DEFAULT_MAX_MESSAGE_AUDIO_BYTES = 192 * 1024
"""Raw audio bytes per yielded message (256 KiB once base64-encoded). RunPod's per-yield limit is
reported around 1 MB; a normal 320 ms chunk is ~15 KB of 24 kHz PCM16, so only whole-file formats
(flac, mp3, opus: one chunk at the end) are ever split."""

MAX_MESSAGE_AUDIO_BYTES_LIMIT = 512 * 1024
"""Upper bound accepted for the setting above (683 KiB of base64: still under ~1 MB)."""

DEFAULT_INLINE_MAX_BYTES = 256 * 1024
"""A non-streaming request (``stream: false``) gets its audio inline as base64 when the file is at
most this many bytes (~5 s of 24 kHz WAV); larger files are only referenced by key/URL."""

DEFAULT_QUEUE_CHUNKS = 16
"""Chunks buffered between the engine thread and the event loop before the engine thread waits."""

_bool = env_bool


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    return env_int(env, name, default, lo=lo, hi=hi)


@dataclass(frozen=True)
class RunpodConfig:
    """How the RunPod handler runs. Build with :meth:`from_env`.

    Attributes:
        concurrency: jobs this worker runs at once (``VOXCAST_RUNPOD_CONCURRENCY``, 1). Returned by
            the SDK's ``concurrency_modifier``; with > 1 the SDK takes jobs in batches and runs them
            as asyncio tasks, and the engine decodes their streams together. Keep it at or below
            the engine's ``VOXCAST_MAX_ACTIVE``.
        aggregate: ``return_aggregate_stream`` (``VOXCAST_RUNPOD_AGGREGATE``, on). On: the job's
            final ``/run``/``/runsync`` output is the list of every yielded message, base64 audio
            included, the last one the result (``done``, ``voice_id``, ``voices``): ``runsync`` and
            ``status`` answer with it. Off: clients read the messages from ``/stream/{id}`` only
            and the final output is ``[]`` (for long streamed renders: RunPod caps ``/runsync``
            output at 20 MB; the handler warns past :data:`~.handler.AGGREGATE_WARN_BYTES`).
        max_message_audio_bytes: raw audio bytes per yielded message
            (``VOXCAST_RUNPOD_MAX_MESSAGE_BYTES``, 192 KiB); bigger chunks are split.
        inline_max_bytes: largest file returned inline to a ``stream: false`` request
            (``VOXCAST_RUNPOD_INLINE_MAX_BYTES``, 256 KiB; 0 = never inline).
        queue_chunks: chunks buffered between engine thread and event loop
            (``VOXCAST_RUNPOD_QUEUE_CHUNKS``, 16).
        coalesce: when chunks are already waiting as the previous message's POST returns (the
            worker fell behind the engine), send them as one message, up to the size bound, so the
            delay does not build up chunk after chunk (``VOXCAST_RUNPOD_COALESCE``, on).
        redis_url: also publish every job's chunks to a Redis Stream keyed by the RunPod job id
            (``VOXCAST_REDIS_URL``; unset = no Redis).
        sdk_log_level: the runpod SDK's own log level (``RUNPOD_LOG_LEVEL`` / ``RUNPOD_DEBUG_LEVEL``,
            default INFO here: the SDK's DEBUG default formats every yielded message into the log).
    """

    concurrency: int = 1
    aggregate: bool = True
    max_message_audio_bytes: int = DEFAULT_MAX_MESSAGE_AUDIO_BYTES
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES
    queue_chunks: int = DEFAULT_QUEUE_CHUNKS
    coalesce: bool = True
    redis_url: str | None = None
    sdk_log_level: str = "INFO"

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not 1024 <= self.max_message_audio_bytes <= MAX_MESSAGE_AUDIO_BYTES_LIMIT:
            raise ValueError(f"max_message_audio_bytes must be in [1024, {MAX_MESSAGE_AUDIO_BYTES_LIMIT}]")
        if not 0 <= self.inline_max_bytes <= MAX_MESSAGE_AUDIO_BYTES_LIMIT:
            raise ValueError(f"inline_max_bytes must be in [0, {MAX_MESSAGE_AUDIO_BYTES_LIMIT}]")
        if self.queue_chunks < 1:
            raise ValueError("queue_chunks must be >= 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunpodConfig:
        """Build from environment variables; unset ones keep their defaults.

        Raises:
            ValueError: a variable that does not parse or is out of range (named in the message).
        """
        d = cls()
        return cls(
            concurrency=_int(env, "VOXCAST_RUNPOD_CONCURRENCY", d.concurrency, 1, 256),
            aggregate=_bool(env, "VOXCAST_RUNPOD_AGGREGATE", d.aggregate),
            max_message_audio_bytes=_int(
                env,
                "VOXCAST_RUNPOD_MAX_MESSAGE_BYTES",
                d.max_message_audio_bytes,
                1024,
                MAX_MESSAGE_AUDIO_BYTES_LIMIT,
            ),
            inline_max_bytes=_int(
                env, "VOXCAST_RUNPOD_INLINE_MAX_BYTES", d.inline_max_bytes, 0, MAX_MESSAGE_AUDIO_BYTES_LIMIT
            ),
            queue_chunks=_int(env, "VOXCAST_RUNPOD_QUEUE_CHUNKS", d.queue_chunks, 1, 4096),
            coalesce=_bool(env, "VOXCAST_RUNPOD_COALESCE", d.coalesce),
            redis_url=env.get("VOXCAST_REDIS_URL", "").strip() or None,
            sdk_log_level=(
                env.get("RUNPOD_LOG_LEVEL") or env.get("RUNPOD_DEBUG_LEVEL") or d.sdk_log_level
            ).upper(),
        )

    def concurrency_modifier(self, current: int) -> int:
        """The SDK's ``concurrency_modifier``: always the configured concurrency."""
        del current
        return self.concurrency
