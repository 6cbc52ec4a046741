"""Names shared by the job functions, the fanned-out library jobs and the client: the dotted names of
the library's chunk and final-step functions, and the cancel flag's Redis key."""

from __future__ import annotations

__all__ = ["CANCEL_KEY_PREFIX", "PRERENDER_CHUNK", "PRERENDER_FINISH", "cancel_key"]

PRERENDER_CHUNK = "voxcast.serving.rq.jobs.prerender_chunk"
PRERENDER_FINISH = "voxcast.serving.rq.jobs.prerender_finish"

CANCEL_KEY_PREFIX = "voxcast:cancel:"


def cancel_key(job_id: str) -> str:
    """The Redis key whose existence asks job ``job_id`` (or a library job's every chunk) to stop."""
    return CANCEL_KEY_PREFIX + job_id
