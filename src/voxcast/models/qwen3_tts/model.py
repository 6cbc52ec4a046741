"""The Qwen3-TTS-12Hz facade used by the engine: load once, then build prompts and run generators.

Typical use::

    model = Qwen3TTS.from_pretrained("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", device="cuda",
                                     dtype=torch.bfloat16)
    prompt = model.build_prompt("Hello there.", speaker="ryan", language="english")
    gen = model.new_generator(prompt, SamplingParams(seed=7), max_frames=200)
    dec = model.new_decoder(prompt.voice)
    gen.prefill()
    while (frame := gen.step()) is not None:   # LongTensor [16]
        pcm = dec.decode(frame[None])          # float32 [1920]

Nothing here runs lazily on a request: weights, tokenizer, codec decoder (and for Base models the
speaker encoder and codec encoder) are loaded by :meth:`Qwen3TTS.from_pretrained`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
import torch

from voxcast.errors import InvalidRequest
from voxcast.models.base import SamplingParams, WarmupCase
from voxcast.models.qwen3_tts.accel.apply import AccelConfig, AccelReport
from voxcast.models.qwen3_tts.accel.apply import apply as apply_accel
from voxcast.models.qwen3_tts.accel.batch_frames import BatchedFrames
from voxcast.models.qwen3_tts.checkpoint import (
    Qwen3TTSNet,
    checkpoint_identity,
    load_network,
    locate_checkpoint,
    resolve_checkpoint,
)
from voxcast.models.qwen3_tts.codec_decoder import StreamingDecoder, load_codec_decoder
from voxcast.models.qwen3_tts.config import Qwen3TTSConfig
from voxcast.models.qwen3_tts.generator import FrameGenerator, step_many
from voxcast.models.qwen3_tts.open_prompt import OpenPrompt
from voxcast.models.qwen3_tts.prefix_cache import PrefixKVCache
from voxcast.models.qwen3_tts.prompt import Prompt, PromptBuilder, _ref_template
from voxcast.models.qwen3_tts.sampling import SamplerSettings
from voxcast.models.qwen3_tts.tokenizer import TextTokenizer

if TYPE_CHECKING:
    from voxcast.kernels.int8_store import StoredInt8
    from voxcast.models.qwen3_tts.codec_decoder import CodecDecoder
    from voxcast.models.qwen3_tts.codec_encoder import CodecEncoder
    from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt

__all__ = ["Qwen3TTS"]

logger = logging.getLogger(__name__)

#: Primed codec-decoder states kept per cloned voice.
PRIMED_DECODERS = 32

#: Text of the request whose prompt prefix :meth:`Qwen3TTS.fill_prefix` computes (the prefix never
#: depends on it, and only prefix positions run).
_PREFIX_TEXT = "Hello."


class Qwen3TTS:
    """A loaded checkpoint. Not thread-safe: the engine drives it from one thread.

    Attributes:
        model_type: "base", "custom_voice" or "voice_design".
        identity: stable name of the checkpoint's content (for cache keys).
        speakers: named speakers (CustomVoice), lower case.
        languages: accepted language names ("auto" first).
        sample_rate: 24000.
        samples_per_frame: 1920 (12.5 frames per second).
        config: the parsed ``config.json``.
        load_s: seconds spent in :meth:`from_pretrained`.
        prefix_cache_enabled: new generators reuse cached prefix keys/values (settable).
        prefix_kv: the per-voice prefix KV store (:mod:`.prefix_cache`; hit/miss counters).
    """

    sample_rate = 24000
    samples_per_frame = 1920

    def __init__(
        self,
        *,
        config: Qwen3TTSConfig,
        net: Qwen3TTSNet,
        tokenizer: TextTokenizer,
        codec_decoder: CodecDecoder,
        codec_encoder: CodecEncoder | None,
        identity: str,
        device: torch.device,
        dtype: torch.dtype,
        prefix_cache: bool = False,
        accel: AccelConfig | None = None,
        int8_store: StoredInt8 | None = None,
    ) -> None:
        self.config = config
        self.prefix_cache_enabled = prefix_cache
        self.net = net
        self.talker = net.talker
        self.tokenizer = tokenizer
        self.codec_decoder = codec_decoder
        self.codec_encoder = codec_encoder
        self.identity = identity
        self.device = device
        self.dtype = dtype
        #: What :func:`~voxcast.models.qwen3_tts.accel.apply.apply` chose, and why.
        self.accel = apply_accel(
            self.talker,
            accel or AccelConfig(),
            identity=identity,
            device=device,
            dtype=dtype,
            codec_encoder=codec_encoder,
            speaker_encoder=net.speaker_encoder,
            stored=int8_store,
        )
        self.quant = self.accel.quant
        self.compile_enabled = self.accel.compile
        #: Whole frames in slots (``batch_graphs``), or None: :func:`~.generator.step_many`.
        self.batched = BatchedFrames(self.talker) if self.accel.batch_graphs else None
        self.model_type = config.tts_model_type
        self.speakers = config.speakers
        self.languages = config.languages
        self.load_s = 0.0
        scope = f"{identity}|{dtype}|{self.quant}|{device}"
        self._prompts = PromptBuilder(config, self.talker, tokenizer, cache_scope=scope)
        self.prefix_kv = PrefixKVCache()
        self._primed: OrderedDict[int, tuple[VoicePrompt, StreamingDecoder]] = OrderedDict()
        self._primed_lock = threading.Lock()

    def __getattr__(self, name: str) -> object:
        """The kernel choices (``int8_kernel``, ``f32_rows``, ``row_parts``...) read from :attr:`accel`."""
        accel = self.__dict__.get("accel")
        if accel is not None and name in AccelReport.__dataclass_fields__:
            return getattr(accel, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        local_files_only: bool | None = None,
        quant: str = "none",
        prefix_cache: bool = False,
        compile: bool = False,
        codec_dtype: torch.dtype | None = None,
        trace_steps: bool = False,
        onednn_rows: bool | None = None,
        row_parts: int | None = None,
        int8_kernel: bool | None = None,
        int8_variant: str | None = None,
        fused_ops: bool | None = None,
        f32_rows: bool | None = None,
        batch_graphs: bool = False,
    ) -> Qwen3TTS:
        """Load a checkpoint directory or hub id.

        Args:
            name_or_path: local folder in the official layout, or a hub id.
            device: "cpu", "cuda", "cuda:1"...
            dtype: torch.float32 or torch.bfloat16 (weights and activations).
            local_files_only: never download (default: true when ``HF_HUB_OFFLINE=1``).
            quant: "none", or "int8" for int8 talker/code-predictor weights on the CPU (faster,
                not bit-exact; see :mod:`voxcast.models.qwen3_tts.accel.quant`).
            prefix_cache: reuse each voice's constant prompt prefix as cached key/value states.
            compile: torch.compile the decode steps (CUDA graphs on CUDA); not bit-exact.
            codec_dtype: the audio decoder's dtype (default ``dtype``); bfloat16 decodes 2.3-2.7x
                faster on a CPU with AMX, within ~1.6e-3 of float32 (not bit-exact).
            trace_steps: replay the code predictor's intra-frame forwards and the talker's decode
                step (one row and batched rows) from recordings (:mod:`voxcast.models.qwen3_tts.accel.cp_trace`,
                :mod:`voxcast.models.qwen3_tts.accel.talker_trace`; bitwise the same outputs, less Python per step).
            onednn_rows: float32 on the CPU: run batched decode rows on oneDNN (True, or None:
                wherever this PyTorch has it) or on PyTorch's BLAS (False;
                :mod:`voxcast.kernels.rows_linear`). One row and prefills always use PyTorch's kernel.
            row_parts: float32 on the CPU: compute the Linears of one to three rows (a decode
                step, the code predictor's first step) as this many blocks of outputs in one bmm
                (bitwise the same values, one block per thread; 1 = plain ``F.linear``), or, with
                None, as many blocks as intra-op threads where that measures faster at load
                (:func:`voxcast.kernels.rows_linear.split_rows_faster`).
            int8_kernel: with ``quant="int8"``: run decode rows (up to :data:`voxcast.kernels.int8_linear.KERNEL_ROWS`)
                on voxcast's kernel (True or None, where it builds) or on fbgemm (False;
                :mod:`voxcast.kernels.native`).
            int8_variant: the kernel's variant (:data:`voxcast.kernels.native.VARIANTS`; default: the fastest
                this CPU runs).
            fused_ops: float32 on the CPU: run RMSNorms, the q/k norm + rotary embedding and the
                attention of decode steps as single C++ operations (:mod:`voxcast.models.qwen3_tts.accel.decode_ops`; not
                bit-exact), and the codec encoder's ELUs (:mod:`voxcast.kernels.seanet_gemm`) and the speaker
                encoder's convolutions as matrix products too. None: with
                ``quant="int8"`` only, where the library builds. Off with ``compile``.
            f32_rows: float32 on the CPU: run one-row products (decode steps) on voxcast's kernels,
                which sum in the BLAS's own order at memory speed, the code predictor's layers
                through packed copies of their weights (+~300 MB for its five layers); taken only
                where every weight gives the BLAS's bits (checked at load). True: there; None: there,
                the packed copies only where they also measure faster at load (they give the same
                bits); False: never (:mod:`voxcast.models.qwen3_tts.accel.f32_rows`).
            batch_graphs: run each frame of a batch as one static-shape function over slots of one
                batched key/value cache, with graph-safe counter-based sampling, captured as a CUDA
                graph per batch bucket on CUDA (:mod:`voxcast.models.qwen3_tts.accel.batch_frames`).
                Greedy codes as the eager path (up to rounding); sampled draws differ from the
                official sampler's, but do not depend on the batch.

        Raises:
            CheckpointError: missing files, bad config, weights that do not match.
        """
        accel = AccelConfig(
            quant=quant,
            compile=compile,
            trace_steps=trace_steps,
            onednn_rows=onednn_rows,
            row_parts=row_parts,
            int8_kernel=int8_kernel,
            int8_variant=int8_variant,
            fused_ops=fused_ops,
            f32_rows=f32_rows,
            batch_graphs=batch_graphs,
        )
        t0 = time.perf_counter()
        dev = torch.device(device)
        root = resolve_checkpoint(name_or_path, local_files_only=local_files_only)
        files = locate_checkpoint(root)
        config = Qwen3TTSConfig.from_file(files.config)
        identity = checkpoint_identity(files, config)
        stored = None
        if quant == "int8" and dev.type == "cpu":
            from voxcast.kernels import int8_store

            stored = int8_store.load(identity)
        # the float weights the stored int8 ones replace stay as stored (memory-mapped, never read)
        unused = frozenset(f"talker.{k}" for k in stored.sources) if stored is not None else frozenset()
        net = load_network(files, config, device=dev, dtype=dtype, unused=unused)
        tokenizer = TextTokenizer.from_dir(root)
        decoder = load_codec_decoder(files.speech_tokenizer, device=dev, dtype=codec_dtype or dtype)
        encoder = None
        if config.tts_model_type == "base":
            from voxcast.models.qwen3_tts.codec_encoder import load_codec_encoder

            # Mimi stays in float32: reference codes are computed once per voice.
            encoder = load_codec_encoder(files.speech_tokenizer, device=dev, dtype=torch.float32)
        model = cls(
            config=config,
            net=net,
            tokenizer=tokenizer,
            codec_decoder=decoder,
            codec_encoder=encoder,
            identity=identity,
            device=dev,
            dtype=dtype,
            prefix_cache=prefix_cache,
            accel=accel,
            int8_store=stored,
        )
        model.load_s = time.perf_counter() - t0
        logger.info("loaded %s (%s) on %s/%s in %.2f s", root, model.identity, dev, dtype, model.load_s)
        return model

    # ------------------------------------------------------------------ voices and prompts

    def make_voice_prompt(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None, x_vector_only: bool = False
    ) -> VoicePrompt:
        """Compute a cloned voice from reference audio (Base models only).

        Args:
            audio: float waveform, mono ``[L]`` or ``[L, channels]``.
            sample_rate: rate of ``audio`` (resampled to 24 kHz).
            ref_text: transcript of the clip (required unless ``x_vector_only``).
            x_vector_only: condition on the speaker vector only.

        Raises:
            InvalidRequest: not a Base model (field "ref_audio"), bad audio, missing ref_text.
        """
        if self.model_type != "base" or self.net.speaker_encoder is None or self.codec_encoder is None:
            raise InvalidRequest(f"a {self.model_type} model cannot clone voices", field="ref_audio")
        from voxcast.audio.reference import prepare_reference_audio
        from voxcast.models.qwen3_tts.voice_prompt import build_voice_prompt

        wav = prepare_reference_audio(audio, sample_rate)
        return build_voice_prompt(
            self.net.speaker_encoder,
            self.codec_encoder,
            wav,
            ref_text,
            x_vector_only=x_vector_only,
            model_identity=self.identity,
            tokenize=self._ref_text_ids,
        )

    def _ref_text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(_ref_template(text))[3:-2]

    @property
    def clones_voices(self) -> bool:
        """Whether voices can be built from reference audio (Base models)."""
        return self.model_type == "base" and self.codec_encoder is not None

    @property
    def cloning_refusal(self) -> str:
        """Why it builds no voices (:class:`~voxcast.models.base.ExplainsCloning`)."""
        return f"voice cloning needs a Base model; this one is {self.model_type}"

    def make_voice(
        self, audio: np.ndarray, sample_rate: int, ref_text: str | None, x_vector_only: bool
    ) -> VoicePrompt:
        """The model protocol's voice builder: :meth:`make_voice_prompt`."""
        return self.make_voice_prompt(audio, sample_rate, ref_text, x_vector_only)

    def voice_from_bytes(self, data: bytes) -> VoicePrompt:
        """A stored voice (:meth:`VoicePrompt.to_bytes`), checked to be this model's."""
        from voxcast.models.qwen3_tts.voice_prompt import VoicePrompt

        return VoicePrompt.from_bytes(data, expected_identity=self.identity)

    def warmup_cases(self, reference: np.ndarray, reference_text: str) -> list[WarmupCase]:
        """The voice modes of this checkpoint: a named speaker, a described voice, or cloned voices
        (ICL, and x-vector only, greedy) built from ``reference`` (24 kHz)."""
        if self.model_type == "custom_voice":
            return [WarmupCase({"voice": self.speakers[0]})]
        if self.model_type == "voice_design":
            return [WarmupCase({"instruct": "A calm, clear voice."})]
        sr = self.sample_rate
        icl = self.make_voice_prompt(reference, sr, ref_text=reference_text, x_vector_only=False)
        xvec = self.make_voice_prompt(reference, sr, ref_text=None, x_vector_only=True)
        return [WarmupCase({}, icl), WarmupCase({}, xvec, sampled=False)]

    def render_settings(self) -> dict[str, object]:
        """What changes the audio besides the checkpoint's weights (the engine adds it to the audio
        cache key): int8 weights draw other codes, so their renders are keyed apart (float renders
        keep their keys)."""
        return {"quant": "int8"} if self.quant == "int8" else {}

    def runtime_report(self) -> dict[str, object]:
        """The kernel choices made at load and the measurements behind them (JSON-able)."""
        report = self.accel.as_dict()
        report["int8_kernel_variant"] = report.pop("int8_variant")
        return {"device": str(self.device), **report, "codec_small_gemm": self.codec_decoder.small_gemm}

    def build_prompt(
        self,
        text: str,
        *,
        speaker: str | None = None,
        voice: VoicePrompt | None = None,
        language: str = "auto",
        instruct: str | None = None,
        non_streaming_text: bool | None = None,
    ) -> Prompt:
        """The prefill for one request; see :meth:`PromptBuilder.build`.

        Raises:
            InvalidRequest: the request does not fit this model (field names the input at fault).
        """
        self._check_voice(voice)
        return self._prompts.build(
            text,
            speaker=speaker,
            voice=voice,
            language=language,
            instruct=instruct,
            non_streaming_text=non_streaming_text,
        )

    def open_prompt(
        self,
        *,
        speaker: str | None = None,
        voice: VoicePrompt | None = None,
        language: str = "auto",
        instruct: str | None = None,
        non_streaming_text: bool | None = None,
    ) -> OpenPrompt | None:
        """A prompt for text that arrives in pieces (:mod:`.open_prompt`), or None where the layout
        needs the whole text first (``non_streaming_text=True``). Unlike :meth:`build_prompt`, text
        streams by default here, whatever the voice mode.

        Raises:
            InvalidRequest: the request does not fit this model (field names the input at fault).
        """
        if non_streaming_text:
            return None
        self._check_voice(voice)
        head = self._prompts.open(speaker=speaker, voice=voice, language=language, instruct=instruct)
        return OpenPrompt(self._prompts, head)

    def _check_voice(self, voice: VoicePrompt | None) -> None:
        if (
            self.model_type == "base"
            and voice is not None
            and voice.model_identity not in ("", self.identity)
        ):
            raise InvalidRequest("this voice was made by another model; recreate it", field="voice")

    # ------------------------------------------------------------------ generation

    def prepare_batches(self, max_batch: int) -> None:
        """Record the talker's and the code predictor's steps for every batch size up to ``max_batch``
        (if traced), or compile the code predictor's for every batch bucket (with ``compile``)."""
        if self.batched is not None:
            self.batched.prepare(max_batch)
        if self.talker.static is not None:
            self.talker.static.prepare(max_batch)
        traced = self.talker.code_predictor.traced
        if traced is not None:
            with torch.inference_mode():
                traced.prepare_upto(max_batch)
        if self.talker.traced is not None:
            self.talker.traced.prepare_upto(max_batch)

    def new_generator(
        self, prompt: Prompt | OpenPrompt, sampling: SamplingParams, max_frames: int
    ) -> FrameGenerator:
        """A :class:`FrameGenerator` for ``prompt`` (seeded by ``sampling.seed``; None = random).

        With :attr:`prefix_cache_enabled` its prefill reuses (or fills) :attr:`prefix_kv`.
        """
        return FrameGenerator(
            self.talker,
            prompt,
            SamplerSettings.from_params(sampling),
            max_frames,
            seed=sampling.seed,
            prefix_cache=self.prefix_kv if self.prefix_cache_enabled else None,
        )

    def step_many(self, generators: list[FrameGenerator]) -> list[torch.Tensor | None]:
        """One frame for each generator in one batched step (see :func:`~.generator.step_many`; with
        ``batch_graphs``, :meth:`~.accel.batch_frames.BatchedFrames.step_many`)."""
        if self.batched is not None:
            return self.batched.step_many(generators)
        return step_many(generators)

    def new_decoder(self, voice: VoicePrompt | None = None, seed: int | None = None) -> StreamingDecoder:
        """A streaming codec decoder; for an ICL voice, primed with its reference codes (once per voice).
        The codec decoder draws no noise: ``seed`` is not used."""
        if voice is None or voice.ref_codes is None:
            return self.codec_decoder.new_stream()
        return self._primed_decoder(voice).clone()

    def prime_voice(self, voice: VoicePrompt, *, prefix: bool = True) -> VoicePrompt:
        """Prepare ``voice``'s per-voice state now, so that its first request does not.

        Two parts: the codec decoder run over the voice's reference codes (an ICL voice's audio-decoder
        state, ~90 ms for a 3 s reference on 2 CPU cores), and with ``prefix`` and the prefix cache on,
        its constant prompt prefix's keys/values for language "auto" (:meth:`fill_prefix`). Both are
        otherwise done by the voice's first request, on the scheduler thread, where the priming also
        stalls every other active stream. Safe to call from any thread, concurrently with synthesis;
        parts already done, or not applicable (no reference codes), are skipped.
        """
        if voice.ref_codes is not None:
            self._primed_decoder(voice)
        if prefix:
            self.fill_prefix(voice=voice)
        return voice

    def fill_prefix(self, *, voice: VoicePrompt | None = None, speaker: str | None = None) -> bool:
        """Compute the constant prompt prefix of ``voice`` (or named ``speaker``) into :attr:`prefix_kv`.

        Runs only the prefix positions (role, tags, speaker slot, and for an ICL voice its
        reference-text positions) of a request in language "auto" without instruct, with the model's
        default text mode, so such a request's first prefill is already a hit and runs only the rest
        (equal to a one-pass prefill up to rounding, like any hit: see :mod:`.prefix_cache`). Safe to
        call from any thread.

        Returns:
            True when computed now; False when the prefix cache is off, the prompt has no prefix, or
            it is already cached.
        """
        if not self.prefix_cache_enabled:
            return False
        prompt = self.build_prompt(_PREFIX_TEXT, speaker=speaker, voice=voice)
        if prompt.prefix_key is None or prompt.prefix_key in self.prefix_kv:
            return False
        gen = self.new_generator(prompt, SamplingParams(greedy=True), max_frames=1)
        gen.prefill_part(prompt.prefix_len)  # stores the prefix once its last position is in
        return True

    def fill_speaker_prefixes(self) -> int:
        """:meth:`fill_prefix` for every named speaker (CustomVoice); returns how many were computed."""
        if self.model_type != "custom_voice":
            return 0
        return sum(self.fill_prefix(speaker=speaker) for speaker in self.speakers)

    def _primed_decoder(self, voice: VoicePrompt) -> StreamingDecoder:
        """The primed decoder of ``voice`` from the LRU of :data:`PRIMED_DECODERS`, primed on a miss.

        Keyed by ``id(voice)`` and checked by identity (an id may be reused after a voice is freed).
        The lock guards the LRU only: two threads missing the same voice both prime it (same state).
        """
        key = id(voice)
        with self._primed_lock:
            hit = self._primed.get(key)
            if hit is not None and hit[0] is voice:
                self._primed.move_to_end(key)
                return hit[1]
        primed = self.codec_decoder.new_stream(prime_codes=voice.ref_codes)
        with self._primed_lock:
            self._primed[key] = (voice, primed)
            self._primed.move_to_end(key)
            while len(self._primed) > PRIMED_DECODERS:
                self._primed.popitem(last=False)
        return primed
