"""HiFT decoded a chunk at a time: each mel frame's audio once, never revised, equal to the one-pass
decode of the same mel with the same source noise up to the measured window error.

The filter is not causal (symmetric convolutions, an STFT/iSTFT pair: about +-9.6 mel frames of
receptive field) and the source is not local (each harmonic's phase is the running sum of its frequency
from the first sample). So a chunk of frames [a, b) is decoded in a window [a - left, b + right) of the
mel, the middle kept, and the window's source is built from

- the pitch of each frame, computed once the frame has ``F0_CONTEXT`` frames after it (the F0
  predictor's five k=3 convolutions see +-5 frames; frames nearer the received edge use a provisional
  pitch, only ever in the right context);
- each harmonic's phase carried from the utterance's first sample as the running sum PyTorch's
  one-pass ``cumsum`` computes (double accumulation, the carry continuing the same sequence), so the
  source is bitwise the one-pass source;
- noise pinned per stream: phases drawn once, unit noise drawn frame by frame as frames arrive (so
  it does not depend on the chunking)
  (:attr:`HiFTStream.noise` gives the whole utterance's, for a one-pass reference).

Costs O(left + chunk + right) frames per chunk, whatever the utterance's length. Only the last
``left + F0_CONTEXT`` frames of history are kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from voxcast.models.chatterbox_turbo.hift import HARMONICS, SAMPLES_PER_FRAME, HiFT, SourceModule, SourceNoise

__all__ = ["F0_CONTEXT", "HiFTStream"]

#: Frames on each side the F0 predictor sees (five convolutions of width 3).
F0_CONTEXT = 5


class HiFTStream:
    """One utterance's audio from mel chunks (batch 1).

    Args:
        hift: the vocoder.
        generator: draws the stream's source noise (phases once, then per frame); None: a generator
            seeded at random.
        left / right: mel frames of context decoded on each side of a chunk and thrown away. ``right``
            is also the look-ahead: a frame's audio leaves once ``right`` frames follow it (or at
            :meth:`finish`); at least :data:`F0_CONTEXT`. Measured on random weights (tiny and full
            size, scripts/bench_chatterbox_hift.py): 16 / 10 frames reproduce the one-pass decode within
            rounding.
    """

    def __init__(
        self, hift: HiFT, *, generator: torch.Generator | None = None, left: int = 16, right: int = 10
    ) -> None:
        if right < F0_CONTEXT or left < 0:
            raise ValueError(
                f"HiFTStream needs right >= {F0_CONTEXT} frames (the pitch's look-ahead) and left >= 0"
            )
        device = hift.conv_pre.weight.device
        if generator is None:
            generator = torch.Generator(device=device)
            generator.seed()
        self.hift, self.generator, self.left, self.right = hift, generator, left, right
        self.device = device
        self._start = generator.get_state()  # :attr:`noise` replays the draws from here
        self._phases = SourceNoise.draw(1, 0, generator, device).phases
        self._mel = torch.zeros(1, hift.cfg.mels, 0, device=device)  # frames from self._base on
        self._noise = torch.zeros(1, HARMONICS + 1, 0, device=device)  # their samples' unit noise
        self._f0 = torch.zeros(1, 0, device=device)  # final pitch of frames self._base .. self._final
        self._carry: dict[int, Tensor] = {
            0: torch.zeros(1, HARMONICS + 1, dtype=torch.float64, device=device)
        }
        self._base = 0  # absolute index of self._mel's first frame
        self._received = 0
        self._final = 0  # frames whose pitch (and the phase carry at their start) is final
        self._emitted = 0
        self._finished = False

    @property
    def noise(self) -> SourceNoise:
        """The source noise of every frame received so far (replayed from the generator's state at
        the start, so the stream keeps none of it): a one-pass
        ``hift.decode(mel, hift.source(hift.f0(mel), stream.noise))`` is the reference."""
        replay = torch.Generator(device=self.device)
        replay.set_state(self._start)
        phases = SourceNoise.draw(1, 0, replay, self.device).phases
        return SourceNoise(phases, self._frame_noise(replay, self._received))

    @property
    def emitted_frames(self) -> int:
        return self._emitted

    @property
    def held_frames(self) -> int:
        """Mel frames of history kept (bounded by the window, not the utterance)."""
        return int(self._mel.shape[-1])

    @torch.inference_mode()
    def push(self, mel: Tensor) -> Tensor:
        """Add mel frames ``[1, 80, n]``; returns the audio ``[samples]`` of every frame now final."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        n = mel.shape[-1]
        block = self._frame_noise(self.generator, n)
        self._mel = torch.cat((self._mel, mel.to(self._mel.dtype)), dim=-1)
        self._noise = torch.cat((self._noise, block), dim=-1)
        self._received += n
        return self._emit(self._received - self.right)

    @torch.inference_mode()
    def flush(self) -> Tensor:
        """The audio of every frame received so far, without waiting for their look-ahead (a pause:
        more frames may follow, continuing the same phase; the flushed edge is decoded without its
        right context)."""
        if self._finished:
            raise RuntimeError("the stream is finished")
        return self._emit(self._received)

    @torch.inference_mode()
    def finish(self) -> Tensor:
        """The audio of the frames not yet sent (the utterance has ended)."""
        self._finished = True
        return self._emit(self._received)

    # ------------------------------------------------------------------ internals

    def _frame_noise(self, generator: torch.Generator, frames: int) -> Tensor:
        """Unit noise for ``frames`` frames, one draw per frame (so it does not depend on how the mel
        is chunked)."""
        shape = (1, HARMONICS + 1, SAMPLES_PER_FRAME)
        draws = [torch.randn(shape, generator=generator, device=self.device) for _ in range(frames)]
        return torch.cat(draws, dim=-1) if draws else torch.zeros(1, HARMONICS + 1, 0, device=self.device)

    def _settle_f0(self, upto: int) -> None:
        """Make the pitch of frames ``[self._final, upto)`` final (they have enough frames after them,
        or the utterance ended) and carry the harmonics' phase sums over them."""
        if upto <= self._final:
            return
        lo = max(self._base, self._final - F0_CONTEXT)
        hi = min(self._received, upto + F0_CONTEXT)
        f0 = self.hift.f0(self._mel[..., lo - self._base : hi - self._base])[:, self._final - lo : upto - lo]
        self._f0 = torch.cat((self._f0, f0), dim=-1)
        cycles = SourceModule.harmonics(HiFT.upsample(f0)).double()  # [1, 9, frames * 480]
        start = self._carry[self._final]
        sums = torch.cumsum(torch.cat((start[..., None], cycles), dim=-1), dim=-1)
        for i in range(self._final + 1, upto + 1):
            self._carry[i] = sums[..., (i - self._final) * SAMPLES_PER_FRAME]
        self._final = upto

    def _emit(self, upto: int) -> Tensor:
        upto = min(upto, self._received)
        if upto <= self._emitted:
            return torch.zeros(0, device=self.device)
        a, b = self._emitted, upto
        end = self._received if self._finished else min(self._received, b + self.right)
        self._settle_f0(end if self._finished else min(end, self._received - F0_CONTEXT))
        s = max(self._base, a - self.left)
        mel = self._mel[..., s - self._base : end - self._base]
        # pitch: final where settled, provisional beyond (right context near the received edge)
        f0 = self._f0[:, s - self._base : min(end, self._final) - self._base]
        if end > self._final:
            lo = max(self._base, self._final - F0_CONTEXT)
            fresh = self.hift.f0(self._mel[..., lo - self._base : self._received - self._base])
            f0 = torch.cat((f0, fresh[:, self._final - lo : end - lo]), dim=-1)
        f0s = HiFT.upsample(f0)
        cycles = SourceModule.harmonics(f0s).double()
        sums = torch.cumsum(torch.cat((self._carry[s][..., None], cycles), dim=-1), dim=-1)[..., 1:]
        phase = sums.float() % 1
        noise = SourceNoise(
            self._phases,
            self._noise[..., (s - self._base) * SAMPLES_PER_FRAME : (end - self._base) * SAMPLES_PER_FRAME],
        )
        audio = self.hift.decode(mel, self.hift.m_source.merge(f0s, phase, noise))[0]
        out = audio[(a - s) * SAMPLES_PER_FRAME : (b - s) * SAMPLES_PER_FRAME]
        self._emitted = b
        self._trim()
        return out

    def _trim(self) -> None:
        """Drop history no later window reads."""
        keep_from = max(0, min(self._emitted - self.left, self._final - F0_CONTEXT))
        if keep_from <= self._base:
            return
        cut = keep_from - self._base
        self._mel = self._mel[..., cut:]
        self._noise = self._noise[..., cut * SAMPLES_PER_FRAME :]
        self._f0 = self._f0[:, cut:]
        self._carry = {i: c for i, c in self._carry.items() if i >= keep_from}
        self._base = keep_from
