"""S3Gen streamed: speech tokens in as T3 writes them, audio out, each sample once and never revised.

The one-pass reference (the official ``S3Token2Wav.inference``) runs the flow over ``[prompt | all
tokens + 3 x silence]`` and HiFT over the whole mel. Neither is causal: the flow's encoder sees 3
tokens ahead and attends to every token, the estimator attends to every frame. So a chunk of tokens
``[a, b)`` is run through the flow in a window: the voice's prompt, ``left`` tokens before ``a`` and
``right`` tokens after ``b`` (the look-ahead), and only the chunk's frames are kept; they go to a
:class:`~.hift_stream.HiFTStream`, which adds HiFT's own look-ahead and carries the source's phase.

Noise is pinned, so the stream is a function of the tokens and the seed, not of the chunking: the
prompt frames' noise per voice (:func:`prompt_noise`, fixed), each generated token's two frames drawn
in order from the request's generator as the token arrives, HiFT's from a second generator. The same
tokens and noise through :func:`one_pass` give the reference the stream is measured against
(scripts/bench_chatterbox_turbo.py; docs/chatterbox-turbo.md has the figures).

Several streams' pushes run their flow windows together in one batched call (:func:`push_many`,
:mod:`.s3gen_batch`): a push is split into :meth:`TurboAudioStream.plan` (host work: the tokens and
noise of each window now ready) and :meth:`TurboAudioStream.complete` (the windows' mels through
HiFT, per stream), with the flow calls between them.

Chunks follow a ramp (``first``, then growing to ``chunk`` tokens), so the first audio comes after a
few tokens and later flow calls, whose cost is mostly the prompt's, come less often. Each call costs
the window's length (prompt + left + chunk + right), whatever the utterance's length.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from voxcast.models.base import LoadOptions
from voxcast.models.chatterbox_turbo.hift import SAMPLES_PER_FRAME, HiFT
from voxcast.models.chatterbox_turbo.hift_stream import HiFTStream
from voxcast.models.chatterbox_turbo.s3gen_batch import FlowVoice, FlowWindow, run_window, run_windows
from voxcast.models.chatterbox_turbo.s3gen_flow import MELS, MELS_PER_TOKEN, VOCAB, S3GenFlow
from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache

__all__ = [
    "SILENCE",
    "StreamSettings",
    "TurboAudioStream",
    "one_pass",
    "prompt_cache",
    "prompt_noise",
    "push_many",
    "trim_fade",
]

#: The silence token upstream appends three times after T3's last token.
SILENCE = 4299
TAIL = (SILENCE, SILENCE, SILENCE)
#: Seed of the prompt frames' noise (the same for every voice of a given prompt length).
PROMPT_NOISE_SEED = 0x5EED
SAMPLES_PER_TOKEN = MELS_PER_TOKEN * SAMPLES_PER_FRAME  # 960 at 24 kHz


@dataclass(frozen=True)
class StreamSettings:
    """Windows and chunk sizes, in speech tokens (40 ms each) unless named frames.

    Attributes:
        first: tokens in the first flow chunk.
        chunk: tokens in later chunks (the ramp doubles from ``first`` up to this).
        left / right: tokens of context before and look-ahead after a chunk in the flow's window.
        hift_left / hift_right: mel frames of context for HiFT (:class:`HiFTStream`).
        prompt_tokens: keep only the last this many tokens of the voice's S3Gen prompt (0: all). A
            shorter prompt cuts the flow's cost almost proportionally; it changes the audio.
        prompt_cache: compute the voice prompt's rows once per voice, as if the prompt were alone,
            and only each window's new rows per call (:mod:`.s3gen_prefix`; 0: recompute the prompt
            in every window, the exact window). Cheaper by the prompt's share of a window; the
            change in the audio is measured in docs/chatterbox-turbo.md.
    """

    first: int = 8
    chunk: int = 32
    left: int = 16
    right: int = 4
    hift_left: int = 16
    hift_right: int = 10
    prompt_tokens: int = 0
    prompt_cache: int = 1

    def as_dict(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in self.__dataclass_fields__}

    @classmethod
    def from_options(cls, options: LoadOptions) -> StreamSettings:
        """The settings the loader was given (``turbo_first_tokens``, ``turbo_chunk_tokens``,
        ``turbo_left_tokens``, ``turbo_right_tokens``, ``turbo_prompt_tokens``: ``VOXCAST_TURBO_*``),
        the defaults for the rest; the chunk is at least the first chunk."""
        d = cls()

        def get(name: str, default: int) -> int:
            value = options.setting(name)
            return default if value is None else int(value)

        first = get("turbo_first_tokens", d.first)
        return cls(
            first=first,
            chunk=max(first, get("turbo_chunk_tokens", d.chunk)),
            left=get("turbo_left_tokens", d.left),
            right=get("turbo_right_tokens", d.right),
            prompt_tokens=get("turbo_prompt_tokens", d.prompt_tokens),
            prompt_cache=int(bool(get("turbo_prompt_cache", d.prompt_cache))),
        )

    def trim_prompt(self, prompt_tokens: Tensor, prompt_mel: Tensor) -> tuple[Tensor, Tensor]:
        """The voice's S3Gen prompt ``[1, P]`` / ``[1, 80, 2P]`` cut to its last ``prompt_tokens``."""
        if self.prompt_tokens and prompt_tokens.shape[1] > self.prompt_tokens:
            return prompt_tokens[:, -self.prompt_tokens :], prompt_mel[
                ..., -MELS_PER_TOKEN * self.prompt_tokens :
            ]
        return prompt_tokens, prompt_mel


