"""The watermark on stored renders (``VOXCAST_WATERMARK``): which one, and how a finished stream's
audio is marked before it is stored.

A watermark spans a whole utterance, so it cannot be put on audio while it is generated: a live
stream goes out unmarked while the copy voxcast stores (``renders/``, the audio cache, prerendered
prompt libraries) and a render returned whole are marked; a cache hit streams that stored, marked
copy. ``perth`` is Resemble AI's Perth watermark, the one the official Chatterbox puts on every
output (:mod:`voxcast.watermark.perth`); ``off`` is the default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from voxcast.audio.encode import StreamEncoder, stream_to_file
from voxcast.audio.formats import AudioFormat
from voxcast.envvars import env_str
from voxcast.watermark.perth import PerthWatermarker

__all__ = ["WATERMARKS", "check_watermark", "load_watermarker", "mark", "mark_file", "watermark_from_env"]

WATERMARKS = ("off", "perth")


def watermark_from_env(env: Mapping[str, str]) -> tuple[str, str | None]:
    """(``VOXCAST_WATERMARK``: off | perth, default off; ``VOXCAST_WATERMARK_MODEL``: the weights'
    folder or file, default the installed resemble-perth package's).

    Raises:
        ValueError: an unknown watermark, naming the variable.
    """
    kind = (env_str(env, "VOXCAST_WATERMARK") or "off").lower()
    return check_watermark(kind, "VOXCAST_WATERMARK"), env_str(env, "VOXCAST_WATERMARK_MODEL")


def check_watermark(kind: str, name: str = "watermark") -> str:
    """``kind`` when it is one of :data:`WATERMARKS`.

    Raises:
        ValueError: naming ``name`` (the setting) and the choices.
    """
    if kind not in WATERMARKS:
        raise ValueError(f"{name}={kind!r} is not one of {', '.join(WATERMARKS)}")
    return kind


def load_watermarker(kind: str, path: str | None = None) -> PerthWatermarker | None:
    """The watermarker for ``kind`` (None for ``off``).

    Raises:
        ValueError: an unknown kind.
        CheckpointError: ``perth`` without its weights.
    """
    return PerthWatermarker.load(path) if check_watermark(kind) == "perth" else None


def mark(watermarker: PerthWatermarker, audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """``audio`` marked, float32, as long as it was: the watermarker's output (up to one 10 ms hop
    shorter, as upstream's) followed by zeros, so durations and sample counts stay what the stream
    reported."""
    marked = watermarker.apply(audio, sample_rate)
    if len(marked) < len(audio):
        marked = np.concatenate([marked, np.zeros(len(audio) - len(marked), dtype=np.float32)])
    return marked


def mark_file(
    watermarker: PerthWatermarker,
    pcm: Sequence[np.ndarray],
    input_rate: int,
    format: AudioFormat,
    sample_rate: int,
) -> bytes:
    """The complete file in ``format`` at ``sample_rate`` of the marked concatenation of ``pcm``
    (float32 chunks at ``input_rate``, as the engine emitted them; :func:`mark`)."""
    audio = np.concatenate(pcm) if pcm else np.zeros(0, dtype=np.float32)
    marked = mark(watermarker, audio, input_rate)
    encoder = StreamEncoder(format, sample_rate, input_rate=input_rate)
    body = encoder.encode(marked) + encoder.finish()
    return stream_to_file(format, sample_rate, body, encoder.samples)
