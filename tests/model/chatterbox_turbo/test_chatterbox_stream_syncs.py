"""The streamed S3Gen + HiFT path's host syncs, counted by torch.profiler on the tiny checkpoint (issue
46 item 2): pushing tokens calls no ``aten::item`` (on a GPU each one waits for the device), and
only the audio's own copy to the host remains. Counts, not timings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from voxcast.models.base import LoadOptions
from voxcast.models.chatterbox_turbo.hift import HiFT, istft
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo

SYNCS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero")


@pytest.fixture(scope="module")
def model(turbo_model_dir: Path) -> ChatterboxTurbo:
    return ChatterboxTurbo.from_pretrained(turbo_model_dir, LoadOptions())


def _counts(run: object) -> dict[str, int]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()  # type: ignore[operator]
    return {e.key: e.count for e in prof.key_averages() if e.key in SYNCS}


@pytest.mark.parametrize("prompt_cache", [1, 0])
def test_pushes_make_no_host_syncs(model: ChatterboxTurbo, prompt_cache: int) -> None:
    voice = model.builtin
    assert voice is not None
    model.stream_settings = type(model.stream_settings)(prompt_cache=prompt_cache)
    tokens = torch.randint(0, 6561, (60,), generator=torch.Generator().manual_seed(1))
    decoder = model.new_decoder(voice, seed=7)
    decoder.decode(tokens[:12, None])  # the first chunk: kernels chosen, caches filled

    def pushes() -> None:
        for i in range(12, 60, 4):
            decoder.decode(tokens[i : i + 4, None])
        decoder.flush()

    counts = _counts(pushes)
    calls = [c for c in decoder.stream.flow_calls if c[0]]
    assert len(calls) >= 3  # flow windows ran inside the profile
    assert counts.get("aten::item", 0) == 0, counts
    assert counts.get("aten::_local_scalar_dense", 0) == 0, counts
    model.stream_settings = type(model.stream_settings)()


def test_istft_without_its_check_is_bitwise_torch_istft(model: ChatterboxTurbo) -> None:
    g = torch.Generator().manual_seed(0)
    spec = torch.complex(torch.randn(2, 9, 37, generator=g), torch.randn(2, 9, 37, generator=g))
    window = model.hift.window
    ref = torch.istft(spec, 16, 4, 16, window=window)
    assert torch.equal(istft(spec, window), ref)
    assert _counts(lambda: istft(spec, window)).get("aten::item", 0) == 0
    assert isinstance(model.hift, HiFT)