def trim_fade(samples: int = SAMPLES_PER_TOKEN) -> Tensor:
    """Upstream's start of every utterance: 20 ms of silence, then a 20 ms raised-cosine fade-in."""
    n = samples // 2
    fade = torch.zeros(2 * n)
    fade[n:] = (torch.cos(torch.linspace(torch.pi, 0, n)) + 1) / 2
    return fade


@functools.lru_cache(maxsize=8)
def prompt_noise(frames: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The pinned noise of a voice prompt's ``frames`` mel frames ``[1, 80, frames]`` (drawn once per
    length, device and dtype; callers must not write into it)."""
    g = torch.Generator(device="cpu").manual_seed(PROMPT_NOISE_SEED)
    with torch.inference_mode(False):  # a normal tensor, usable in and out of inference mode
        return torch.randn(1, MELS, frames, generator=g).to(device=device, dtype=dtype)


def prompt_cache(flow: S3GenFlow, prompt_tokens: Tensor, prompt_mel: Tensor, xvector: Tensor) -> PromptCache:
    """A voice prompt's :class:`~.s3gen_prefix.PromptCache` with its pinned noise (the prompt already
    trimmed by :meth:`StreamSettings.trim_prompt`)."""
    weight = flow.input_embedding.weight
    noise = prompt_noise(MELS_PER_TOKEN * prompt_tokens.shape[1], weight.device, weight.dtype)
    with torch.inference_mode():
        return flow.prompt_cache(prompt_tokens, prompt_mel, xvector, noise)


def token_noise(generator: torch.Generator, tokens: int) -> list[Tensor]:
    """Each token's two frames ``[1, 80, 2]`` drawn in order (one draw per token), on the host."""
    return [torch.randn(1, MELS, MELS_PER_TOKEN, generator=generator) for _ in range(tokens)]


