"""What an engine stream yields."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["AudioChunk"]


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """A piece of generated audio, final as soon as it is emitted.

    Attributes:
        seq: 0-based chunk number within the stream.
        pcm: mono float32 samples in [-1, 1] at ``sample_rate`` (native rate; adapters resample).
        sample_rate: samples per second of ``pcm``.
        frames: model frames this chunk's audio came from (Qwen3-TTS: codec frames of 80 ms;
            Chatterbox Turbo: speech tokens of 40 ms, counted in the chunk that brings their audio).
        t_emit: ``time.perf_counter()`` when the chunk was ready.
    """

    seq: int
    pcm: np.ndarray
    sample_rate: int
    frames: int
    t_emit: float

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / self.sample_rate
