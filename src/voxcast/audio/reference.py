"""Reference audio for voice cloning: decode, downmix, resample to 24 kHz, validate.

Any container libsndfile reads (WAV, FLAC, OGG/Vorbis, OGG/Opus, MP3, AIFF, ...) is accepted.
Channels are averaged (as the official wrapper does). Other rates are resampled with soxr at
"HQ" quality and the length fixed to ``ceil(n * (24000 / sr))`` (float quotient): this is exactly what the official
wrapper's ``librosa.resample`` does by default (``res_type="soxr_hq"``, ``fix=True``), so reference
codes and x-vectors match the official ones for any input rate, not only 24 kHz.

Decoding is bounded: the header's rate, channel count and declared length are checked before a
sample is decoded, blocks are downmixed as they are read and decoding stops past ``MAX_DURATION_S``,
so a small compressed file that declares an hour of 96 kHz audio costs neither memory nor time.

Limits are documented constants; every rejection is an
:class:`~voxcast.errors.InvalidRequest` with ``field="ref_audio"``.
"""

from __future__ import annotations

import io
import logging
import math
import re
from pathlib import Path

import numpy as np
import soundfile as sf

from voxcast.audio.resample import resample_fixed
from voxcast.errors import InvalidRequest
from voxcast.memory import trim_heap

__all__ = [
    "MAX_CHANNELS",
    "MAX_DURATION_S",
    "MAX_SAMPLE_RATE",
    "MIN_DURATION_S",
    "SAMPLE_RATE",
    "SILENCE_PEAK",
    "load_reference_audio",
    "prepare_reference_audio",
    "synthetic_reference_audio",
]

logger = logging.getLogger(__name__)

#: Rate of the speech tokenizer and speaker encoder.
SAMPLE_RATE = 24000
#: Shortest accepted reference (seconds). Shorter clips give unreliable x-vectors and ICL prompts.
MIN_DURATION_S = 1.0
#: Longest accepted reference (seconds). Longer clips only grow the prompt (12.5 frames per second).
MAX_DURATION_S = 30.0
#: A clip whose absolute peak stays below this (about -80 dBFS) counts as silent.
SILENCE_PEAK = 1e-4
#: Largest accepted encoded input (bytes), checked before decoding.
MAX_INPUT_BYTES = 64 * 1024 * 1024

_FIELD = "ref_audio"


#: Highest accepted sample rate (Hz) and channel count, checked from the header before decoding.
MAX_SAMPLE_RATE = 192_000
MAX_CHANNELS = 8
#: Frames decoded per block: each block is downmixed at once, so decoding holds one mono copy.
_BLOCK_FRAMES = 65_536
#: After a decode that allocated more than this (bytes), free heap pages go back to the OS.
_TRIM_AFTER_BYTES = 16 * 1024 * 1024


_DECODE_ERRORS = (sf.LibsndfileError, RuntimeError, TypeError, ValueError)


def _undecodable(e: Exception) -> InvalidRequest:
    # libsndfile's reason alone: str(e) names the source, which for an upload is "<_io.BytesIO ...>"
    reason = getattr(e, "error_string", None) or _OBJECT_REPR.sub("the file", str(e))
    return InvalidRequest(
        f"reference audio could not be decoded (supported: WAV, FLAC, OGG, MP3, AIFF...): {reason}",
        field=_FIELD,
    )


_OBJECT_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


def _open(source: io.BytesIO | str) -> sf.SoundFile:
    try:
        return sf.SoundFile(source)
    except _DECODE_ERRORS as e:
        raise _undecodable(e) from e


def _check_header(f: sf.SoundFile) -> int:
    """Refuse what the header declares before decoding a sample; returns the frame budget."""
    sr, channels = int(f.samplerate), int(f.channels)
    if not 0 < sr <= MAX_SAMPLE_RATE:
        raise InvalidRequest(
            f"reference audio sample rate {sr} Hz is outside 1..{MAX_SAMPLE_RATE}", field=_FIELD
        )
    if not 0 < channels <= MAX_CHANNELS:
        raise InvalidRequest(f"reference audio has {channels} channels; at most {MAX_CHANNELS}", field=_FIELD)
    # A header may understate or omit its length (streamed FLAC, OGG, MP3 estimates), so the declared
    # length is checked here and the decode below stops at the budget whatever the header said.
    budget = math.ceil(MAX_DURATION_S * sr) + 1
    declared = int(f.frames)
    if 0 < declared < 2**62 and declared > budget:
        raise InvalidRequest(
            f"reference audio is too long ({declared / sr:.1f} s declared; at most {MAX_DURATION_S:g} s)",
            field=_FIELD,
        )
    return budget


def _read_mono(f: sf.SoundFile, budget: int) -> np.ndarray:
    """Decode block by block, downmixing each (the channel average the official wrapper takes), and
    stop past ``budget`` frames: memory stays one mono copy of at most ``MAX_DURATION_S`` seconds."""
    blocks: list[np.ndarray] = []
    total = 0
    while True:
        block = f.read(min(_BLOCK_FRAMES, budget + 1 - total), dtype="float32", always_2d=True)
        if block.shape[0] == 0:
            break
        blocks.append(block.mean(axis=1, dtype=np.float32) if block.shape[1] > 1 else block[:, 0].copy())
        total += block.shape[0]
        if total > budget:
            raise InvalidRequest(
                f"reference audio is too long (more than {MAX_DURATION_S:g} s)", field=_FIELD
            )
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)


