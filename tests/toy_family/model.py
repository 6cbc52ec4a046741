"""A deterministic "model" that streams sine tones: one frame per word-part, its pitch the speaker's.

Each word of the text gives three frames; a frame's code is ``[frame index, pitch in Hz]`` and the
decoder turns it into ``samples_per_frame`` samples of a phase-continuous sine (so chunked decoding
equals one pass). Written from :mod:`voxcast.models.base` alone.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxcast.models.base import FrameGenerator, LoadOptions, SamplingParams, StreamingDecoder, WarmupCase

__all__ = ["FRAMES_PER_WORD", "SineModel", "sine"]

FRAMES_PER_WORD = 3
HOLD_LIMIT_S = 120.0
"""How long a step waits on the ``toy_hold`` file before it fails (a test that never removed it)."""


def sine(pitch_hz: float, first_sample: int, n: int, sample_rate: int, amplitude: float) -> np.ndarray:
    """``n`` samples of the tone from sample ``first_sample`` on (float32)."""
    t = (first_sample + np.arange(n)) / sample_rate
    return (amplitude * np.sin(2 * np.pi * pitch_hz * t)).astype(np.float32)


@dataclass(frozen=True)
class SinePrompt:
    text: str
    pitch_hz: float


class SineGenerator:
    """The frames of one prompt (:class:`~voxcast.models.base.FrameGenerator`)."""

    def __init__(self, prompt: SinePrompt, sampling: SamplingParams, max_frames: int) -> None:
        self.max_frames = max_frames
        self._total = FRAMES_PER_WORD * max(1, len(prompt.text.split()))
        self._pitch = prompt.pitch_hz
        self._seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
        self._done = 0
        self._reason: str | None = None

    @property
    def seed(self) -> int | None:
        return self._seed

    @property
    def frames(self) -> int:
        """Frames made so far."""
        return self._done

    @property
    def waiting(self) -> bool:
        return False

    @property
    def finish_reason(self) -> str | None:
        return self._reason

    @property
    def prefill_s(self) -> float:
        return 0.0

    def prefill(self) -> None:
        """Nothing to compute."""

    def prefill_part(self, max_positions: int | None) -> bool:
        return True

    def step(self) -> torch.Tensor | None:
        """The next frame's code ``[2]`` (frame index, pitch), None once the text or the limit is spent."""
        if self._reason is not None:
            return None
        if self._done >= min(self._total, self.max_frames):
            self._reason = "eos" if self._done >= self._total else "max_frames"
            return None
        self._done += 1
        return torch.tensor([self._done - 1, self._pitch], dtype=torch.float32)

    def stage_ms(self) -> dict[str, float]:
        return {}

    def prefix_report(self) -> tuple[bool, int] | None:
        return None


class SineDecoder:
    """Codes ``[T, 2]`` -> the tone's samples (:class:`~voxcast.models.base.StreamingDecoder`)."""

    def __init__(self, model: SineModel) -> None:
        self._model = model

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        m = self._model
        parts = [
            sine(
                float(pitch),
                int(index) * m.samples_per_frame,
                m.samples_per_frame,
                m.sample_rate,
                m.amplitude,
            )
            for index, pitch in codes.reshape(-1, 2).tolist()
        ]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)


class SineModel:
    """The loaded toy checkpoint (:class:`~voxcast.models.base.TTSModel`).

    ``config.json``: ``{"model_type": "toy_sine", "sample_rate": .., "samples_per_frame": ..,
    "speakers": {"name": pitch_hz, ...}}``; the family setting ``toy_amplitude`` (percent) scales it.
    """

    model_type = "sine"
    clones_voices = False

    def __init__(self, root: Path, options: LoadOptions) -> None:
        raw = (root / "config.json").read_bytes()
        config = json.loads(raw)
        self.sample_rate = int(config["sample_rate"])
        self.samples_per_frame = int(config["samples_per_frame"])
        self._pitches: dict[str, float] = {k.lower(): float(v) for k, v in config["speakers"].items()}
        self.amplitude = int(options.setting("toy_amplitude", 30)) / 100
        #: Seconds a batched step takes per row (``toy_step_ms``): a model as slow as one likes.
        self.step_s = int(options.setting("toy_step_ms", 0)) / 1000
        #: While this file exists, no stream gets a frame after its first (``toy_hold``).
        self.hold = Path(hold) if (hold := options.setting("toy_hold", "")) else None
        self.identity = "sine-" + hashlib.sha256(raw).hexdigest()[:16]

    @property
    def speakers(self) -> Sequence[str]:
        return tuple(self._pitches)

    # -- optional capability: RendersSettings (the amplitude changes the audio) -------------------
    def render_settings(self) -> Mapping[str, Any]:
        return {"toy_amplitude": round(self.amplitude * 100)}

    # -- voices: none ------------------------------------------------------------------------------
    def make_voice(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None, x_vector_only: bool
    ) -> Any:
        raise ValueError("the toy family builds no voices")

    def voice_from_bytes(self, data: bytes) -> Any:
        raise ValueError("the toy family builds no voices")

    def prime_voice(self, voice: Any, *, prefix: bool = True) -> Any:
        return voice

    # -- warm-up -----------------------------------------------------------------------------------
    def warmup_cases(self, reference: np.ndarray, reference_text: str) -> list[WarmupCase]:
        return [WarmupCase({"voice": self.speakers[0]})]

    def prepare_batches(self, max_batch: int) -> None:
        """Nothing to record."""

    def fill_speaker_prefixes(self) -> int:
        return 0

    # -- the frame loop ----------------------------------------------------------------------------
    def build_prompt(
        self,
        text: str,
        *,
        speaker: str | None = None,
        voice: Any = None,
        language: str = "auto",
        instruct: str | None = None,
        non_streaming_text: bool | None = None,
    ) -> SinePrompt:
        name = (speaker or self.speakers[0]).lower()
        if name not in self._pitches:
            raise ValueError(f"unknown speaker {speaker!r}")
        return SinePrompt(text, self._pitches[name])

    def open_prompt(self, **kwargs: Any) -> None:
        """Whole text only: the engine speaks text that arrives in pieces sentence by sentence."""
        return None

    def new_generator(self, prompt: Any, sampling: SamplingParams, max_frames: int) -> FrameGenerator:
        return SineGenerator(prompt, sampling, max_frames)

    def step_many(self, generators: list[Any]) -> list[torch.Tensor | None]:
        if self.step_s:
            time.sleep(self.step_s * len(generators))
        if self.hold is not None and any(g.frames for g in generators):
            self._wait_released()
        return [g.step() for g in generators]

    def _wait_released(self) -> None:
        """Wait while the ``toy_hold`` file exists (at most :data:`HOLD_LIMIT_S`)."""
        assert self.hold is not None
        deadline = time.monotonic() + HOLD_LIMIT_S
        while self.hold.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the toy model was held by {self.hold} for {HOLD_LIMIT_S} s")
            time.sleep(0.01)

    def new_decoder(self, voice: Any = None, seed: int | None = None) -> StreamingDecoder:
        return SineDecoder(self)

    def runtime_report(self) -> dict[str, Any]:
        return {"family": "toy_sine"}
