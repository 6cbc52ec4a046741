"""Several streams' flow windows in one batched call (voxcast/models/chatterbox_turbo/s3gen_batch.py,
s3gen_rows.py) on tiny random weights: each window's mel equals its mel alone (other voices, other
prompt and window lengths, prompt cache on and off), up to float rounding of other matrix shapes; and
streams pushed together (:func:`push_many`) give the audio each gives alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from voxcast.models.chatterbox_turbo.hift import HiFT
from voxcast.models.chatterbox_turbo.s3gen_batch import FlowVoice, FlowWindow, run_window, run_windows
from voxcast.models.chatterbox_turbo.s3gen_flow import MELS, S3GenFlow
from voxcast.models.chatterbox_turbo.s3gen_rows import PaddedRows
from voxcast.models.chatterbox_turbo.s3gen_stream import (
    StreamSettings,
    TurboAudioStream,
    prompt_cache,
    prompt_noise,
    push_many,
)
from voxcast.testing.chatterbox_turbo import flow_state, hift_state

#: Float rounding of other matrix shapes (padded rows change BLAS blocking); measured max |diff| on
#: these weights: ~1e-6 on mels of magnitude ~5 (docs/chatterbox-turbo.md).
ATOL = 2e-5


@pytest.fixture(scope="module")
def flow() -> S3GenFlow:
    return S3GenFlow.from_tensors(flow_state("tiny", seed=2))


@pytest.fixture(scope="module")
def hift() -> HiFT:
    return HiFT.from_tensors(hift_state("tiny", seed=3))


def _voice_inputs(prompt: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 6561, (1, prompt), generator=g),
        torch.randn(1, MELS, 2 * prompt, generator=g) - 5.0,
        torch.randn(1, 192, generator=g),
    )


def _voice(flow: S3GenFlow, prompt: int, seed: int, cached: bool) -> FlowVoice:
    pt, pm, xv = _voice_inputs(prompt, seed)
    cache = prompt_cache(flow, pt, pm, xv) if cached else None
    return FlowVoice(pt, pm, prompt_noise(2 * prompt, pt.device, torch.float32), xv, cache)


def _window(voice: FlowVoice, n: int, seed: int) -> FlowWindow:
    g = torch.Generator().manual_seed(seed)
    return FlowWindow(
        voice, torch.randint(0, 6561, (n,), generator=g).tolist(), torch.randn(1, MELS, 2 * n, generator=g)
    )


@pytest.mark.parametrize("cached", [True, False], ids=["prompt_cache", "exact"])
def test_batched_windows_equal_each_window_alone(
    flow: S3GenFlow, cached: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _voice(flow, 20, 1, cached), _voice(flow, 13, 2, cached)  # two voices, two prompt lengths
    windows = [_window(a, 12, 3), _window(b, 28, 4), _window(a, 28, 5), _window(b, 5, 6), _window(a, 12, 7)]
    alone = [run_window(flow, w) for w in windows]
    together = run_windows(flow, windows)
    diffs = []
    for one, got in zip(alone, together, strict=True):
        assert got.shape == one.shape
        torch.testing.assert_close(got, one, rtol=0, atol=ATOL)
        diffs.append(float((got - one).abs().max()))
    assert max(diffs) < ATOL
    # the padding is really masked: without the masks the short rows change far beyond rounding
    monkeypatch.setattr(PaddedRows, "key_mask", lambda self, keys: None)
    monkeypatch.setattr(PaddedRows, "zero_padding", lambda self, x: x)
    unmasked = run_windows(flow, windows)
    assert float((unmasked[3] - alone[3]).abs().max()) > 100 * ATOL


def test_windows_of_one_voice_and_length_batch_without_masks(flow: S3GenFlow) -> None:
    v = _voice(flow, 16, 1, True)
    windows = [_window(v, 10, s) for s in range(3)]
    for got, w in zip(run_windows(flow, windows), windows, strict=True):
        torch.testing.assert_close(got, run_window(flow, w), rtol=0, atol=ATOL)


def test_mixed_cached_and_exact_windows_run_in_their_own_groups(flow: S3GenFlow) -> None:
    windows = [
        _window(_voice(flow, 12, 1, True), 9, 1),
        _window(_voice(flow, 12, 1, False), 9, 2),
        _window(_voice(flow, 18, 2, True), 14, 3),
    ]
    for got, w in zip(run_windows(flow, windows), windows, strict=True):
        torch.testing.assert_close(got, run_window(flow, w), rtol=0, atol=ATOL)


@pytest.mark.parametrize("prompt_cache_on", [1, 0], ids=["prompt_cache", "exact"])
def test_streams_pushed_together_give_the_audio_each_gives_alone(
    flow: S3GenFlow, hift: HiFT, prompt_cache_on: int
) -> None:
    settings = StreamSettings(
        first=4, chunk=16, left=6, right=2, hift_left=8, hift_right=6, prompt_cache=prompt_cache_on
    )
    voices = [_voice_inputs(20, 1), _voice_inputs(13, 2), _voice_inputs(20, 1)]
    g = torch.Generator().manual_seed(11)
    texts = [torch.randint(0, 6561, (n,), generator=g).tolist() for n in (50, 37, 61)]
    steps = (3, 5, 2)  # pushes of different sizes: windows of different lengths at different times

    def streams() -> list[TurboAudioStream]:
        return [TurboAudioStream(flow, hift, *v, 40 + i, settings) for i, v in enumerate(voices)]

    alone = []
    for s, toks, k in zip(streams(), texts, steps, strict=True):
        alone.append(np.concatenate([*(s.push(toks[i : i + k]) for i in range(0, len(toks), k)), s.finish()]))

    together = streams()
    parts: list[list[np.ndarray]] = [[] for _ in together]
    batched = 0
    for r in range(max(len(t) // k + 1 for t, k in zip(texts, steps, strict=True))):
        live = [i for i, (t, k) in enumerate(zip(texts, steps, strict=True)) if r * k < len(t)]
        before = [len(together[i].flow_calls) for i in live]
        out = push_many(
            [together[i] for i in live], [texts[i][r * steps[i] : (r + 1) * steps[i]] for i in live]
        )
        ran = sum(len(together[i].flow_calls) - n for i, n in zip(live, before, strict=True))
        batched += ran > 1
        for i, pcm in zip(live, out, strict=True):
            assert isinstance(pcm, np.ndarray)
            parts[i].append(pcm)
    assert batched > 0  # some rounds really ran several streams' windows in one call
    for i, s in enumerate(together):
        got = np.concatenate([*parts[i], s.finish()])
        assert got.shape == alone[i].shape
        np.testing.assert_allclose(got, alone[i], rtol=0, atol=1e-5)


def test_push_many_hands_a_streams_own_error_back_in_its_place(flow: S3GenFlow, hift: HiFT) -> None:
    settings = StreamSettings(first=4, chunk=8, left=4, right=2)
    a, b = (TurboAudioStream(flow, hift, *_voice_inputs(12, i), i, settings) for i in (1, 2))
    out = push_many([a, b], [[6561], list(range(10))])  # a's id is out of range: a fails, b goes on
    assert isinstance(out[0], ValueError)
    assert isinstance(out[1], np.ndarray) and len(b.flow_calls) == 1


def test_rows_read_their_own_voices_in_any_order(flow: S3GenFlow) -> None:
    a, b = _voice(flow, 20, 1, True), _voice(flow, 13, 2, True)
    for voices in ((a, b), (b, a)):  # one order is the stack's (no gather), the other is not
        windows = [_window(v, 9, k) for k, v in enumerate(voices)]
        for got, w in zip(run_windows(flow, windows), windows, strict=True):
            torch.testing.assert_close(got, run_window(flow, w), rtol=0, atol=ATOL)
