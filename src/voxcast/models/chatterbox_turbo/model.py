"""Chatterbox Turbo as a voxcast model (:class:`~voxcast.models.base.TTSModel`).

Loads the official layout (``t3_turbo_v1.safetensors``, ``s3gen_meanflow.safetensors``, ``ve.safetensors``,
the GPT-2 tokenizer files, optionally the built-in voice ``conds.pt``). A frame is one speech token
(40 ms, 960 samples at 24 kHz). Voices are built from reference audio (> 5 s) or are the built-in one
(speaker name "default"); Turbo has no named speakers, no instruct and speaks English only, so those
request fields fail naming the field. Paralinguistic tags (``[laugh]``...) are tokens of the text.

Per voice, computed once and kept in an LRU: T3's conditioning prefix (keys and values) and, with the
stream's ``prompt_cache`` on, S3Gen's prompt cache (:mod:`.s3gen_prefix`). Streaming is
:mod:`.s3gen_stream`'s; with ``turbo_batch_windows`` on (the default) the engine decodes several
streams' chunks in one call (:meth:`ChatterboxTurbo.decode_many`: their flow windows batched).
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from voxcast.errors import CheckpointError, InvalidRequest
from voxcast.kernels import int8_store
from voxcast.kernels.int8_linear import layouts_to_store, stored_tensors
from voxcast.models.base import LoadOptions, SamplingParams, WarmupCase
from voxcast.models.chatterbox_turbo.campplus import CAMPPlus
from voxcast.models.chatterbox_turbo.frames import MAX_TOKENS, TurboFrames, TurboPrompt, step_many
from voxcast.models.chatterbox_turbo.gpt2 import KVCache
from voxcast.models.chatterbox_turbo.hift import HiFT
from voxcast.models.chatterbox_turbo.s3_tokenizer import S3Tokenizer
from voxcast.models.chatterbox_turbo.s3gen_audio import mel_24k, resample_sinc
from voxcast.models.chatterbox_turbo.s3gen_flow import MELS, MELS_PER_TOKEN, S3GenFlow
from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache
from voxcast.models.chatterbox_turbo.s3gen_stream import (
    TAIL,
    StreamSettings,
    TurboAudioStream,
    prompt_cache,
    push_many,
    trim_fade,
)
from voxcast.models.chatterbox_turbo.sampling import TurboSampling
from voxcast.models.chatterbox_turbo.state import read_state
from voxcast.models.chatterbox_turbo.t3 import T3, T3_FILE, load_t3
from voxcast.models.chatterbox_turbo.t3_quant import quantize_t3, store_identity
from voxcast.models.chatterbox_turbo.t3_static import StaticT3
from voxcast.models.chatterbox_turbo.text import TurboTokenizer, punc_norm
from voxcast.models.chatterbox_turbo.voice import TurboVoice, build_voice
from voxcast.models.chatterbox_turbo.voice_encoder import VE_FILE, VoiceEncoder
from voxcast.models.fingerprint import weights_fingerprint

__all__ = ["S3GEN_FILE", "ChatterboxTurbo"]

log = logging.getLogger(__name__)

S3GEN_FILE = "s3gen_meanflow.safetensors"
CONDS_FILE = "conds.pt"
DEFAULT_VOICE = "default"
#: Voices whose T3 prefix is kept (full size: ~74 MB of float32 keys and values each).
VOICE_STATES = 8
#: Voices whose S3Gen prompt cache is kept (full size, a 10 s prompt: ~245 MB of float32 each).
S3GEN_STATES = 4
LANGUAGES = ("auto", "en", "english")
#: Speech token ids below this are speech (6561 and 6562 are T3's start and stop).
SPEECH_VOCAB = 6561


def _identity(root: Path) -> str:
    """Stable name of the checkpoint's content: hash of the tokenizer files, the weights' sizes and a
    sample of their bytes (:func:`voxcast.models.fingerprint.weights_fingerprint`: a fine-tune of the
    same sizes gets its own)."""
    h = hashlib.sha256()
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"):
        if (root / name).is_file():
            h.update((root / name).read_bytes())
    files = [root / f for f in (T3_FILE, S3GEN_FILE, VE_FILE)]
    h.update(weights_fingerprint(files).encode())
    return f"chatterbox-turbo:{h.hexdigest()[:16]}:{sum(f.stat().st_size for f in files)}"


def _quantize(t3: T3, identity: str) -> dict[str, object]:
    """T3's block projections as int8 (:func:`.t3_quant.quantize_t3`), read from the int8 store where
    an earlier start left them, else quantized and stored for the next start."""
    key = store_identity(identity)
    stored = int8_store.load(key)
    report = quantize_t3(t3, stored=stored.tensors if stored is not None else None)
    report["store"] = "read" if stored is not None else None
    if (stored is None or layouts_to_store(t3)) and int8_store.save(key, stored_tensors(t3), []):
        report["store"] = "written"
    return report


def _batch_windows(setting: bool | None, device: torch.device) -> bool:
    """``turbo_batch_windows``: on, off, or (auto, None) on where kernel launches dominate a window (a
    GPU). On a CPU a window's cost is arithmetic, which batching does not cut, and a stream's audio
    would depend, by float rounding, on which streams shared its calls."""
    return device.type == "cuda" if setting is None else bool(setting)


def turbo_sampling(params: SamplingParams) -> TurboSampling:
    """The request's sampling with Turbo's defaults for every field the request did not set (the
    request schema's defaults are Qwen3-TTS's)."""
    given = params.model_fields_set
    d = TurboSampling()
    return TurboSampling(
        temperature=params.temperature if "temperature" in given else d.temperature,
        top_k=params.top_k if "top_k" in given else d.top_k,
        top_p=params.top_p if "top_p" in given else d.top_p,
        repetition_penalty=params.repetition_penalty
        if "repetition_penalty" in given
        else d.repetition_penalty,
        greedy=params.greedy,
    )


class ChatterboxTurbo:
    """A loaded Turbo checkpoint. Driven by the engine from one thread; voices may be built and
    primed on others."""

    model_type = "turbo"
    sample_rate = 24000
    samples_per_frame = 960
    clones_voices = True
    #: Its decoders hold audio back for look-ahead (:class:`~voxcast.models.base.HoldsAudioBack`).
    decoder_holds_audio = True

    def __init__(
        self,
        *,
        t3: T3,
        flow: S3GenFlow,
        hift: HiFT,
        ve: VoiceEncoder,
        campplus: CAMPPlus,
        s3_tokenizer: S3Tokenizer,
        tokenizer: TurboTokenizer,
        identity: str,
        device: torch.device,
        builtin: TurboVoice | None = None,
        stream_settings: StreamSettings | None = None,
        prefix_cache: bool = True,
        static_decode: bool = False,
        quant: dict[str, object] | None = None,
        batch_windows: bool = True,
    ) -> None:
        self.t3, self.flow, self.hift, self.ve = t3, flow, hift, ve
        self.campplus, self.s3_tokenizer, self.tokenizer = campplus, s3_tokenizer, tokenizer
        self.identity, self.device = identity, device
        self.builtin = builtin
        self._builtin_sha = (
            hashlib.sha256(builtin.to_bytes()).hexdigest()[:16] if builtin is not None else None
        )
        self.stream_settings = stream_settings or StreamSettings()
        self.prefix_cache_enabled = prefix_cache
        self.static_decode = static_decode
        #: T3's int8 weights (:func:`.t3_quant.quantize_t3`'s report), None with float weights
        self.quant = quant
        #: :meth:`decode_many` batches streams' flow windows (:class:`~voxcast.models.base.DecodesTogether`)
        self.decodes_together = batch_windows
        #: T3's fixed-shape decode step (:mod:`.t3_static`), made by :meth:`prepare_batches`
        self.static: StaticT3 | None = None
        self.speakers: tuple[str, ...] = (DEFAULT_VOICE,) if builtin is not None else ()
        self.load_s = 0.0
        self._states: OrderedDict[int, tuple[TurboVoice, KVCache]] = OrderedDict()
        self._s3gen_states: OrderedDict[int, tuple[TurboVoice, PromptCache]] = OrderedDict()
        self._lock = threading.Lock()
        #: ``decode_thread=auto`` without measuring, on a CPU: a warm-up run is too short to reach the
        #: stream's first flow chunk, and overlapping S3Gen with T3 measured 28.5 s against 37 s for a
        #: 10 s utterance (full size, 2 cores; docs/chatterbox-turbo.md). Elsewhere: measured.
        self.decode_thread_hint: bool | None = True if device.type == "cpu" else None

    @classmethod
    def from_pretrained(cls, root: str | Path, options: LoadOptions | None = None) -> ChatterboxTurbo:
        """Load a checkpoint folder.

        Raises:
            CheckpointError: a file is missing or its tensors do not make the model.
        """
        t0 = time.perf_counter()
        opts = options or LoadOptions()
        folder = Path(root)
        device = torch.device(opts.device)
        if opts.quant not in ("none", "int8"):
            raise CheckpointError(f"Chatterbox Turbo has no {opts.quant} mode (VOXCAST_QUANT=none or int8)")
        if opts.quant == "int8" and device.type != "cpu":
            raise CheckpointError("int8 weights (VOXCAST_QUANT=int8) are for the CPU; on a GPU use none")
        # int8 T3 computes in float32 (fbgemm's activations); S3Gen keeps the dtype asked for
        t3 = load_t3(folder, device=device, dtype=torch.float32 if opts.quant == "int8" else opts.dtype)
        s3gen = read_state(folder / S3GEN_FILE)
        flow = S3GenFlow.from_tensors(s3gen).to(device=device, dtype=opts.dtype)
        # HiFT stays float32 whatever the codec dtype: its source (phase sums, STFT) and iSTFT need it
        hift = HiFT.from_tensors(s3gen).to(device=device, dtype=torch.float32)
        campplus = CAMPPlus.from_tensors(s3gen).to(device)
        s3_tokenizer = S3Tokenizer.from_tensors(s3gen).to(device)
        del s3gen
        ve = VoiceEncoder.from_tensors(read_state(folder / VE_FILE)).to(device)
        tokenizer = TurboTokenizer.from_dir(folder)
        identity = _identity(folder)  # every file is there by now
        quant = _quantize(t3, identity) if opts.quant == "int8" else None
        builtin = None
        if (folder / CONDS_FILE).is_file():
            builtin = TurboVoice.from_conds(folder / CONDS_FILE, name=DEFAULT_VOICE)
        model = cls(
            t3=t3, flow=flow, hift=hift, ve=ve, campplus=campplus, s3_tokenizer=s3_tokenizer,
            tokenizer=tokenizer, identity=identity, device=device, builtin=builtin,
            prefix_cache=opts.prefix_cache, stream_settings=StreamSettings.from_options(opts),
            static_decode=bool(opts.setting("turbo_static_decode") or False), quant=quant,
            batch_windows=_batch_windows(opts.setting("turbo_batch_windows"), device),
        )  # fmt: skip
        model.load_s = time.perf_counter() - t0
        log.info("loaded Chatterbox Turbo %s (%s) on %s in %.2f s", folder, identity, device, model.load_s)
        return model

    # ------------------------------------------------------------------ voices

    def make_voice(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None, x_vector_only: bool
    ) -> TurboVoice:
        """A voice from reference audio (mono float, any rate; ``ref_text`` and ``x_vector_only`` are
        not used by Turbo).

        Raises:
            InvalidRequest: 5 s or shorter (field "ref_audio").
        """
        from voxcast.audio.reference import prepare_reference_audio

        wav = prepare_reference_audio(audio, sample_rate) if sample_rate != self.sample_rate else audio
        dev = self.device
        with torch.inference_mode():
            return build_voice(
                np.asarray(wav, dtype=np.float32),
                embed_speaker=lambda w: self.ve.embed(w),
                tokens=lambda w, n: self.s3_tokenizer.tokens(w.to(dev), max_len=n),
                xvector=lambda w: self.campplus.embed(w.to(dev)),
                mel=lambda w: mel_24k(w.to(dev)),
                resample=resample_sinc,
                model_identity=self.identity,
            )

    def voice_from_bytes(self, data: bytes) -> TurboVoice:
        return TurboVoice.from_bytes(data, expected_identity=self.identity)

    def prime_voice(self, voice: TurboVoice, *, prefix: bool = True) -> TurboVoice:
        """Compute ``voice``'s T3 conditioning prefix now (with the prefix cache on), on the calling
        thread. Also with ``prefix=False`` (the engine's choice for a voice that comes with its
        request): unlike Qwen3-TTS's, Turbo's request prefill runs after the prefix, so a voice not
        primed here would have its ~376 positions computed on the scheduler thread, stalling every
        other stream."""
        if self.prefix_cache_enabled:
            self._prefix(voice)
        self.s3gen_cache(voice)
        return voice

    def _prefix(self, voice: TurboVoice) -> tuple[KVCache, bool]:
        """The voice's T3 prefix from the LRU (keyed by the voice object), computed on a miss."""
        key = id(voice)
        with self._lock:
            hit = self._states.get(key)
            if hit is not None and hit[0] is voice:
                self._states.move_to_end(key)
                return hit[1], True
        with torch.inference_mode():
            cache = self.t3.prefix(self._conditioning(voice))
        with self._lock:
            self._states[key] = (voice, cache)
            while len(self._states) > VOICE_STATES:
                self._states.popitem(last=False)
        return cache, False

    def s3gen_cache(self, voice: TurboVoice) -> PromptCache | None:
        """The voice's S3Gen prompt cache from its LRU (keyed by the voice object), computed on a
        miss; None with the stream's ``prompt_cache`` off or a prompt under two tokens."""
        settings = self.stream_settings
        if not settings.prompt_cache or voice.prompt_tokens.shape[-1] < 2:
            return None
        key = id(voice)
        with self._lock:
            hit = self._s3gen_states.get(key)
            if hit is not None and hit[0] is voice:
                self._s3gen_states.move_to_end(key)
                return hit[1]
        tokens, mel, xvector = self.s3gen_prompt(voice)
        cache = prompt_cache(self.flow, *settings.trim_prompt(tokens, mel), xvector)
        with self._lock:
            self._s3gen_states[key] = (voice, cache)
            while len(self._s3gen_states) > S3GEN_STATES:
                self._s3gen_states.popitem(last=False)
        return cache

    def _conditioning(self, voice: TurboVoice) -> torch.Tensor:
        dtype = self.t3.speech_emb.weight.dtype
        with torch.inference_mode():
            return self.t3.conditioning(voice.speaker.to(self.device, dtype), voice.t3_tokens.to(self.device))

    def warmup_cases(self, reference: np.ndarray, reference_text: str) -> list[WarmupCase]:
        """The built-in voice (if any) and a voice cloned from ``reference`` (tiled past 5 s)."""
        reps = int(np.ceil(6.0 * self.sample_rate / max(1, len(reference))))
        voice = self.make_voice(np.tile(reference, reps), self.sample_rate, None, False)
        cases = [WarmupCase({}, voice)]
        if self.builtin is not None:
            cases.append(WarmupCase({"voice": DEFAULT_VOICE}, sampled=False))
        return cases

    def fill_speaker_prefixes(self) -> int:
        if self.builtin is None:
            return 0
        self.s3gen_cache(self.builtin)
        if not self.prefix_cache_enabled:
            return 0
        return int(not self._prefix(self.builtin)[1])

    def prepare_batches(self, max_batch: int) -> None:
        """With ``turbo_static_decode`` on: T3's static decode step for ``max_batch`` streams (its
        key/value slots allocated; on CUDA each batch bucket's step captured as a CUDA graph)."""
        if not self.static_decode or (self.static is not None and self.static.slots >= max_batch):
            return
        t0 = time.perf_counter()
        static = StaticT3(self.t3, max(1, max_batch), graphs=self.device.type == "cuda")
        static.capture()
        self.static = static
        log.info(
            "T3 static decode: %d slots of %d positions, graphs %s, ready in %.2f s",
            static.slots, static.length, static.graphs, time.perf_counter() - t0,
        )  # fmt: skip

    def render_settings(self) -> dict[str, object]:
        """What changes the audio besides the checkpoint's weights (the engine adds it to the audio
        cache key): the stream settings, the built-in voice's content and T3's int8 weights."""
        settings: dict[str, object] = {
            "turbo_stream": self.stream_settings.as_dict(), "builtin_voice": self._builtin_sha
        }  # fmt: skip
        if self.quant is not None:  # int8 T3 draws other tokens (float weights keep their keys)
            settings["t3_quant"] = "int8"
        return settings

    def runtime_report(self) -> dict[str, object]:
        return {
            "device": str(self.device),
            "family": "chatterbox_turbo",
            "stream": self.stream_settings.as_dict(),
            "t3_quant": self.quant,
            "t3_static_decode": None if self.static is None else {
                "slots": self.static.slots, "length": self.static.length, "graphs": self.static.graphs,
                "buckets": list(self.static.buckets),
            },
        }  # fmt: skip

    # ------------------------------------------------------------------ prompts and generation

    def _voice_for(self, speaker: str | None, voice: TurboVoice | None) -> TurboVoice:
        if voice is not None:
            if not isinstance(voice, TurboVoice):
                raise InvalidRequest(
                    "this voice was made for another model family; recreate it", field="voice"
                )
            if voice.model_identity not in ("", self.identity):
                raise InvalidRequest("this voice was made by another model; recreate it", field="voice")
            return voice
        if speaker is not None and speaker.lower() != DEFAULT_VOICE:
            raise InvalidRequest(
                f"Chatterbox Turbo has no named speakers ({speaker!r}): give ref_audio or a stored voice id",
                field="voice",
            )
        if self.builtin is None:
            raise InvalidRequest(
                "this Chatterbox Turbo checkpoint has no built-in voice (conds.pt): give ref_audio or a voice id",
                field="voice",
            )
        return self.builtin

    def build_prompt(
        self,
        text: str,
        *,
        speaker: str | None = None,
        voice: TurboVoice | None = None,
        language: str = "auto",
        instruct: str | None = None,
        non_streaming_text: bool | None = None,
    ) -> TurboPrompt:
        """T3's input for ``text`` in ``voice`` (or the built-in voice).

        Raises:
            InvalidRequest: a named speaker, instruct, or a language other than English (the field).
        """
        if instruct:
            raise InvalidRequest("Chatterbox Turbo does not take instructions", field="instruct")
        if language.lower() not in LANGUAGES:
            raise InvalidRequest(f"Chatterbox Turbo speaks English only, not {language!r}", field="language")
        v = self._voice_for(speaker, voice)
        ids = self.tokenizer.encode(punc_norm(text))
        room = self.t3.cfg.positions - (1 + v.t3_tokens.shape[1]) - len(ids) - 1
        if room < 1:
            raise InvalidRequest(
                f"text too long for one Turbo prompt ({len(ids)} tokens; at most "
                f"{self.t3.cfg.positions - v.t3_tokens.shape[1] - 3}): split it (VOXCAST_PIECE_CHARS)",
                field="text",
            )
        text_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        if self.prefix_cache_enabled:
            prefix, hit = self._prefix(v)
            return TurboPrompt(text_ids, v, prefix=prefix, prefix_hit=hit, room=room)
        return TurboPrompt(text_ids, v, conditioning=self._conditioning(v), room=room)

    def open_prompt(self, **_: Any) -> None:
        """Turbo takes whole sentences (the engine feeds text that arrives in pieces sentence by sentence)."""
        return None

    def new_generator(self, prompt: TurboPrompt, sampling: SamplingParams, max_frames: int) -> TurboFrames:
        return TurboFrames(self.t3, prompt, turbo_sampling(sampling), max_frames, sampling.seed)

    def step_many(self, generators: Sequence[TurboFrames]) -> list[torch.Tensor | None]:
        """One token for each generator; streams in the middle of their speech share one batched T3
        step."""
        return step_many(self.t3, list(generators), static=self.static)

    @torch.inference_mode()
    def render(
        self,
        text: str,
        voice: TurboVoice | None = None,
        *,
        seed: int = 0,
        sampling: TurboSampling | None = None,
    ) -> np.ndarray:
        """The whole utterance in one pass, as the official ``ChatterboxTurboTTS.generate`` computes it
        after ``torch.manual_seed(seed)`` (watermark off): every random draw (T3's tokens, the flow's
        noise, HiFT's source) from one generator in the official order. The reference the stream is
        measured against, and what the parity test compares with the official package."""
        v = self._voice_for(None, voice)
        g = torch.Generator(device=self.device).manual_seed(seed)
        ids = torch.tensor([self.tokenizer.encode(punc_norm(text))], dtype=torch.long, device=self.device)
        tokens = self.t3.stream(
            ids, conditioning=self._conditioning(v), sampling=sampling or TurboSampling(), generator=g,
            max_tokens=MAX_TOKENS,
        ).all()  # fmt: skip
        tokens = [t for t in tokens if t < SPEECH_VOCAB] + list(TAIL)
        dtype = self.flow.input_embedding.weight.dtype
        n, p = len(tokens), v.prompt_tokens.shape[1]
        noise = torch.randn(1, MELS, MELS_PER_TOKEN * n, generator=g, device=self.device, dtype=dtype)
        z = torch.randn(1, MELS, MELS_PER_TOKEN * (p + n), generator=g, device=self.device, dtype=dtype)
        z[..., MELS_PER_TOKEN * p :] = noise
        mel = self.flow(*self.s3gen_prompt(v), torch.tensor([tokens], device=self.device), z)
        audio = self.hift.inference(mel.to(self.hift.conv_pre.weight.dtype), generator=g)[0]
        fade = trim_fade().to(audio)
        audio[: len(fade)] *= fade
        return audio.float().cpu().numpy()

    def s3gen_prompt(self, voice: TurboVoice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``voice``'s S3Gen conditionals as the flow takes them: prompt tokens ``[1, P]``, prompt mel
        ``[1, 80, 2P]`` and x-vector ``[1, 192]``, on the model's device and in the flow's dtype."""
        dtype = self.flow.input_embedding.weight.dtype
        return (
            voice.prompt_tokens.to(self.device),
            voice.prompt_mel.transpose(1, 2).to(self.device, dtype),
            voice.xvector.to(self.device, dtype),
        )

    def new_decoder(self, voice: TurboVoice | None = None, seed: int | None = None) -> TurboDecoder:
        return TurboDecoder(self, self._voice_for(None, voice), seed)

    def decode_many(
        self, decoders: Sequence[TurboDecoder], chunks: Sequence[torch.Tensor]
    ) -> list[np.ndarray | Exception]:
        """``decoders[i].decode(chunks[i])`` for each stream (each at most once), every flow window
        now ready in one batched call (:func:`~.s3gen_stream.push_many`): the same audio up to float
        rounding (docs/chatterbox-turbo.md). A stream's own error comes back in its place."""
        streams = [d.stream for d in decoders]
        return push_many(streams, [TurboDecoder.speech(c) for c in chunks])


class TurboDecoder:
    """The engine's streaming decoder: token chunks in, audio out (:class:`TurboAudioStream`)."""

    def __init__(self, model: ChatterboxTurbo, voice: TurboVoice, seed: int | None) -> None:
        self.stream = TurboAudioStream(
            model.flow,
            model.hift,
            *model.s3gen_prompt(voice),
            seed if seed is not None else random.getrandbits(62),
            model.stream_settings,
            cache=model.s3gen_cache(voice),
        )

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """Audio now final for the speech tokens ``codes [T, 1]`` (often empty: see the chunk ramp)."""
        return self.stream.push(self.speech(codes))

    @staticmethod
    def speech(codes: torch.Tensor) -> list[int]:
        """The speech token ids of ``codes [T, 1]`` (T3's start and stop dropped)."""
        ids = codes.reshape(-1).tolist()  # one copy, no scalar read per token
        return [t for t in ids if t < SPEECH_VOCAB]

    def flush(self) -> np.ndarray:
        """The audio held back for look-ahead (the engine calls it while the text pauses)."""
        return self.stream.flush()

    def finish(self) -> np.ndarray:
        """The rest of the utterance's audio."""
        return self.stream.finish()
