"""The sampling settings of one request: plain pydantic, no torch.

They live apart from :mod:`voxcast.models.base` (which needs torch) so that the request schema, and
with it the queue client and the ``voxcast`` queue commands, import without torch: a client that
only enqueues jobs needs neither torch nor a model.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SamplingParams"]


class SamplingParams(BaseModel):
    """Sampling settings of one request (official Qwen3-TTS defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(0.9, gt=0.0, le=2.0)
    top_k: int = Field(50, ge=0, le=4096, description="0 disables top-k")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.05, ge=1.0, le=2.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1, description="fixed seed: reproducible output")
    greedy: bool = Field(False, description="argmax decoding (ignores temperature/top-k/top-p)")