def to_device(t: Tensor, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """A host tensor copied to ``device`` without waiting for it: a blocking copy to a GPU
    synchronises the stream (PyTorch waits for the copy), which stalls the host behind all queued
    work. Copies from pageable host memory are staged before the call returns, so the source may be
    freed at once."""
    return t.to(device=device, dtype=dtype, non_blocking=True)


def one_pass(
    flow: S3GenFlow,
    hift: HiFT,
    prompt_tokens: Tensor,
    prompt_mel: Tensor,
    xvector: Tensor,
    tokens: Tensor,
    noise: Tensor,
    hift_stream_noise: HiFTStream | None = None,
) -> Tensor:
    """The whole utterance at once: ``[samples]`` of ``tokens [1, N]`` (the tail included) with the
    flow's ``noise [1, 80, 2 (P + N)]`` and HiFT's source noise from ``hift_stream_noise`` (a stream's
    replayed noise) or fresh."""
    with torch.inference_mode():
        mel = flow(prompt_tokens, prompt_mel, xvector, tokens, noise)
        mel = mel.to(hift.conv_pre.weight.dtype)
        if hift_stream_noise is None:
            audio = hift.inference(mel)[0]
        else:
            f0 = hift.f0(mel)
            audio = hift.decode(mel, hift.source(f0, hift_stream_noise.noise))[0]
        fade = trim_fade().to(audio)
        audio[: len(fade)] *= fade[: len(audio)]
        return audio


@dataclass(frozen=True)
class Planned:
    """A window :meth:`TurboAudioStream.plan` prepared: the flow's input and where its chunk
    ``[a, b)`` sits in the window of tokens ``[lo, hi)``."""

    window: FlowWindow
    a: int
    b: int
    lo: int
    hi: int


class TurboAudioStream:
    """One utterance's audio from its speech tokens (batch 1; driven from one thread).

    Args:
        flow / hift: the model's S3Gen parts.
        prompt_tokens / prompt_mel / xvector: the voice's S3Gen conditionals (``[1, P]``, ``[1, 80, 2P]``,
            ``[1, 192]``), on the model's device.
        seed: the request's seed (the generated frames' flow noise and HiFT's noise derive from it).
        settings: windows and chunk sizes.
        cache: the voice's prompt cache (:func:`prompt_cache`), when ``settings.prompt_cache``;
            computed here when not given.
    """

    def __init__(
        self,
        flow: S3GenFlow,
        hift: HiFT,
        prompt_tokens: Tensor,
        prompt_mel: Tensor,
        xvector: Tensor,
        seed: int,
        settings: StreamSettings | None = None,
        cache: PromptCache | None = None,
    ) -> None:
        s = settings or StreamSettings()
        self.flow, self.hift, self.settings = flow, hift, s
        prompt_tokens, prompt_mel = s.trim_prompt(prompt_tokens, prompt_mel)
        self.prompt_tokens, self.prompt_mel, self.xvector = prompt_tokens, prompt_mel, xvector
        weight = flow.input_embedding.weight
        self.device, self.dtype = weight.device, weight.dtype
        frames = MELS_PER_TOKEN * prompt_tokens.shape[1]
        self.prompt_z = prompt_noise(frames, self.device, self.dtype)
        if cache is None and s.prompt_cache and prompt_tokens.shape[1] >= 2:
            cache = prompt_cache(flow, prompt_tokens, prompt_mel, xvector)
        self.cache = cache if s.prompt_cache else None
        self.voice = FlowVoice(prompt_tokens, prompt_mel, self.prompt_z, xvector, self.cache)
        self._flow_gen = torch.Generator(device="cpu").manual_seed(seed)
        hift_gen = torch.Generator(device=hift.conv_pre.weight.device).manual_seed(seed + 1)
        self.hift_stream = HiFTStream(hift, generator=hift_gen, left=s.hift_left, right=s.hift_right)
        self.tokens: list[int] = []
        self._noise: list[Tensor] = []  # each token's flow noise [1, 80, 2], float32 on the host
        self._done = 0  # tokens whose mel went to HiFT
        self._chunk = s.first
        self._samples = 0
        self._fade = to_device(trim_fade(), hift.conv_pre.weight.device)
        self._finished = False
        #: (chunk tokens, window tokens, seconds: flow and HiFT; a batched flow call's share)
        self.flow_calls: list[tuple[int, int, float]] = []

    @property
    def noise(self) -> Tensor:
        """The flow noise ``[1, 80, 2 (P + N)]`` of every token so far (for :func:`one_pass`)."""
        return torch.cat((self.prompt_z, self._noise_of(0, len(self.tokens))), dim=-1)

    def _noise_of(self, lo: int, hi: int) -> Tensor:
        """The flow noise ``[1, 80, 2 (hi - lo)]`` of tokens ``[lo, hi)`` on the model's device."""
        noise = torch.cat(self._noise[lo:hi], dim=-1) if hi > lo else torch.zeros(1, MELS, 0)
        return to_device(noise, self.device, self.dtype)

    def push(self, tokens: list[int]) -> np.ndarray:
        """Add speech tokens (ids < 6561); returns the audio now final (possibly empty)."""
        return self.complete([(p, None) for p in self.plan(tokens)])

    def plan(self, tokens: list[int]) -> list[Planned]:
        """A push's host part: add ``tokens`` and prepare the flow windows now ready (the chunk
        schedule advances); :meth:`complete` takes their mels. Raises as :meth:`push` does."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        self._add(tokens)
        out = []
        while len(self.tokens) - self._done >= self._chunk + self.settings.right:
            out.append(self._window(self._done + self._chunk, final=False))
            self._chunk = min(self.settings.chunk, 2 * self._chunk)
        return out

    def complete(self, windows: Sequence[tuple[Planned, tuple[Tensor, float] | None]]) -> np.ndarray:
        """The audio of planned windows, in order: each with its mel and the seconds its flow call
        took (batched elsewhere: :func:`push_many`), or None to run its flow here."""
        return self._join([self._hift(p, mel) for p, mel in windows])

    def flush(self) -> np.ndarray:
        """The audio of every token so far, without waiting for look-ahead (the text paused: a new
        sentence, a new T3 run, comes later). The stream goes on afterwards."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        return self._drain(self.hift_stream.flush)

    def finish(self) -> np.ndarray:
        """The rest of the audio: upstream's three silence tokens added, every remaining frame decoded."""
        if self._finished:
            return np.zeros(0, dtype=np.float32)
        self._add(list(TAIL))
        self._finished = True
        return self._drain(self.hift_stream.finish)

    def _drain(self, hift_rest: Callable[[], Tensor]) -> np.ndarray:
        """Every token not yet decoded through the flow (no look-ahead), then HiFT's held frames."""
        out = []
        if len(self.tokens) > self._done:
            out.append(self._hift(self._window(len(self.tokens), final=True), None))
        with torch.inference_mode():
            out.append(self._fade_in(hift_rest()))
        return self._join(out)

    def _add(self, tokens: list[int]) -> None:
        ids = [int(t) for t in tokens]
        if any(not 0 <= t < VOCAB for t in ids):  # checked here, on the host, not by the flow (a sync)
            raise ValueError(f"speech token ids must be in [0, {VOCAB}): drop T3's start/stop tokens")
        self.tokens.extend(ids)
        self._noise.extend(token_noise(self._flow_gen, len(ids)))

    def _window(self, b: int, final: bool) -> Planned:
        """The window of the chunk ``[done, b)`` (to the last token when ``final``); the chunk counts
        as done from now on."""
        s = self.settings
        a = self._done
        lo = max(0, a - s.left)
        hi = len(self.tokens) if final else min(len(self.tokens), b + s.right)
        noise = torch.cat(self._noise[lo:hi], dim=-1)
        self._done = b
        return Planned(FlowWindow(self.voice, self.tokens[lo:hi], noise), a, b, lo, hi)

    def _hift(self, p: Planned, ran: tuple[Tensor, float] | None) -> np.ndarray:
        """A planned window's chunk through HiFT (its flow run here when ``ran`` is None)."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            mel, flow_s = (run_window(self.flow, p.window), 0.0) if ran is None else ran
            keep = mel[..., MELS_PER_TOKEN * (p.a - p.lo) : MELS_PER_TOKEN * (p.b - p.lo)]
            audio = self.hift_stream.push(keep.to(self.hift.conv_pre.weight.dtype))
        self.flow_calls.append((p.b - p.a, p.hi - p.lo, flow_s + time.perf_counter() - t0))
        return self._fade_in(audio)

    def _fade_in(self, audio: Tensor) -> np.ndarray:
        n = len(self._fade)
        if self._samples < n and len(audio):
            k = min(n - self._samples, len(audio))
            audio = audio.clone()
            audio[:k] *= self._fade[self._samples : self._samples + k].to(audio.dtype)
        self._samples += len(audio)
        return audio.float().cpu().numpy()

    @staticmethod
    def _join(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def push_many(
    streams: Sequence[TurboAudioStream], tokens: Sequence[list[int]]
) -> list[np.ndarray | Exception]:
    """:meth:`TurboAudioStream.push` for several streams (each at most once; one model), their flow
    windows in one batched call (:func:`~.s3gen_batch.run_windows`): each stream's audio equals its
    own push's up to float rounding. A stream whose own part fails (its tokens, its HiFT) gets the
    exception in its place; an error of the shared flow call is raised.

    Raises:
        ValueError: streams of different flows.
    """
    if any(s.flow is not streams[0].flow for s in streams):
        raise ValueError("streams of one model only")
    plans: list[list[Planned] | Exception] = []
    for stream, ids in zip(streams, tokens, strict=True):
        try:
            plans.append(stream.plan(ids))
        except Exception as e:
            plans.append(e)
    windows = [p.window for plan in plans if isinstance(plan, list) for p in plan]
    t0 = time.perf_counter()
    mels = iter(run_windows(streams[0].flow, windows) if windows else [])
    share = (time.perf_counter() - t0) / max(1, len(windows))
    out: list[np.ndarray | Exception] = []
    for stream, plan in zip(streams, plans, strict=True):
        if isinstance(plan, Exception):
            out.append(plan)
            continue
        ran = [(p, (next(mels), share)) for p in plan]
        try:
            out.append(stream.complete(ran))
        except Exception as e:
            out.append(e)
    return out
