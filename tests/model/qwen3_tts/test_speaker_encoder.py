"""The speaker encoder's convolutions as matrix products (int8 models) equal PyTorch's convolutions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from voxcast.models.qwen3_tts.speaker_encoder import _apply_conv, _conv


@pytest.mark.parametrize("kernel,dilation", [(1, 1), (3, 1), (3, 2), (3, 3), (3, 4), (5, 1), (5, 2)])
@pytest.mark.parametrize("frames", [9, 281])
def test_matches_pytorch(kernel: int, dilation: int, frames: int) -> None:
    gen = torch.Generator().manual_seed(kernel * 10 + dilation)
    conv = _conv(16, 24, kernel, dilation)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(1, 16, frames, generator=gen)
    with torch.inference_mode():
        want, got = conv(x), _apply_conv(conv, x, True)
        assert torch.equal(_apply_conv(conv, x, False), want)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_batches_and_grouped_convs_go_to_pytorch() -> None:
    conv = _conv(8, 8, 3, 2)
    x = torch.randn(2, 8, 20)
    with torch.inference_mode():
        assert torch.equal(_apply_conv(conv, x, True), conv(x))
    grouped = nn.Conv1d(8, 8, 3, groups=2, padding="same", padding_mode="reflect")
    with torch.inference_mode():
        assert torch.equal(_apply_conv(grouped, x[:1], True), grouped(x[:1]))


def test_too_short_for_reflection_fails_like_pytorch() -> None:
    conv = _conv(4, 4, 3, 4)  # pads 4 on each side: needs more than 4 frames
    x = torch.randn(1, 4, 3)
    with pytest.raises(RuntimeError):
        conv(x)
    with pytest.raises(RuntimeError):
        _apply_conv(conv, x, True)


def test_whole_encoder_close_with_products(monkeypatch: pytest.MonkeyPatch) -> None:
    from voxcast.models.qwen3_tts.config import SpeakerEncoderConfig
    from voxcast.models.qwen3_tts.speaker_encoder import SpeakerEncoder, extract_xvector
    from voxcast.testing.qwen3_tts_parts import random_speaker_encoder_state, tiny_speaker_encoder_config

    cfg = tiny_speaker_encoder_config(32)
    enc = SpeakerEncoder(SpeakerEncoderConfig.from_dict(cfg))
    state = random_speaker_encoder_state(cfg, seed=1)
    enc.load_state_dict({k[len("speaker_encoder.") :]: v for k, v in state.items()})
    wav = (torch.randn(36000, generator=torch.Generator().manual_seed(2)) * 0.1).numpy()
    plain = extract_xvector(enc.eval(), wav)
    enc.use_gemm_convs(True)
    assert all(m.gemm for m in enc.modules() if hasattr(m, "gemm"))
    import voxcast.models.qwen3_tts.speaker_encoder as module

    asked: list[bool] = []

    def spy(conv: nn.Conv1d, x: torch.Tensor, gemm: bool) -> torch.Tensor:
        asked.append(gemm)
        return _apply_conv(conv, x, gemm)

    monkeypatch.setattr(module, "_apply_conv", spy)
    fast = extract_xvector(enc, wav)
    assert asked and all(asked)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6)
