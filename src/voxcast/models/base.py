"""The protocol a model family implements for the engine, and the options it is loaded with.

The engine (:mod:`voxcast.engine`) drives a model only through these types: it never imports a
concrete model package. A family registers a loader in :mod:`voxcast.models.registry`, which picks
the family from the checkpoint. One loaded model is driven from one thread (the engine's scheduler);
voices may be built on other threads.

The frame loop, per request::

    prompt = model.build_prompt(text, speaker=..., voice=..., language=..., instruct=...)
    gen = model.new_generator(prompt, sampling, max_frames)
    dec = model.new_decoder(voice, seed=gen.seed)
    gen.prefill()                       # or gen.prefill_part(n) until it returns True
    while (codes := model.step_many([gen])[0]) is not None:
        pcm = dec.decode(codes[None])   # float32 [frames * samples_per_frame] (or less: look-ahead)
    pcm = dec.finish()                  # where the decoder has it: the audio still held back

Text that arrives in pieces (an LLM's tokens), where the model can take it as it comes::

    prompt = model.open_prompt(speaker=..., voice=..., ...)   # None: the layout needs whole text
    prompt.update(text_so_far, closed=False)                 # again whenever text arrives
    # once prompt.ready: gen = model.new_generator(prompt, ...) and the loop above, except that a
    # generator whose ``waiting`` is True needs more text before its next step (do not step it)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from voxcast.models.sampling import SamplingParams  # torch-free, re-exported here

__all__ = [
    "FrameGenerator",
    "LoadOptions",
    "OpenPrompt",
    "SamplingParams",
    "StreamingDecoder",
    "TTSModel",
    "WarmupCase",
]


@dataclass(frozen=True)
class LoadOptions:
    """How to load a checkpoint: what every family understands plus family-specific knobs.

    Attributes:
        device: "cpu", "cuda", "cuda:1"...
        dtype: weights and activations.
        codec_dtype: the audio decoder's dtype.
        quant: "none" or "int8".
        prefix_cache: cache each voice's constant prompt prefix (keys/values).
        compile: compiled static decode steps (not bit-exact).
        trace_steps: replay recorded decode steps (bitwise the same outputs).
        kernels: CPU kernel choices by name ("int8_kernel", "fused_ops", "f32_rows"): True (on),
            False (off) or None (where it measures faster at load).
        settings: family-specific integer settings by name (Chatterbox Turbo's ``turbo_*``
            streaming windows); a family reads its own and ignores the others.
    """

    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    codec_dtype: torch.dtype = torch.float32
    quant: str = "none"
    prefix_cache: bool = True
    compile: bool = False
    trace_steps: bool = False
    kernels: tuple[tuple[str, bool | None], ...] = ()
    settings: tuple[tuple[str, int], ...] = ()

    def kernel(self, name: str) -> bool | None:
        """The choice for kernel ``name`` (None: decide by measuring)."""
        return dict(self.kernels).get(name)

    def setting(self, name: str, default: int) -> int:
        """Family-specific setting ``name``, else ``default``."""
        return int(dict(self.settings).get(name, default))


@dataclass(frozen=True)
class WarmupCase:
    """One voice mode the model serves: request fields (e.g. a speaker) plus a voice or None.

    ``sampled``: whether to warm the sampled path too (greedy always runs).
    """

    fields: dict[str, Any]
    voice: Any = None
    sampled: bool = True


class OpenPrompt(Protocol):
    """A prompt whose text arrives in pieces (see the module docstring).

    Attributes:
        ready: the prefill is determined (enough text has arrived).
        closed: the whole text is known.
        text_tokens: the text's tokens that are final so far.
    """

    @property
    def ready(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    @property
    def text_tokens(self) -> int: ...

    def update(self, text: str, closed: bool) -> None: ...


class FrameGenerator(Protocol):
    """The frames of one prompt: prefill, then one frame per step until None.

    Attributes:
        max_frames: frames emitted at most (the engine raises it as an open prompt's text grows).
        waiting: the next step needs text that has not arrived (an open prompt); do not step.
        seed: the seed of this stream's random generator.
        finish_reason: None while running, then "eos" or "max_frames".
        prefill_s: wall time of the prefill (seconds).
        stage_ms(): cumulative wall time per model stage (e.g. {"talker_ms": .., "code_predictor_ms": ..}).
        prefix_report(): (prefix cache hit, positions skipped), None where no prefix cache applies.
    """

    max_frames: int

    @property
    def seed(self) -> int | None: ...

    @property
    def waiting(self) -> bool: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def prefill_s(self) -> float: ...

    def prefill(self) -> None: ...

    def prefill_part(self, max_positions: int | None) -> bool: ...

    def step(self) -> torch.Tensor | None: ...

    def stage_ms(self) -> dict[str, float]: ...

    def prefix_report(self) -> tuple[bool, int] | None: ...


class StreamingDecoder(Protocol):
    """Codes -> audio, chunk by chunk; the concatenation equals a one-pass decode.

    A decoder that needs look-ahead may return no audio for a chunk (it is held until later frames
    arrive) and may have a ``finish() -> np.ndarray`` method, which the engine calls once after the
    last frame of a stream that ended normally, for the audio still held, and a ``flush() ->
    np.ndarray`` method, which it calls while a stream waits for its next sentence.
    """

    def decode(self, codes: torch.Tensor) -> np.ndarray: ...


class TTSModel(Protocol):
    """A loaded model family (see the module docstring for the frame loop).

    Attributes:
        model_type: the checkpoint's variant (Qwen3-TTS: "base", "custom_voice", "voice_design").
        identity: stable name of the checkpoint's content (cache keys, voice ids).
        sample_rate: of the decoded audio.
        samples_per_frame: audio samples per generated frame.
        speakers: named speakers (lower case; empty where the model has none).
        clones_voices: whether voices can be built from reference audio.
    """

    @property
    def model_type(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def sample_rate(self) -> int: ...

    @property
    def samples_per_frame(self) -> int: ...

    @property
    def speakers(self) -> Sequence[str]: ...

    @property
    def clones_voices(self) -> bool: ...

    def make_voice(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None, x_vector_only: bool
    ) -> Any: ...

    def voice_from_bytes(self, data: bytes) -> Any: ...

    def prime_voice(self, voice: Any, *, prefix: bool = True) -> Any: ...

    def warmup_cases(self, reference: np.ndarray, reference_text: str) -> list[WarmupCase]: ...

    def prepare_batches(self, max_batch: int) -> None: ...

    def fill_speaker_prefixes(self) -> int: ...

    def build_prompt(
        self,
        text: str,
        *,
        speaker: str | None = None,
        voice: Any = None,
        language: str = "auto",
        instruct: str | None = None,
        non_streaming_text: bool | None = None,
    ) -> Any: ...

    def open_prompt(
        self,
        *,
        speaker: str | None = None,
        voice: Any = None,
        language: str = "auto",
        instruct: str | None = None,
        non_streaming_text: bool | None = None,
    ) -> OpenPrompt | None: ...

    def new_generator(self, prompt: Any, sampling: SamplingParams, max_frames: int) -> FrameGenerator: ...

    def step_many(self, generators: list[Any]) -> list[torch.Tensor | None]: ...

    def new_decoder(self, voice: Any = None, seed: int | None = None) -> StreamingDecoder: ...

    def runtime_report(self) -> dict[str, Any]: ...
