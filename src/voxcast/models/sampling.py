"""The sampling settings of one request: plain pydantic, no torch.

They live apart from :mod:`voxcast.models.base` (which needs torch) so that the request schema, and
with it the queue client and the ``voxcast`` queue commands, import without torch: a client that
only enqueues jobs needs neither torch nor a model.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

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

    @field_validator("seed", "top_k", mode="before")
    @classmethod
    def _whole_number(cls, v: Any) -> Any:
        """An integer, as JSON writes one: not ``true`` (which pydantic reads as 1), not ``"7"``, not
        ``7.0`` (a CSV manifest's cells are converted by the manifest reader)."""
        if v is None or (isinstance(v, int) and not isinstance(v, bool)):
            return v
        raise ValueError(f"must be an integer, not {type(v).__name__} {v!r}"[:120])

    @field_validator("temperature", "top_p", "repetition_penalty", mode="before")
    @classmethod
    def _finite_number(cls, v: Any) -> Any:
        """A finite number (a numeric string, as a CSV cell holds, is read as one); not ``true``."""
        if isinstance(v, bool):
            raise ValueError(f"must be a number, not {v!r}")
        number = v
        if isinstance(v, str):
            try:
                number = float(v.strip())
            except ValueError:
                return v  # pydantic names it
        if isinstance(number, int | float) and not math.isfinite(number):
            raise ValueError(f"must be a finite number, not {v!r}")
        return number
