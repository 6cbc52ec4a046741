"""The requests that warm every path of a freshly loaded model.

Each path a real request can take runs once at load, so the first user pays no first-call costs
(allocator growth, kernel selection, lazy initialisation): greedy and sampled decoding, every voice
mode the model type supports, and the codec decoder at both the first and the later chunk size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from voxcast.audio.reference import synthetic_reference_audio
from voxcast.engine.active import ramp_frames
from voxcast.engine.request import SynthesisRequest

if TYPE_CHECKING:
    from voxcast.engine.engine import Engine

__all__ = ["calibration_requests", "warmup_requests"]

WARMUP_TEXT = "Hello, this is a short warm-up sentence."
REFERENCE_TEXT = "This is a reference recording."


def warmup_requests(engine: Engine) -> Iterator[tuple[SynthesisRequest, Any]]:
    """Yield (request, voice prompt or None) pairs covering the model's paths."""
    cfg = engine.config
    frames = ramp_frames(cfg.first_chunk_frames, cfg.chunk_frames)  # every chunk size the ramp uses
    base: dict[str, Any] = {"text": WARMUP_TEXT, "max_frames": frames, "request_id": "warmup"}
    # The ramp's chunk sizes need the whole ramp once (greedy); the sampled path, two frames (its
    # samplers in the talker and the code predictor run at every frame): about 1 s less on 0.6B int8.
    variants: list[dict[str, Any]] = [{"greedy": True}, {"seed": 0, "max_frames": min(2, frames)}]
    for case in engine.model.warmup_cases(synthetic_reference_audio(engine.sample_rate), REFERENCE_TEXT):
        for v in variants if case.sampled else variants[:1]:
            yield SynthesisRequest.model_validate({**base, **case.fields, **v}), case.voice


def calibration_requests(
    engine: Engine, sample: tuple[SynthesisRequest, Any] | None = None
) -> list[tuple[SynthesisRequest, Any]]:
    """The concurrent workload that ``decode_thread=auto`` times: ``min(2, max_active)`` streams.

    Each is ``sample`` (default: the first warm-up request; warm-up passes the one it already built,
    so no voice prompt is computed twice) run through the chunk ramp and two more full-size chunks
    (with the defaults 1, 1, 1, 1, 2, 3, 4, 4, 4), so most of its audio is decoded where the decode
    thread would take it.
    """
    cfg = engine.config
    frames = ramp_frames(cfg.first_chunk_frames, cfg.chunk_frames) + 2 * cfg.chunk_frames
    request, voice = sample if sample is not None else next(iter(warmup_requests(engine)))
    n = min(2, cfg.max_active)
    return [
        (request.model_copy(update={"max_frames": frames, "request_id": f"calibrate-{i}"}), voice)
        for i in range(n)
    ]
