"""Prompt libraries for telephony systems: each target preset's file checked as that system reads it.

Asterisk opens ``.ulaw`` / ``.alaw`` as headerless G.711 at 8 kHz and ``.sln`` / ``.sln16`` as
headerless 16-bit little-endian PCM at 8 / 16 kHz (the format is the extension; there is no header to
consult), FreeSWITCH plays 8/16 kHz PCM WAV, Twilio G.711 WAV and MP3. Each file is read back here
the way its target does: raw bytes through our G.711 decoder (checked against the official tables in
tests/unit/test_audio_pcm.py) or ``np.frombuffer('<i2')``, WAV header fields read byte by byte, the
MP3 through libsndfile. The scripted service of test_prerender_quality supplies speech-shaped audio.
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pyloudnorm
import soundfile as sf

from tests.integration.test_prerender_quality import MANIFEST, ScriptedService
from voxcast.audio.pcm import alaw_decode, int16_to_float, mulaw_decode
from voxcast.prerender.library import PrerenderJob, prerender
from voxcast.storage.base import BlobStore

TARGETS = [
    "asterisk-ulaw", "asterisk-alaw", "asterisk-sln", "asterisk-sln16",
    "freeswitch-8k", "freeswitch-16k", "twilio-wav", "twilio-mp3",
]  # fmt: skip


def _wav_fields(data: bytes) -> tuple[int, int, int, int, int]:
    """(format tag, channels, rate, bits per sample, data bytes) read as a player reads the header."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[12:16] == b"fmt "
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", data, 20)
    fmt_size = struct.unpack_from("<I", data, 16)[0]
    pos = 20 + fmt_size
    while data[pos : pos + 4] != b"data":
        pos += 8 + struct.unpack_from("<I", data, pos + 4)[0]
    return tag, channels, rate, bits, struct.unpack_from("<I", data, pos + 4)[0]


def _lufs(x: np.ndarray, rate: int) -> float:
    return float(pyloudnorm.Meter(rate).integrated_loudness(x.astype(np.float64)))


def test_every_target_preset_is_a_file_its_system_plays(local_store: BlobStore) -> None:
    service = ScriptedService(local_store)
    spec = PrerenderJob.from_payload(
        {"library": "ivr", "manifest": MANIFEST, "presets": TARGETS, "gate": False}
    )
    summary = prerender(service, spec)  # type: ignore[arg-type]
    assert summary["rendered"] == 3 and not summary["errors"]
    doc = json.loads(local_store.get_bytes("libraries/ivr/manifest.json"))
    objects = doc["prompts"]["good"]["objects"]
    files = {name: local_store.get_bytes(o["key"]) for name, o in objects.items()}
    assert {n: o["key"] for n, o in objects.items()} == {
        "asterisk-ulaw": "libraries/ivr/asterisk-ulaw/good.ulaw",
        "asterisk-alaw": "libraries/ivr/asterisk-alaw/good.alaw",
        "asterisk-sln": "libraries/ivr/asterisk-sln/good.sln",
        "asterisk-sln16": "libraries/ivr/asterisk-sln16/good.sln16",
        "freeswitch-8k": "libraries/ivr/freeswitch-8k/good.wav",
        "freeswitch-16k": "libraries/ivr/freeswitch-16k/good.wav",
        "twilio-wav": "libraries/ivr/twilio-wav/good.wav",
        "twilio-mp3": "libraries/ivr/twilio-mp3/good.mp3",
    }
    duration = doc["prompts"]["good"]["duration_s"]
    n = {8000: round(duration * 8000), 16000: round(duration * 16000)}  # samples of the prompt

    # Asterisk: no header at all; the bytes are the samples, their count the duration at the fixed rate
    decoded = {
        "asterisk-ulaw": (mulaw_decode(np.frombuffer(files["asterisk-ulaw"], np.uint8)), 8000),
        "asterisk-alaw": (alaw_decode(np.frombuffer(files["asterisk-alaw"], np.uint8)), 8000),
        "asterisk-sln": (np.frombuffer(files["asterisk-sln"], "<i2"), 8000),
        "asterisk-sln16": (np.frombuffer(files["asterisk-sln16"], "<i2"), 16000),
    }
    for name, (samples, rate) in decoded.items():
        data = files[name]
        assert data[:4] != b"RIFF" and abs(len(samples) - n[rate]) <= 1, name
        assert objects[name]["raw"] and objects[name]["sample_rate"] == rate
        x = int16_to_float(np.asarray(samples, dtype=np.int16))
        assert abs(_lufs(x, rate) - objects[name]["loudness_lufs"]) < 0.2, name  # measured = stored
        assert abs(objects[name]["loudness_lufs"] - -19.0) < 1.5 and np.abs(x).max() < 1.0, name
    assert objects["asterisk-ulaw"]["content_type"] == "audio/basic"

    # FreeSWITCH / Twilio WAVs: the header a player reads
    assert _wav_fields(files["freeswitch-8k"]) == (1, 1, 8000, 16, len(files["asterisk-sln"]))
    assert _wav_fields(files["freeswitch-16k"]) == (1, 1, 16000, 16, len(files["asterisk-sln16"]))
    assert _wav_fields(files["twilio-wav"]) == (7, 1, 8000, 8, len(files["asterisk-ulaw"]))
    # the same samples as the raw mu-law file, behind a header
    assert files["twilio-wav"].endswith(files["asterisk-ulaw"]) or files["twilio-wav"][:-1].endswith(
        files["asterisk-ulaw"]
    )
    mp3, rate = sf.read(io.BytesIO(files["twilio-mp3"]), dtype="float32")
    assert rate == 24000 and abs(len(mp3) / rate - duration) < 0.1


def test_old_preset_names_still_render(local_store: BlobStore) -> None:
    spec = PrerenderJob.from_payload(
        {"library": "old", "manifest": MANIFEST, "presets": ["mulaw8k", "pcm8k"], "gate": False}
    )
    assert prerender(ScriptedService(local_store), spec)["rendered"] == 3  # type: ignore[arg-type]
    assert _wav_fields(local_store.get_bytes("libraries/old/mulaw8k/good.wav"))[:3] == (7, 1, 8000)
