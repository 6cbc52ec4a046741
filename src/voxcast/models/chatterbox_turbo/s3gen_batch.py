"""Streamed flow windows, one at a time or several streams' at once.

A :class:`FlowWindow` is what one streamed window needs (the host part, prepared by
:meth:`~.s3gen_stream.TurboAudioStream.plan`): its voice, its tokens and their noise.
:func:`run_window` runs one as the stream always has; :func:`run_windows` runs several, of any streams,
voices and lengths, in at most two batched flow calls (windows that continue a voice's prompt cache;
exact windows that carry their prompt), padded and masked by :class:`~.s3gen_rows.PaddedRows` so that
each window's mel equals its mel alone up to float rounding (docs/chatterbox-turbo.md: measured
differences). On a GPU a window is launch-bound (a few thousand small kernels), so one call for all
ready windows costs about what one window does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from voxcast.models.chatterbox_turbo.s3gen_flow import MELS_PER_TOKEN, S3GenFlow
from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache
from voxcast.models.chatterbox_turbo.s3gen_rows import PaddedRows

__all__ = ["FlowVoice", "FlowWindow", "run_window", "run_windows"]


@dataclass(frozen=True)
class FlowVoice:
    """A stream's voice as the flow takes it, on the model's device.

    Attributes:
        tokens / mel / noise: the S3Gen prompt ``[1, P]``, its mel and its pinned noise ``[1, 80, 2P]``.
        xvector: ``[1, 192]``.
        cache: the prompt's :class:`PromptCache` (windows continue it), or None (exact windows).
    """

    tokens: Tensor
    mel: Tensor
    noise: Tensor
    xvector: Tensor
    cache: PromptCache | None


@dataclass(frozen=True)
class FlowWindow:
    """One window: ``tokens`` (N ids, checked) and their noise ``[1, 80, 2N]`` (float32, on the host)."""

    voice: FlowVoice
    tokens: list[int]
    noise: Tensor


def _device(voice: FlowVoice) -> tuple[torch.device, torch.dtype]:
    return voice.noise.device, voice.noise.dtype


def _to(t: Tensor, voice: FlowVoice, dtype: torch.dtype | None = None) -> Tensor:
    """A host tensor on the model's device without waiting for the copy (see ``s3gen_stream.to_device``)."""
    return t.to(device=voice.noise.device, dtype=dtype, non_blocking=True)


def run_window(flow: S3GenFlow, w: FlowWindow) -> Tensor:
    """The window's mel ``[1, 80, 2N]`` alone (the prompt cache's continuation, or the exact window)."""
    v = w.voice
    tokens, noise = _to(torch.tensor([w.tokens]), v), _to(w.noise, v, v.noise.dtype)
    with torch.inference_mode():
        if v.cache is not None:
            return flow.continue_prompt(v.cache, v.xvector, tokens, noise, check_ids=False)
        noise = torch.cat((v.noise, noise), dim=-1)
        return flow(v.tokens, v.mel, v.xvector, tokens, noise, check_ids=False)


def run_windows(flow: S3GenFlow, windows: Sequence[FlowWindow]) -> list[Tensor]:
    """Each window's mel ``[1, 80, 2N]``, as :func:`run_window` gives it, the windows batched: those
    with a prompt cache in one call, the exact ones in another (a group of one runs alone)."""
    out: list[Tensor | None] = [None] * len(windows)
    cached = [i for i, w in enumerate(windows) if w.voice.cache is not None]
    exact = [i for i, w in enumerate(windows) if w.voice.cache is None]
    for group, run in ((cached, _continued), (exact, _exact)):
        if len(group) == 1:
            out[group[0]] = run_window(flow, windows[group[0]])
        elif group:
            for i, mel in zip(group, run(flow, [windows[i] for i in group]), strict=True):
                out[i] = mel
    return [m for m in out if m is not None]


def _continued(flow: S3GenFlow, windows: list[FlowWindow]) -> list[Tensor]:
    """Windows after their voices' prompt caches: new rows right-padded, prompts left-padded."""
    lengths = [len(w.tokens) for w in windows]
    longest = max(lengths)
    v = windows[0].voice
    tokens = torch.tensor([w.tokens + [0] * (longest - len(w.tokens)) for w in windows])  # [B, T]
    noise = torch.cat(
        [F.pad(w.noise, (0, MELS_PER_TOKEN * (longest - n))) for w, n in zip(windows, lengths, strict=True)]
    )
    caches = [w.voice.cache for w in windows]
    rows = PaddedRows(lengths, [c for c in caches if c is not None], _device(v)[0])
    xvector = torch.cat([torch.atleast_2d(w.voice.xvector) for w in windows])
    with torch.inference_mode():
        mel = flow.continue_prompt(
            rows, xvector, _to(tokens, v), _to(noise, v, v.noise.dtype), check_ids=False
        )
    return [mel[i : i + 1, :, : MELS_PER_TOKEN * n] for i, n in enumerate(lengths)]


def _exact(flow: S3GenFlow, windows: list[FlowWindow]) -> list[Tensor]:
    """Exact windows, each row ``[its voice's prompt | its window]``, right-padded."""
    v = windows[0].voice
    device, dtype = _device(v)
    prompts = [w.voice.tokens.shape[1] for w in windows]
    lengths = [p + len(w.tokens) for p, w in zip(prompts, windows, strict=True)]
    longest = max(lengths)
    frames = MELS_PER_TOKEN * longest
    with torch.inference_mode():
        tokens = torch.zeros(len(windows), longest, dtype=torch.long, device=device)
        cond = torch.zeros(len(windows), v.mel.shape[1], frames, device=device, dtype=dtype)
        noise = torch.zeros_like(cond)
        for i, (w, p, n) in enumerate(zip(windows, prompts, lengths, strict=True)):
            tokens[i, :p] = w.voice.tokens[0]
            tokens[i, p:n] = _to(torch.tensor(w.tokens), w.voice)
            cond[i, :, : MELS_PER_TOKEN * p] = w.voice.mel[0]
            noise[i, :, : MELS_PER_TOKEN * n] = torch.cat(
                (w.voice.noise[0], _to(w.noise[0], v, dtype)), dim=-1
            )
        xvector = torch.cat([torch.atleast_2d(w.voice.xvector) for w in windows])
        mel = flow.rows(tokens, cond, xvector, noise, PaddedRows(lengths, None, device))
    return [
        mel[i : i + 1, :, MELS_PER_TOKEN * p : MELS_PER_TOKEN * n]
        for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
