"""The contract of a model family: the protocol the engine drives, its options, and the family record.

The engine (:mod:`voxcast.engine`) and the service drive a model only through these types: they never
import a concrete model package. A family is one module defining ``FAMILY =``
:class:`ModelFamily` (its loader, its own settings, its test checkpoints), listed in
:mod:`voxcast.models.registry`, which picks the family from the checkpoint. One loaded model is
driven from one thread (the engine's scheduler); voices may be built on other threads.

Required: :class:`TTSModel`, whose generators follow :class:`FrameGenerator` and decoders
:class:`StreamingDecoder`. Optional capabilities, each a protocol of its own, are read once when the
model is loaded (:func:`capabilities`), never looked up per call: :class:`RendersSettings`,
:class:`HintsDecodeThread`, :class:`HoldsAudioBack` (decoders with look-ahead,
:class:`LookaheadDecoder`), :class:`DecodesTogether` (several streams' chunks in one call) and
:class:`ExplainsCloning`.

The frame loop, per request::

    prompt = model.build_prompt(text, speaker=..., voice=..., language=..., instruct=...)
    gen = model.new_generator(prompt, sampling, max_frames)
    dec = model.new_decoder(voice, seed=gen.seed)
    gen.prefill()                       # or gen.prefill_part(n) until it returns True
    while (codes := model.step_many([gen])[0]) is not None:
        pcm = dec.decode(codes[None])   # float32 [frames * samples_per_frame] (or less: look-ahead)
    pcm = dec.finish()                  # HoldsAudioBack models: the audio still held back

Text that arrives in pieces (an LLM's tokens), where the model can take it as it comes::

    prompt = model.open_prompt(speaker=..., voice=..., ...)   # None: the layout needs whole text
    prompt.update(text_so_far, closed=False)                 # again whenever text arrives
    # once prompt.ready: gen = model.new_generator(prompt, ...) and the loop above, except that a
    # generator whose ``waiting`` is True needs more text before its next step (do not step it)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from voxcast.models.family import ModelFamily, Setting, TestCheckpoints, int_in, on_off_auto
from voxcast.models.sampling import SamplingParams  # torch-free, re-exported here

__all__ = [
    "Capabilities",
    "DecodesTogether",
    "ExplainsCloning",
    "FrameGenerator",
    "HintsDecodeThread",
    "HoldsAudioBack",
    "LoadOptions",
    "LookaheadDecoder",
    "ModelFamily",
    "OpenPrompt",
    "RendersSettings",
    "SamplingParams",
    "Setting",
    "StreamingDecoder",
    "TTSModel",
    "TestCheckpoints",
    "WarmupCase",
    "capabilities",
    "int_in",
    "on_off_auto",
]


@dataclass(frozen=True)
class LoadOptions:
    """How to load a checkpoint: what every family understands plus the family's own settings.

    Attributes:
        device: "cpu", "cuda", "cuda:1"...
        dtype: weights and activations.
        codec_dtype: the audio decoder's dtype.
        quant: "none" or "int8".
        prefix_cache: cache each voice's constant prompt prefix (keys/values).
        compile: compiled static decode steps (not bit-exact).
        trace_steps: replay recorded decode steps (bitwise the same outputs).
        settings: the family's own settings by name (its :attr:`ModelFamily.settings`): as given
            to the engine; the registry hands the family's loader only its own, checked, with the
            defaults filled (:meth:`ModelFamily.resolve`).
    """

    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    codec_dtype: torch.dtype = torch.float32
    quant: str = "none"
    prefix_cache: bool = True
    compile: bool = False
    trace_steps: bool = False
    settings: tuple[tuple[str, Any], ...] = ()

    def setting(self, name: str, default: Any = None) -> Any:
        """The family's setting ``name``, else ``default``."""
        return dict(self.settings).get(name, default)


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

    ``codes``: ``[T, ...]`` frames as the generator's steps returned them; the audio is float32 at
    the model's sample rate, ``T * samples_per_frame`` samples (less for a :class:`LookaheadDecoder`).
    """

    def decode(self, codes: torch.Tensor) -> np.ndarray: ...


class LookaheadDecoder(StreamingDecoder, Protocol):
    """A decoder that holds audio back until later frames arrive (the decoders of a
    :class:`HoldsAudioBack` model): :meth:`decode` may return no audio for a chunk.

    ``finish()``: the audio still held, called once after the last frame of a stream that ended
    normally. ``flush()``: the audio held so far, called while a stream waits for its next sentence.
    """

    def flush(self) -> np.ndarray: ...

    def finish(self) -> np.ndarray: ...


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


# -- optional capabilities (read once at load by capabilities()) ----------------------------------
@runtime_checkable
class RendersSettings(Protocol):
    """A model whose output depends on more than its checkpoint (its settings, a built-in voice):
    ``render_settings()`` is part of the audio cache key (JSON-able)."""

    def render_settings(self) -> Mapping[str, Any]: ...


@runtime_checkable
class HintsDecodeThread(Protocol):
    """A model that knows whether its audio decoding should overlap generation (``decode_thread=auto``):
    True/False instead of the warm-up's measurement, None to measure."""

    @property
    def decode_thread_hint(self) -> bool | None: ...


