"""One extension -> file rule for every command (voxcast.audio.files)."""

from __future__ import annotations

import numpy as np
import pytest

from voxcast.audio.encode import encode_file
from voxcast.audio.files import OutputFile, output_file, raw_samples
from voxcast.audio.formats import AudioFormat as F
from voxcast.audio.pcm import float_to_int16, mulaw_encode
from voxcast.errors import InvalidRequest


@pytest.mark.parametrize(
    ("name", "fmt", "rate", "want"),
    [
        ("x.wav", None, None, OutputFile(F.WAV, 24000)),
        ("x.WAV", "mulaw", 8000, OutputFile(F.MULAW, 8000)),
        ("x.aac", None, None, OutputFile(F.AAC, 24000)),
        ("x.aac", "aac", 16000, OutputFile(F.AAC, 16000)),
        ("x.ogg", None, None, OutputFile(F.OPUS, 24000)),
        ("x.pcm", None, 16000, OutputFile(F.PCM, 16000, raw=True)),
        ("x.ulaw", None, None, OutputFile(F.MULAW, 8000, raw=True)),
        ("x.alaw", "alaw", 8000, OutputFile(F.ALAW, 8000, raw=True)),
        ("x.sln", None, None, OutputFile(F.PCM, 8000, raw=True)),
        ("x.sln16", None, None, OutputFile(F.PCM, 16000, raw=True)),
        ("x.sln48", None, None, OutputFile(F.PCM, 48000, raw=True)),
        ("x.bin", "mp3", None, OutputFile(F.MP3, 24000)),
    ],
)
def test_the_extension_decides(name: str, fmt: str | None, rate: int | None, want: OutputFile) -> None:
    assert output_file(name, fmt, rate) == want


@pytest.mark.parametrize(
    ("name", "fmt", "rate", "field"),
    [
        ("x.mp3", "wav", None, "format"),
        ("x.wav", "mp3", None, "format"),
        ("x.ulaw", "alaw", None, "format"),
        ("x.sln16", None, 8000, "sample_rate"),
        ("x.ulaw", None, 16000, "sample_rate"),
        ("x.bin", None, None, "out"),
        ("x", None, None, "out"),
        ("x.wav", "nope", None, "format"),
    ],
)
def test_contradictions_are_refused_naming_the_field(
    name: str, fmt: str | None, rate: int | None, field: str
) -> None:
    with pytest.raises(InvalidRequest) as e:
        output_file(name, fmt, rate)
    assert e.value.field == field


def test_raw_samples_of_a_g711_file_are_its_data_chunk() -> None:
    pcm = np.sin(np.arange(801) / 7.0).astype(np.float32) * 0.5
    wav = encode_file(pcm, F.MULAW, 8000, input_rate=8000)
    assert raw_samples(wav, F.MULAW) == mulaw_encode(float_to_int16(pcm)).tobytes()
    assert raw_samples(b"\x01\x02", F.PCM) == b"\x01\x02"
    with pytest.raises(ValueError, match="headerless"):
        raw_samples(b"", F.MP3)
