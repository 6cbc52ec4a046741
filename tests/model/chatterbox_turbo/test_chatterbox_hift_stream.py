"""HiFT decoded a chunk at a time (tiny random weights): the same audio as the one-pass decode of the
same mel and noise, every frame sent once, bounded history, pinned noise."""

from __future__ import annotations

import pytest
import torch

from voxcast.models.chatterbox_turbo.hift import SAMPLES_PER_FRAME, HiFT
from voxcast.models.chatterbox_turbo.hift_stream import F0_CONTEXT, HiFTStream
from voxcast.testing.chatterbox_turbo import hift_state


@pytest.fixture(scope="module")
def hift() -> HiFT:
    return HiFT.from_tensors(hift_state("tiny", seed=5))


def _mel(frames: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(seed)) - 4.0


def _stream(
    hift: HiFT, mel: torch.Tensor, sizes: list[int], seed: int = 3, **kw: int
) -> tuple[torch.Tensor, HiFTStream]:
    stream = HiFTStream(hift, generator=torch.Generator().manual_seed(seed), **kw)
    out, i = [], 0
    for n in sizes:
        chunk = mel[..., i : i + n]
        if chunk.shape[-1] == 0:
            break
        before = stream.emitted_frames
        audio = stream.push(chunk)
        i += chunk.shape[-1]
        # every frame leaves once, as soon as `right` frames follow it
        assert stream.emitted_frames == max(before, i - stream.right)
        assert audio.shape[0] == (stream.emitted_frames - before) * SAMPLES_PER_FRAME
        out.append(audio)
    out.append(stream.finish())
    return torch.cat(out), stream


@pytest.mark.parametrize("sizes", [[1, 1, 2, 3, 4] + [8] * 40, [200], [7] * 40, [1] * 200])
def test_streamed_equals_the_one_pass_decode(hift: HiFT, sizes: list[int]) -> None:
    mel = _mel(200)
    streamed, stream = _stream(hift, mel, sizes)
    with torch.inference_mode():
        one_pass = hift.decode(mel, hift.source(hift.f0(mel), stream.noise))[0]
    assert streamed.shape == one_pass.shape == (200 * SAMPLES_PER_FRAME,)
    assert float((streamed - one_pass).abs().max()) <= 1e-6


def test_history_is_bounded_by_the_window(hift: HiFT) -> None:
    stream = HiFTStream(hift, generator=torch.Generator().manual_seed(0), left=16, right=10)
    mel = _mel(400)
    for i in range(0, 400, 8):
        stream.push(mel[..., i : i + 8])
        assert stream.held_frames <= 16 + F0_CONTEXT + 10 + 8 + F0_CONTEXT


def test_the_same_seed_gives_the_same_audio(hift: HiFT) -> None:
    mel = _mel(60)
    a, _ = _stream(hift, mel, [5] * 12, seed=7)
    b, _ = _stream(hift, mel, [3] * 20, seed=7)
    c, _ = _stream(hift, mel, [5] * 12, seed=8)
    assert float((a - b).abs().max()) <= 1e-6 and not torch.equal(a, c)


def test_a_window_without_the_pitch_look_ahead_is_refused(hift: HiFT) -> None:
    with pytest.raises(ValueError, match="right"):
        HiFTStream(hift, right=F0_CONTEXT - 1)
    stream = HiFTStream(hift)
    stream.finish()
    with pytest.raises(RuntimeError, match="finished"):
        stream.push(_mel(3))
