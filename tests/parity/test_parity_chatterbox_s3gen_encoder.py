"""S3Gen's token encoder against the official chatterbox-tts 0.1.7 ``UpsampleConformerEncoder`` (built
as ``S3Gen`` builds it) on the same random weights and input: the same 50 Hz features."""

from __future__ import annotations

import pytest
import torch

from tests.parity._official_chatterbox import import_chatterbox, official_s3gen_encoder
from voxcast.models.chatterbox_turbo.s3gen_encoder import S3GenEncoder

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(
        import_chatterbox("models.s3gen.transformer.upsample_encoder") is None,
        reason="chatterbox-tts not installed",
    ),
]


@pytest.fixture(scope="module")
def pair() -> tuple[S3GenEncoder, object]:
    torch.manual_seed(0)
    official = official_s3gen_encoder()
    with torch.no_grad():  # the relative-position biases start at xavier values, the rest as built
        for p in official.parameters():
            p.add_(0.01 * torch.randn_like(p))
    ours = S3GenEncoder()
    ours.load_state_dict(official.state_dict(), strict=True)
    return ours.eval(), official


@pytest.mark.parametrize("tokens", [1, 7, 40])
def test_features_equal_the_official(pair: tuple[S3GenEncoder, object], tokens: int) -> None:
    ours, official = pair
    x = torch.randn(1, tokens, 512, generator=torch.Generator().manual_seed(tokens))
    with torch.inference_mode():
        want, masks = official(x, torch.tensor([tokens]))  # type: ignore[operator]
        got = ours(x)
    assert got.shape == want.shape == (1, 2 * tokens, 512) and bool(masks.all())
    assert torch.equal(got, want), float((got - want).abs().max())
