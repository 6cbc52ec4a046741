"""Per-request timing, as data.

Field names carry their units. ``stalls`` are computed the way a listener hears them: playback starts
when the first chunk arrives and plays continuously; whenever the next chunk arrives after the audio
already received has run out, that is a stall of the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Timing", "playback_stalls"]


def playback_stalls(emits_s: Sequence[float], durations_s: Sequence[float]) -> tuple[int, float]:
    """Count and total length of playback stalls.

    Args:
        emits_s: arrival time of each chunk (any common origin), in order.
        durations_s: audio duration of each chunk.

    Returns:
        (number of stalls, total stall seconds).
    """
    if not emits_s:
        return 0, 0.0
    play_end = emits_s[0] + durations_s[0]
    count, total = 0, 0.0
    for t, d in zip(emits_s[1:], durations_s[1:], strict=True):
        if t > play_end + 1e-9:
            count += 1
            total += t - play_end
            play_end = t + d
        else:
            play_end += d
    return count, total


@dataclass
class Timing:
    """Everything measured for one request. Times in ms unless the name says otherwise."""

    request_id: str = ""
    cold: bool = False
    load_ms: float = 0.0
    warmup_ms: float = 0.0
    queue_wait_ms: float = 0.0
    voice_ms: float = 0.0
    prompt_ms: float = 0.0
    prefill_ms: float = 0.0
    ttfa_ms: float = 0.0
    talker_ms: float = 0.0
    code_predictor_ms: float = 0.0
    codec_ms: float = 0.0
    total_ms: float = 0.0
    frames: int = 0
    chunks: int = 0
    audio_s: float = 0.0
    rtf: float = 0.0
    stalls: int = 0
    stall_ms: float = 0.0
    runaway: bool = False
    finish_reason: str = ""
    cache_hit: bool = False
    voice_cache_hit: bool | None = None
    #: The prompt's constant prefix came from the per-voice key/value cache (None: not cacheable/off).
    prefix_cache_hit: bool | None = None
    #: Prompt positions that hit skipped.
    prefix_positions: int = 0
    #: Parts the prefill ran in (more than 1 when it was interleaved with other streams' frames).
    prefill_parts: int = 0
    #: Pieces a long text was spoken in (1: the whole text at once); per piece, when more than one:
    #: ``extra["pieces"]`` (characters, frames, finish reason, prefill ms, prefilled ahead or not).
    pieces: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def frame_ms(self) -> float:
        """Mean generation time per frame (talker + code predictor), excluding the codec."""
        return (self.talker_ms + self.code_predictor_ms) / self.frames if self.frames else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, rounded to 0.01 ms."""
        out = asdict(self)
        out["frame_ms"] = self.frame_ms
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