@runtime_checkable
class HoldsAudioBack(Protocol):
    """A model whose decoders are :class:`LookaheadDecoder` s (``decoder_holds_audio`` True)."""

    @property
    def decoder_holds_audio(self) -> bool: ...


@runtime_checkable
class DecodesTogether(Protocol):
    """A model whose decoders' chunks (one each, of several streams) can be decoded in one call that
    shares the work (``decodes_together`` True; e.g. one batched network call for every stream's
    window): ``decode_many(decoders, chunks)`` gives what ``decoders[i].decode(chunks[i])`` gives, in
    order, each decoder at most once. A stream whose own part fails gets its exception in its place
    (the others go on); an error of the shared work is raised (every stream in the call failed)."""

    @property
    def decodes_together(self) -> bool: ...

    def decode_many(
        self, decoders: Sequence[StreamingDecoder], chunks: Sequence[torch.Tensor]
    ) -> list[np.ndarray | Exception]: ...


@runtime_checkable
class ExplainsCloning(Protocol):
    """A model that says why it builds no voices from reference audio (the refusal's message; read
    only where ``clones_voices`` is False)."""

    @property
    def cloning_refusal(self) -> str: ...


@dataclass(frozen=True)
class Capabilities:
    """The optional capabilities of a loaded model, read once (:func:`capabilities`).

    Attributes:
        render_settings: :class:`RendersSettings` (empty where not).
        decode_thread_hint: :class:`HintsDecodeThread` (None: measure).
        decoder_holds_audio: :class:`HoldsAudioBack`: its decoders have ``flush`` and ``finish``.
        decodes_together: :class:`DecodesTogether`: ``decode_many`` decodes several streams' chunks.
        cloning_refusal: None where the model clones voices, else the message that refuses it.
    """

    render_settings: Mapping[str, Any] = field(default_factory=dict)
    decode_thread_hint: bool | None = None
    decoder_holds_audio: bool = False
    decodes_together: bool = False
    cloning_refusal: str | None = None


def capabilities(model: TTSModel) -> Capabilities:
    """What of the optional contract ``model`` implements (call once, at load)."""
    if model.clones_voices:
        refusal = None
    elif isinstance(model, ExplainsCloning):
        refusal = str(model.cloning_refusal)
    else:
        refusal = f"voice cloning is not supported by this model ({model.model_type})"
    return Capabilities(
        render_settings=dict(model.render_settings()) if isinstance(model, RendersSettings) else {},
        decode_thread_hint=model.decode_thread_hint if isinstance(model, HintsDecodeThread) else None,
        decoder_holds_audio=isinstance(model, HoldsAudioBack) and bool(model.decoder_holds_audio),
        decodes_together=isinstance(model, DecodesTogether) and bool(model.decodes_together),
        cloning_refusal=refusal,
    )
