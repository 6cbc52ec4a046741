"""The watermark on stored renders (``VOXCAST_WATERMARK``): which one, and how a finished stream's
audio is marked before it is stored.

A watermark spans a whole utterance, so it cannot be put on audio already streamed: a live stream
goes out unmarked while the copy voxcast stores (``renders/``, the audio cache, prerendered prompt
libraries) is marked. ``perth`` is Resemble AI's Perth watermark, the one the official Chatterbox
puts on every output (:mod:`voxcast.watermark.perth`); ``off`` is the default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from voxcast.audio.encode import StreamEncoder, stream_to_file
from voxcast.audio.formats import AudioFormat
from voxcast.envvars import env_str
from voxcast.watermark.perth import PerthWatermarker

__all__ = ["WATERMARKS", "load_watermarker", "mark_file", "watermark_from_env"]

WATERMARKS = ("off", "perth")


def watermark_from_env(env: Mapping[str, str]) -> tuple[str, str | None]:
    """(``VOXCAST_WATERMARK``: off | perth, default off; ``VOXCAST_WATERMARK_MODEL``: the weights'
    folder or file, default the installed resemble-perth package's).

    Raises:
        ValueError: an unknown watermark, naming the variable.
    """
    kind = (env_str(env, "VOXCAST_WATERMARK") or "off").lower()
    if kind not in WATERMARKS:
        raise ValueError(f"VOXCAST_WATERMARK={kind!r} is not one of {', '.join(WATERMARKS)}")
    return kind, env_str(env, "VOXCAST_WATERMARK_MODEL")


def load_watermarker(kind: str, path: str | None = None) -> PerthWatermarker | None:
    """The watermarker for ``kind`` (None for ``off``).

    Raises:
        CheckpointError: ``perth`` without its weights.
    """
    return PerthWatermarker.load(path) if kind == "perth" else None


def mark_file(
    watermarker: PerthWatermarker,
    pcm: Sequence[np.ndarray],
    input_rate: int,
    format: AudioFormat,
    sample_rate: int,
) -> bytes:
    """The complete file in ``format`` at ``sample_rate`` of the marked concatenation of ``pcm``
    (float32 chunks at ``input_rate``, as the engine emitted them)."""
    audio = np.concatenate(pcm) if pcm else np.zeros(0, dtype=np.float32)
    marked = watermarker.apply(audio, input_rate)
    encoder = StreamEncoder(format, sample_rate, input_rate=input_rate)
    body = encoder.encode(marked) + encoder.finish()
    return stream_to_file(format, sample_rate, body, encoder.samples)
