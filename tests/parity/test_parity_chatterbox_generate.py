"""End to end against the official ``ChatterboxTurboTTS.generate`` (chatterbox-tts 0.1.7) on the same
tiny random checkpoint, built-in voice, text and seed, watermark off: our one-pass ``render`` gives the
official waveform (every random draw from one generator in upstream's order: T3's sampled tokens, the
flow's noise, HiFT's source)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.parity._official_chatterbox_generate import import_official_tts, official_generate, official_tts
from voxcast.models.base import LoadOptions
from voxcast.models.chatterbox_turbo.model import ChatterboxTurbo
from voxcast.models.chatterbox_turbo.s3gen_estimator import EstimatorConfig
from voxcast.testing.chatterbox_turbo import HIFT_SIZES, SIZES

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        import_official_tts() is None, reason="the official chatterbox-tts pipeline does not import"
    ),
]


@pytest.fixture(scope="module")
def pair(turbo_model_dir: Path) -> tuple[ChatterboxTurbo, object]:
    ours = ChatterboxTurbo.from_pretrained(turbo_model_dir, LoadOptions())
    layers, width, _ = SIZES["tiny"]
    from safetensors.torch import load_file

    cfg = EstimatorConfig.from_tensors(
        load_file(str(turbo_model_dir / "s3gen_meanflow.safetensors")), "flow.decoder.estimator."
    )
    official = official_tts(turbo_model_dir, (layers, width, width // 64), cfg, HIFT_SIZES["tiny"])
    return ours, official


@pytest.mark.parametrize(
    ("text", "seed"),
    [
        ("Hello there, how are you today?", 0),
        ("well [laugh] that was… unexpected", 5),
        ("Numbers: 1, 2 and 3", 11),
    ],
)
def test_render_equals_official_generate(pair: tuple[ChatterboxTurbo, object], text: str, seed: int) -> None:
    ours, official = pair
    want = official_generate(official, text, seed)
    got = ours.render(text, seed=seed)
    assert got.shape == want.shape and len(got) > 3 * 960
    # measured 2.2e-8 and 4.1e-8: float rounding (the tokens, flow and HiFT are each bitwise the official)
    assert np.abs(got - want).max() <= 1e-6, float(np.abs(got - want).max())


def test_watermarked_render_equals_official_generate_with_its_watermark(
    pair: tuple[ChatterboxTurbo, object],
) -> None:
    """Watermark on, as upstream ships it: our render then our Perth watermark against ``generate()``
    with the official ``PerthImplicitWatermarker``."""
    from tests.parity._official_perth import official_watermarker
    from voxcast.watermark.perth import PerthWatermarker, find_perth_weights

    if find_perth_weights() is None or (marker := official_watermarker()) is None:
        pytest.skip("resemble-perth (or librosa / torchaudio's sources) is not installed")
    ours, official = pair
    unmarked = official.watermarker  # type: ignore[attr-defined]
    official.watermarker = marker  # type: ignore[attr-defined]
    try:
        want = official_generate(official, "Hello there, how are you today?", 3)
    finally:
        official.watermarker = unmarked  # type: ignore[attr-defined]
    got = PerthWatermarker.load().apply(ours.render("Hello there, how are you today?", seed=3), 24000)
    assert got.shape == want.shape
    # measured 5.0e-8 (the render's own float rounding; the watermark is bitwise the official)
    assert np.abs(got - want).max() <= 1e-5, float(np.abs(got - want).max())
