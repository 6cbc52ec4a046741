"""Chatterbox Turbo's VoiceEncoder against the official chatterbox-tts 0.1.7
``VoiceEncoder.embeds_from_wavs`` (as ``prepare_conditionals`` calls it: 16 kHz audio, silence trimmed,
rate 1.3) on the same random weights and audio: the same speaker embedding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.parity._official_chatterbox import import_chatterbox
from voxcast.models.chatterbox_turbo.voice_encoder import VoiceEncoder, power_mel, trim_silence
from voxcast.testing.chatterbox_turbo import ve_state
from voxcast.testing.signals import speech_like

official_ve = import_chatterbox("models.voice_encoder.voice_encoder")
official_mel = import_chatterbox("models.voice_encoder.melspec")

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(official_ve is None, reason="chatterbox-tts (and librosa) not importable"),
]


def _audio(seconds: float, seed: int) -> np.ndarray:
    # half a second of silence each side (trimmed) and a pause in the middle (kept)
    return speech_like(seconds, 16000, seed=seed, lead_s=0.5, tail_s=0.5, pause_s=0.4).astype(np.float32)


@pytest.mark.parametrize(("seconds", "seed"), [(6.0, 1), (2.0, 3)])
def test_the_embedding_equals_the_official(seconds: float, seed: int) -> None:
    assert official_ve is not None and official_mel is not None
    state = ve_state(seed=4)
    ours = VoiceEncoder.from_tensors(state)
    official = official_ve.VoiceEncoder()
    official.load_state_dict(state)
    official.eval()
    wav = _audio(seconds, seed)
    import librosa

    trimmed = librosa.effects.trim(wav, top_db=20)[0]
    assert np.array_equal(trim_silence(wav), trimmed)
    assert np.array_equal(power_mel(trimmed), official_mel.melspectrogram(trimmed, official.hp).T)
    want = torch.from_numpy(official.embeds_from_wavs([wav], sample_rate=16000))
    assert torch.equal(ours.embed(wav), want)
