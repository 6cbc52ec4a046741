"""Compressed reference audio cannot exhaust memory: the header is checked before decoding and the
decode stops at the longest accepted reference, whatever the header claims (issue 27 item 2)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voxcast.audio.reference import (
    MAX_CHANNELS,
    MAX_DURATION_S,
    MAX_SAMPLE_RATE,
    load_reference_audio,
    prepare_reference_audio,
)
from voxcast.errors import InvalidRequest

BOMB_MINUTES = 10
BOMB_RATE = 96_000
DECODED_BYTES = BOMB_MINUTES * 60 * BOMB_RATE * 2 * 4  # what a full float32 decode would allocate: 460 MB


def _flac_bomb(minutes: int, *, hide_length: bool = False) -> bytes:
    """Minutes of 96 kHz stereo silence: ~22 KB a minute of FLAC. ``hide_length`` zeroes STREAMINFO's
    total-samples field (allowed by the FLAC format for streams of unknown length)."""
    buf = io.BytesIO()
    block = np.zeros((BOMB_RATE * 10, 2), dtype=np.int16)
    with sf.SoundFile(buf, "w", BOMB_RATE, 2, format="FLAC", subtype="PCM_16") as f:
        for _ in range(minutes * 6):
            f.write(block)
    data = bytearray(buf.getvalue())
    if hide_length:
        # "fLaC", a 4-byte block header, then STREAMINFO: 10 bytes, then 20 bits rate, 3 channels,
        # 5 bits per sample and 36 bits of total samples in the 8 bytes at offset 18.
        fields = int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)
        data[18:26] = fields.to_bytes(8, "big")
    return bytes(data)


@pytest.fixture(scope="module", params=[False, True], ids=["declared-length", "hidden-length"])
def bomb(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bomb") / "bomb.flac"
    path.write_bytes(_flac_bomb(BOMB_MINUTES, hide_length=request.param))
    return path


def test_the_bomb_is_what_the_issue_describes(bomb: Path) -> None:
    assert bomb.stat().st_size < 1_000_000  # passes any request size limit
    with sf.SoundFile(bomb) as f:
        assert f.samplerate == BOMB_RATE and f.channels == 2


def test_a_flac_bomb_is_refused_without_decoding_it(bomb: Path) -> None:
    """In a fresh process, so the peak resident size belongs to this decode alone."""
    script = textwrap.dedent(
        f"""
        import json, resource, sys
        from voxcast.audio.reference import load_reference_audio
        from voxcast.errors import InvalidRequest
        data = open({str(bomb)!r}, "rb").read()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            load_reference_audio(data)
            out = {{"error": None}}
        except InvalidRequest as e:
            out = {{"error": str(e), "field": e.field}}
        out["grew_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(json.dumps(out))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["field"] == "ref_audio" and "too long" in out["error"]
    # at most one 30 s mono copy (11.5 MB at 96 kHz) plus a decode block, far from the 460 MB a full decode takes
    assert out["grew_kb"] * 1024 < DECODED_BYTES / 10, out


def test_a_declared_length_is_refused_from_the_header_and_a_hidden_one_by_the_decode() -> None:
    with pytest.raises(InvalidRequest, match=r"600.0 s declared"):
        load_reference_audio(_flac_bomb(BOMB_MINUTES))
    with pytest.raises(InvalidRequest, match=r"more than 30 s"):
        load_reference_audio(_flac_bomb(1, hide_length=True))


def _wav(seconds: float, sr: int, channels: int) -> bytes:
    t = np.arange(round(seconds * sr)) / sr
    tone = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(
        buf,
        np.stack([tone * (1 + 0.1 * c) for c in range(channels)], axis=1),
        sr,
        format="WAV",
        subtype="FLOAT",
    )
    return buf.getvalue()


@pytest.mark.parametrize(
    ("sr", "channels", "match"),
    [(MAX_SAMPLE_RATE * 2, 1, "sample rate"), (16_000, MAX_CHANNELS + 1, "channels")],
)
def test_header_limits_name_the_field(sr: int, channels: int, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match) as e:
        load_reference_audio(_wav(2.0, sr, channels))
    assert e.value.field == "ref_audio"


@pytest.mark.parametrize(("sr", "channels"), [(96_000, 2), (44_100, 6), (24_000, 1)])
def test_the_block_decode_equals_a_whole_file_decode(sr: int, channels: int) -> None:
    """Downmixing block by block gives the bits the whole-array mean gave (reference parity holds)."""
    data = _wav(MAX_DURATION_S - 1, sr, channels)
    whole, file_sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    np.testing.assert_array_equal(load_reference_audio(data), prepare_reference_audio(whole, file_sr))


def test_just_over_the_limit_is_refused_and_the_limit_itself_is_accepted() -> None:
    assert load_reference_audio(_wav(MAX_DURATION_S, 16_000, 1)).shape[0] == MAX_DURATION_S * 24_000
    with pytest.raises(InvalidRequest, match="too long"):
        load_reference_audio(_wav(MAX_DURATION_S + 0.01, 16_000, 1))
