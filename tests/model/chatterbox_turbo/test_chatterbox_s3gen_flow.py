"""S3Gen's flow on tiny random weights (no official package needed): loading and its errors, the
output's shape (2 mel frames per new token), bfloat16, the pinned noise."""

from __future__ import annotations

import pytest
import torch

from voxcast.errors import CheckpointError
from voxcast.models.chatterbox_turbo.s3gen_estimator import EstimatorConfig
from voxcast.models.chatterbox_turbo.s3gen_flow import MELS, S3GenFlow
from voxcast.testing.chatterbox_turbo import flow_state


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return flow_state("tiny", seed=2)


@pytest.fixture(scope="module")
def flow(state: dict[str, torch.Tensor]) -> S3GenFlow:
    return S3GenFlow.from_tensors(state)


def _inputs(prompt: int, new: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 6561, (1, prompt), generator=g),
        torch.randn(1, MELS, 2 * prompt, generator=g) - 5.0,
        torch.randn(192, generator=g),
        torch.randint(0, 6561, (1, new), generator=g),
        torch.randn(1, MELS, 2 * (prompt + new), generator=g),
    )


def test_the_widths_are_read_from_the_tensors(flow: S3GenFlow) -> None:
    cfg = flow.decoder.estimator.cfg
    assert cfg == EstimatorConfig(channels=32, blocks=1, mid_blocks=2, heads=2)
    assert not any(p.requires_grad for p in flow.parameters())


def test_a_bad_tensor_is_named(state: dict[str, torch.Tensor]) -> None:
    key = "flow.decoder.estimator.mid_blocks.1.1.0.attn1.to_k.weight"
    missing = {k: v for k, v in state.items() if k != key}
    with pytest.raises(
        CheckpointError, match=r"missing \['decoder\.estimator\.mid_blocks\.1\.1\.0\.attn1\.to_k"
    ):
        S3GenFlow.from_tensors(missing)
    wrong = dict(state, **{"flow.encoder_proj.weight": torch.zeros(80, 256)})
    with pytest.raises(CheckpointError, match=r"wrong shape \['encoder_proj\.weight'\]"):
        S3GenFlow.from_tensors(wrong)
    extra = dict(state, **{"flow.decoder.estimator.up_blocks.0.3.weight": torch.zeros(1)})
    with pytest.raises(
        CheckpointError, match=r"unexpected \['decoder\.estimator\.up_blocks\.0\.3\.weight'\]"
    ):
        S3GenFlow.from_tensors(extra)
    with pytest.raises(CheckpointError, match=r"flow\.decoder\.estimator\.final_proj\.weight"):
        S3GenFlow.from_tensors({k: v for k, v in state.items() if "final_proj" not in k})
    with pytest.raises(CheckpointError, match="is missing"):
        S3GenFlow.from_tensors(state, prefix="s3gen.flow.")


@pytest.mark.parametrize(("prompt", "new"), [(0, 1), (0, 7), (6, 1), (6, 11)])
def test_two_frames_per_new_token(flow: S3GenFlow, prompt: int, new: int) -> None:
    with torch.inference_mode():
        mel = flow(*_inputs(prompt, new))
    assert mel.shape == (1, MELS, 2 * new) and mel.dtype == torch.float32
    assert bool(torch.isfinite(mel).all())


def test_bfloat16_runs(state: dict[str, torch.Tensor], flow: S3GenFlow) -> None:
    flow16 = S3GenFlow.from_tensors({k: v.to(torch.bfloat16) for k, v in state.items()})
    inputs = _inputs(5, 8)
    with torch.inference_mode():
        mel16 = flow16(*(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs))
        mel = flow(*inputs)
    assert mel16.shape == (1, MELS, 16) and mel16.dtype == torch.bfloat16
    assert bool(torch.isfinite(mel16).all())
    assert torch.corrcoef(torch.stack([mel.flatten(), mel16.float().flatten()]))[0, 1] > 0.9


def test_the_noise_pins_the_output(flow: S3GenFlow) -> None:
    prompt_tokens, prompt_mel, x_vector, new_tokens, noise = _inputs(6, 5)
    with torch.inference_mode():
        a = flow(prompt_tokens, prompt_mel, x_vector, new_tokens, noise)
        b = flow(prompt_tokens, prompt_mel, x_vector, new_tokens, noise.clone())
        other = noise.clone()
        other[..., :12] = torch.randn(1, MELS, 12, generator=torch.Generator().manual_seed(9))
        c = flow(prompt_tokens, prompt_mel, x_vector, new_tokens, other)
    assert torch.equal(a, b)
    # the attention sees the prompt's frames: their noise reaches the new frames
    assert not torch.equal(a, c)


def test_a_batch_equals_its_rows(flow: S3GenFlow) -> None:
    rows = [_inputs(4, 6, seed=s) for s in (1, 2)]
    prompt_tokens, prompt_mel, x_vector = rows[0][:3]
    new = torch.cat([r[3] for r in rows])
    noise = torch.cat([r[4] for r in rows])
    with torch.inference_mode():
        batch = flow(prompt_tokens, prompt_mel, x_vector, new, noise)
        single = [flow(prompt_tokens, prompt_mel, x_vector, new[i : i + 1], noise[i : i + 1]) for i in (0, 1)]
    torch.testing.assert_close(batch, torch.cat(single), rtol=1e-4, atol=1e-4)


def test_bad_inputs_are_refused(flow: S3GenFlow) -> None:
    prompt_tokens, prompt_mel, x_vector, new_tokens, noise = _inputs(3, 4)
    with pytest.raises(TypeError, match="integers"):
        flow(prompt_tokens.float(), prompt_mel, x_vector, new_tokens, noise)
    with pytest.raises(ValueError, match="6561"):
        flow(prompt_tokens, prompt_mel, x_vector, new_tokens + 6561, noise)
    with pytest.raises(ValueError, match=r"should be \(1, 80, 14\)"):
        flow(prompt_tokens, prompt_mel, x_vector, new_tokens, noise[..., :8])