def _decode(data: bytes | str | Path) -> tuple[np.ndarray, int, int]:
    """Decode to float32 mono, the file's rate and its channel count, within the documented limits."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
        if not raw:
            raise InvalidRequest("reference audio is empty (0 bytes)", field=_FIELD)
        if len(raw) > MAX_INPUT_BYTES:
            raise InvalidRequest(f"reference audio is larger than {MAX_INPUT_BYTES} bytes", field=_FIELD)
        source: io.BytesIO | str = io.BytesIO(raw)
    else:
        path = Path(data)
        if not path.is_file():
            raise InvalidRequest(f"reference audio file not found: {path}", field=_FIELD)
        if path.stat().st_size == 0:
            raise InvalidRequest("reference audio is empty (0 bytes)", field=_FIELD)
        source = str(path)
    with _open(source) as f:
        budget = _check_header(f)
        try:
            mono = _read_mono(f, budget)
        except _DECODE_ERRORS as e:
            raise _undecodable(e) from e
        finally:
            if f.tell() * 4 * int(f.channels) > _TRIM_AFTER_BYTES:  # what was decoded, not the limit
                trim_heap(collect=False)
        return mono, int(f.samplerate), int(f.channels)


def _resample(wav: np.ndarray, sr: int) -> np.ndarray:
    """Resample mono float32 audio to 24 kHz as ``librosa.resample(res_type="soxr_hq")``."""
    return resample_fixed(wav, sr, SAMPLE_RATE)


def _validate(wav: np.ndarray) -> None:
    seconds = wav.shape[0] / SAMPLE_RATE
    if wav.shape[0] == 0:
        raise InvalidRequest("reference audio contains no samples", field=_FIELD)
    if not np.isfinite(wav).all():
        raise InvalidRequest("reference audio contains NaN or infinite samples", field=_FIELD)
    if seconds < MIN_DURATION_S:
        raise InvalidRequest(
            f"reference audio is too short ({seconds:.2f} s; at least {MIN_DURATION_S:g} s)", field=_FIELD
        )
    if seconds > MAX_DURATION_S:
        raise InvalidRequest(
            f"reference audio is too long ({seconds:.1f} s; at most {MAX_DURATION_S:g} s)", field=_FIELD
        )
    if float(np.max(np.abs(wav))) < SILENCE_PEAK:
        raise InvalidRequest("reference audio is silent", field=_FIELD)


def prepare_reference_audio(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Downmix, resample and validate an already decoded waveform.

    Args:
        audio: samples [n] or [n, channels] (channels last, as soundfile returns them).
        sample_rate: rate of ``audio`` in Hz.

    Returns:
        float32 mono waveform at 24 kHz.

    Raises:
        InvalidRequest: (field "ref_audio") bad rate, empty, non-finite, silent, too short or too long.
    """
    if sample_rate <= 0:
        raise InvalidRequest(f"invalid reference audio sample rate {sample_rate}", field=_FIELD)
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim == 2:
        wav = np.mean(wav, axis=-1) if wav.shape[1] > 1 else wav[:, 0]
    elif wav.ndim != 1:
        raise InvalidRequest(f"reference audio has shape {wav.shape}; expected [n] or [n, ch]", field=_FIELD)
    if wav.shape[0] == 0:
        raise InvalidRequest("reference audio contains no samples", field=_FIELD)
    if wav.shape[0] / sample_rate > 2 * MAX_DURATION_S:  # reject before spending time resampling
        raise InvalidRequest(
            f"reference audio is too long ({wav.shape[0] / sample_rate:.1f} s; at most {MAX_DURATION_S:g} s)",
            field=_FIELD,
        )
    wav = _resample(np.ascontiguousarray(wav, dtype=np.float32), int(sample_rate))
    _validate(wav)
    return wav


def load_reference_audio(data: bytes | str | Path) -> np.ndarray:
    """Decode reference audio from encoded bytes or a file path into float32 mono 24 kHz samples.

    Args:
        data: the encoded file (bytes) or a path to it.

    Returns:
        float32 waveform [n] at 24 kHz, ``MIN_DURATION_S <= n / 24000 <= MAX_DURATION_S``.

    Raises:
        InvalidRequest: (field "ref_audio") empty, undecodable, silent, too short or too long.
    """
    mono, sr, channels = _decode(data)
    wav = prepare_reference_audio(mono, sr)
    logger.debug(
        "reference audio: %d Hz x %d ch -> %.2f s at 24 kHz", sr, channels, wav.shape[0] / SAMPLE_RATE
    )
    return wav


def synthetic_reference_audio(sample_rate: int, seconds: float = 2.0) -> np.ndarray:
    """A deterministic voiced-like reference recording: harmonics of 140 Hz under a slow envelope.

    Float32 mono, peak 0.3. Warm-up clones a voice from it (no recording ships with voxcast), and
    tests and benchmarks use it wherever any valid reference will do.
    """
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    f0 = 140.0
    sig = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 8))
    env = 0.5 * (1 - np.cos(2 * np.pi * t / seconds))
    return (0.3 * env * sig / np.max(np.abs(sig))).astype(np.float32)
