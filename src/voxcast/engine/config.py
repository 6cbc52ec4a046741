"""Configuration: frozen dataclasses built once from an environment mapping.

Every setting has an environment variable (``VOXCAST_*``) and a documented default here; CLI flags
mirror the names. Nothing reads ``os.environ`` at import time: call ``from_env(os.environ)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voxcast.envvars import env_bool, env_float, env_int, env_str
from voxcast.models import registry

__all__ = ["EngineConfig", "max_frames_for_text"]

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
"""Hub id used when VOXCAST_MODEL is not set (needs the weights in the HF cache or network)."""

DEFAULT_FIRST_CHUNK_FRAMES = 1
"""First audio after one frame (80 ms of audio): the lowest time to first audio."""

DEFAULT_CHUNK_FRAMES = 4
"""Later chunks carry 4 frames (320 ms). Measured with scripts/bench_codec.py (full-size decoder,
fp32, 2 CPU cores): the stateful decoder costs 109 ms/frame in 1-frame chunks, 81 at 2, 59 at 4 and 57
at 8 (bf16: 60/41/30/27), so 4 frames take most of the gain while a listener waits at most 320 ms for the next chunk, and the
per-chunk costs of the adapters (messages, base64, Redis entries) stay small."""

DEFAULT_MAX_FRAMES_CAP = 2400
"""Hard cap: 2400 frames = 192 s of audio for one piece of text (a long text is spoken in pieces,
each with its own limit: ``piece_chars``)."""

DEFAULT_PIECE_CHARS = 400
"""Texts longer than this are spoken in pieces of at most this many characters, cut at sentence
ends (:func:`voxcast.text.plan_chunks`): about 25 s of English speech a piece."""

FRAMES_PER_CHAR = 2.5
"""Upper bound of frames per input character: slow CJK speech is ~4 chars/s = 3.1 frames/char,
English ~15 chars/s = 0.8 frames/char; 2.5 plus the floor below covers both without letting a
runaway stream babble for minutes."""

MIN_FRAMES = 40
"""Floor of the derived limit (3.2 s), so one-word texts are never cut."""


def max_frames_for_text(text: str, cap: int = DEFAULT_MAX_FRAMES_CAP) -> int:
    """The most frames a request for ``text`` may generate (then it is flagged as runaway)."""
    n = len("".join(text.split()))
    return max(2, min(cap, MIN_FRAMES + math.ceil(FRAMES_PER_CHAR * n)))


def _on_off_auto(env: Mapping[str, str], name: str, default: str) -> str:
    """ "on", "off" or "auto"; any boolean spelling env_bool accepts means on or off."""
    raw = (env_str(env, name) or default).lower()
    if raw == "auto":
        return raw
    try:
        return "on" if env_bool({name: raw}, name, False) else "off"
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be on, off or auto (or 1/0, true/false)") from None


@dataclass(frozen=True)
class EngineConfig:
    """How the engine loads and runs a model.

    Attributes:
        model: local checkpoint directory or hub id (``VOXCAST_MODEL``).
        device: "auto" (CUDA if present, else CPU), "cpu", "cuda" or "cuda:N" (``VOXCAST_DEVICE``).
        dtype: "auto" (bfloat16 on CUDA, float32 on CPU), "float32" or "bfloat16" (``VOXCAST_DTYPE``).
        first_chunk_frames: frames in the first chunk (``VOXCAST_FIRST_CHUNK_FRAMES``).
        chunk_frames: frames in every later chunk (``VOXCAST_CHUNK_FRAMES``).
        max_frames_cap: cap on the per-request frame limit (``VOXCAST_MAX_FRAMES_CAP``).
        chunk_ramp: grow chunks from the first one up to ``chunk_frames`` (1, 1, 1, 1, 2, 3, 4, ...),
            each at most half as long as the audio already sent, so no stall when generation keeps up
            (``VOXCAST_CHUNK_RAMP``, on).
        warmup: run every path once at load (``VOXCAST_WARMUP``).
        threads: torch CPU threads, 0 = torch's default (``VOXCAST_THREADS``).
        max_active: streams the engine decodes at the same time (``VOXCAST_MAX_ACTIVE``); more wait.
        quant: "none", or "int8" for int8 talker/code-predictor weights on the CPU: faster, not
            bit-exact (``VOXCAST_QUANT``).
        prefix_cache: keep each voice's constant prompt prefix as key/value states and reuse it
            (``VOXCAST_PREFIX_CACHE``, on). The first request of a voice runs the official one-pass
            prefill; later ones equal it up to float rounding.
        compile: "off", "on" or "auto" (on for CUDA): torch.compile the decode steps, with CUDA
            graphs on CUDA (``VOXCAST_COMPILE``). Not bit-exact.
        decode_thread: decode audio on a second thread, overlapped with generating the next
            frames: "on", "off" or "auto" (``VOXCAST_DECODE_THREAD``, auto; 1/0 and true/false also
            work). Whether it pays depends on the machine: on 2 CPU cores it measured 0.8-1.08x on one
            (Intel, AMX) and 1.22-1.37x on another (AMD Zen 4), see scripts/bench_serving.py. "auto"
            times a short concurrent workload both ways at warm-up and keeps the faster
            (:meth:`voxcast.engine.engine.Engine.calibrate_decode_thread`); without warm-up it is off.
        codec_dtype: the audio decoder's dtype: "auto" (the model's; bfloat16 with int8 weights where
            the device computes bfloat16 natively), "float32" or "bfloat16" (``VOXCAST_CODEC_DTYPE``). bfloat16 is 2.3-2.7x faster on CPUs with AVX-512 BF16 or AMX,
            not bit-exact. Where the device has no native bfloat16 (e.g. AVX2-only CPUs), bfloat16
            settings (this and ``dtype``) run in float32, with a warning: emulated it is ~70x slower
            (:mod:`voxcast.engine.precision`).
        trace_steps: on a CPU without ``compile``, replay the code predictor's 15 intra-frame forwards
            and the talker's decode step (one row and batched rows) from ``torch.jit.trace`` recordings
            (bitwise the same outputs; 1.1x fp32, 1.4x int8 on the code predictor; the talker step
            0.66x the time with int8, one row or batched; warm-up records batch sizes 1, 2, 4, ... up
            to ``max_active``, ~4-9 s per batched talker size on 2 cores) (``VOXCAST_TRACE_STEPS``, on).
        prefill_chunk: while other streams decode, a new request's prefill runs this many prompt
            positions per scheduler round, between their frames (``VOXCAST_PREFILL_CHUNK``; 0 = whole
            prefill at once). A lone request always gets the one-pass prefill.
        piece_chars: a text longer than this is planned into pieces of at most this many characters,
            cut at sentence ends, and spoken in order in one stream with one voice, decoder and seed;
            each piece has its own frame limit and runaway guard, and the next piece is prefilled
            while the current one plays (``VOXCAST_PIECE_CHARS``, 400; 0 = never split, so a text
            is cut off at ``max_frames_cap``).
        handoff_ms: after a step that produced streams' first chunks, the scheduler waits until their
            consumers took them (at most 5 ms) and then pauses this long, on a CPU, so that the
            chunks reach their clients before the next frames take both cores
            (``VOXCAST_HANDOFF_MS``, 3; 0 = off; never on CUDA). Measured on 2 Zen 4 cores, 0.6B
            int8, one stream (medians of three alternated pairs): loopback first-byte overhead
            9.0 -> 6.0 ms (HTTP) and 7.7 -> 4.0 ms (WebSocket); no change under load
            (docs/benchmarks.md).
        idle_unload_s: after this long with no stream active or waiting and no voice being built,
            the engine releases its weights and caches (on CUDA, the allocator's cache too) and the
            next request loads and warms it again, once, however many arrive together
            (``VOXCAST_IDLE_UNLOAD_S``, 0 = never: a GPU shared with other services).
        text_wait_s: a stream whose text arrives in pieces (``Engine.open``) and gets no new text for
            this long is ended cleanly: its text is taken as complete, it speaks to its end and
            reports ``finish_reason`` "text_timeout" (``VOXCAST_TEXT_WAIT_S``, 30).
        burst_admit: while no admitted stream has produced a frame yet, admit every waiting request
            and prefill it whole (text in pieces too, once its text decides the prefill), so that
            requests arriving together start together (``VOXCAST_BURST_ADMIT``, on); off, they are
            admitted and prefilled one per round like later arrivals.
        slack_horizon_ms: while a real-time request waits for its first chunk, streams with more audio
            delivered ahead of playback than this skip rounds, so the new request's prefill and first
            frames run sooner; streams without a listener (prerender, batch jobs, responses returned
            whole) skip too, for at most :data:`~voxcast.engine.pacing.MAX_SKIP_S` (2 s) in a row
            (``VOXCAST_SLACK_HORIZON_MS``, 300; 0 = every stream steps every round).
            The horizon is never below twice the longest of the last 16 rounds, so a skipped stream
            keeps more audio in hand than a round costs (:mod:`voxcast.engine.pacing`).
        admission: refuse a real-time request (HTTP, WebSocket) that would not keep every stream
            viable, instead of queueing it (``VOXCAST_ADMISSION``, on): the request gets
            :class:`~voxcast.errors.OverCapacity` (HTTP 503 ``over_capacity`` with ``Retry-After``).
            Queue entry points (RQ, the RunPod queue handler, prerender) are never refused: they wait.
            An idle engine always admits.
        admission_load: the share of a frame's audio duration that a measured scheduler round (the
            batched frame step, a prefill part, first-chunk decodes) may take with one more stream
            (``VOXCAST_ADMISSION_LOAD``, 0.8); before any round is measured nothing is refused for load.
        admission_queue: real-time requests that may wait for a free slot once ``max_active``
            streams run (``VOXCAST_ADMISSION_QUEUE``, 0: refused at once, since a queued request's
            first audio waits for a running stream to end).
        families: modules of more model families to serve (``VOXCAST_FAMILIES``, comma-separated;
            each defines ``FAMILY``, see :func:`voxcast.models.registry.register`).
        settings: the model families' own settings by name, each read from its variable
            (Qwen3-TTS's ``int8_kernel``, ``fused_ops``, ``f32_rows``: ``VOXCAST_INT8_KERNEL``...;
            Chatterbox Turbo's ``turbo_*``: ``VOXCAST_TURBO_*``; docs/configuration.md), checked by
            the family that declares them (:class:`voxcast.models.family.Setting`); unset ones
            take the family's defaults. The family of the loaded checkpoint reads its own.
    """

    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    first_chunk_frames: int = DEFAULT_FIRST_CHUNK_FRAMES
    chunk_frames: int = DEFAULT_CHUNK_FRAMES
    max_frames_cap: int = DEFAULT_MAX_FRAMES_CAP
    chunk_ramp: bool = True
    warmup: bool = True
    threads: int = 0
    max_active: int = 8
    quant: str = "none"
    prefix_cache: bool = True
    compile: str = "off"
    decode_thread: str = "auto"
    prefill_chunk: int = 16
    burst_admit: bool = True
    piece_chars: int = DEFAULT_PIECE_CHARS
    idle_unload_s: float = 0.0
    handoff_ms: float = 3.0
    text_wait_s: float = 30.0
    codec_dtype: str = "auto"
    trace_steps: bool = True
    slack_horizon_ms: float = 300.0
    admission: bool = True
    admission_load: float = 0.8
    admission_queue: int = 0
    families: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for module in self.families:
            registry.register(module)
        object.__setattr__(self, "settings", registry.check_settings(self.settings))
        if self.dtype not in {"auto", "float32", "bfloat16"}:
            raise ValueError(f"VOXCAST_DTYPE must be auto, float32 or bfloat16, not {self.dtype!r}")
        if not (self.device in {"auto", "cpu", "cuda"} or self.device.startswith("cuda:")):
            raise ValueError(f"VOXCAST_DEVICE must be auto, cpu, cuda or cuda:N, not {self.device!r}")
        if self.quant not in {"none", "int8"}:
            raise ValueError(f"VOXCAST_QUANT must be none or int8, not {self.quant!r}")
        if self.codec_dtype not in {"auto", "float32", "bfloat16"}:
            raise ValueError(
                f"VOXCAST_CODEC_DTYPE must be auto, float32 or bfloat16, not {self.codec_dtype!r}"
            )
        if self.prefill_chunk < 0:
            raise ValueError("prefill_chunk must be >= 0")
        if not 0 <= self.handoff_ms <= 50:
            raise ValueError(f"VOXCAST_HANDOFF_MS must be within [0, 50] (0 = off), not {self.handoff_ms}")
        if self.idle_unload_s < 0:
            raise ValueError(f"VOXCAST_IDLE_UNLOAD_S must be >= 0 (0 = never), not {self.idle_unload_s}")
        if self.slack_horizon_ms < 0:
            raise ValueError(f"VOXCAST_SLACK_HORIZON_MS must be >= 0 (0 = off), not {self.slack_horizon_ms}")
        if not 0 < self.admission_load <= 10:
            raise ValueError(f"VOXCAST_ADMISSION_LOAD must be within (0, 10], not {self.admission_load}")
        if self.admission_queue < 0:
            raise ValueError(f"VOXCAST_ADMISSION_QUEUE must be >= 0, not {self.admission_queue}")
        if self.piece_chars != 0 and self.piece_chars < 20:
            raise ValueError(f"VOXCAST_PIECE_CHARS must be 0 (off) or >= 20, not {self.piece_chars}")
        if isinstance(self.decode_thread, bool):  # EngineConfig(decode_thread=True) as before
            object.__setattr__(self, "decode_thread", "on" if self.decode_thread else "off")
        if self.decode_thread not in {"off", "on", "auto"}:
            raise ValueError(f"VOXCAST_DECODE_THREAD must be on, off or auto, not {self.decode_thread!r}")
        if self.compile not in {"off", "on", "auto"}:
            raise ValueError(f"VOXCAST_COMPILE must be off, on or auto, not {self.compile!r}")
        for name in ("first_chunk_frames", "chunk_frames", "max_frames_cap", "max_active"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> EngineConfig:
        """Build from ``VOXCAST_*`` variables; unset ones keep their defaults. The families named in
        ``VOXCAST_FAMILIES`` are registered first, so that their settings are read too."""
        d = cls()
        families = registry.register_from_env(env)
        return cls(
            model=env.get("VOXCAST_MODEL", d.model),
            device=env.get("VOXCAST_DEVICE", d.device),
            dtype=env.get("VOXCAST_DTYPE", d.dtype),
            first_chunk_frames=env_int(env, "VOXCAST_FIRST_CHUNK_FRAMES", d.first_chunk_frames),
            chunk_frames=env_int(env, "VOXCAST_CHUNK_FRAMES", d.chunk_frames),
            max_frames_cap=env_int(env, "VOXCAST_MAX_FRAMES_CAP", d.max_frames_cap),
            chunk_ramp=env_bool(env, "VOXCAST_CHUNK_RAMP", d.chunk_ramp),
            warmup=env_bool(env, "VOXCAST_WARMUP", d.warmup),
            threads=env_int(env, "VOXCAST_THREADS", d.threads),
            max_active=env_int(env, "VOXCAST_MAX_ACTIVE", d.max_active),
            quant=(env_str(env, "VOXCAST_QUANT") or d.quant).lower(),
            prefix_cache=env_bool(env, "VOXCAST_PREFIX_CACHE", d.prefix_cache),
            compile=(env_str(env, "VOXCAST_COMPILE") or d.compile).lower(),
            decode_thread=_on_off_auto(env, "VOXCAST_DECODE_THREAD", d.decode_thread),
            prefill_chunk=env_int(env, "VOXCAST_PREFILL_CHUNK", d.prefill_chunk),
            burst_admit=env_bool(env, "VOXCAST_BURST_ADMIT", d.burst_admit),
            piece_chars=env_int(env, "VOXCAST_PIECE_CHARS", d.piece_chars),
            idle_unload_s=env_float(env, "VOXCAST_IDLE_UNLOAD_S", d.idle_unload_s, lo=0.0),
            handoff_ms=env_float(env, "VOXCAST_HANDOFF_MS", d.handoff_ms, lo=0.0, hi=50.0),
            text_wait_s=env_float(env, "VOXCAST_TEXT_WAIT_S", d.text_wait_s, lo=0.1),
            trace_steps=env_bool(env, "VOXCAST_TRACE_STEPS", d.trace_steps),
            codec_dtype=(env_str(env, "VOXCAST_CODEC_DTYPE") or d.codec_dtype).lower(),
            slack_horizon_ms=env_float(env, "VOXCAST_SLACK_HORIZON_MS", d.slack_horizon_ms, lo=0.0),
            admission=env_bool(env, "VOXCAST_ADMISSION", d.admission),
            admission_load=env_float(env, "VOXCAST_ADMISSION_LOAD", d.admission_load, positive=True, hi=10.0),
            admission_queue=env_int(env, "VOXCAST_ADMISSION_QUEUE", d.admission_queue, lo=0),
            families=families,
            settings=registry.settings_from_env(env),
        )

    def resolved_compile(self) -> bool:
        """Whether to torch.compile the decode steps on the resolved device."""
        if self.compile == "auto":
            return self.resolved_device().startswith("cuda")
        return self.compile == "on"

    def resolved_device(self) -> str:
        """The torch device string this config selects on this machine."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

    def resolved_dtype(self) -> str:
        """ "bfloat16" or "float32" for the resolved device."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.resolved_device().startswith("cuda") else "float32"
