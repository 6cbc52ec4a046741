"""S3Gen's flow: speech tokens (25 Hz) -> 80-bin mel (50 frames a second), conditioned on a voice.

The official ``CausalMaskedDiffWithXvec.inference`` with Turbo's ``CausalConditionalCFM`` (meanflow, 2
Euler steps over a linear time span, no classifier-free guidance): the prompt's tokens and the new ones
are embedded together (512 wide) and encoded (:class:`S3GenEncoder`, x2 upsampling), projected to 80
(mu); ``cond`` holds the prompt mel over the prompt's frames and zeros after; the CFM starts from the
noise z over all frames (prompt and new) and takes two steps of the :class:`Estimator`; only the new
frames are returned. The speaker is the CAMPPlus x-vector (192), L2-normalised, then an affine to 80.

Noise: upstream draws it on every call, in this order (``S3Token2Wav.flow_inference``,
``CausalConditionalCFM.forward``): ``n = randn(1, 80, 2 * new_tokens)`` then
``z = randn_like(mu)`` (``[B, 80, all frames]``, mu's dtype) and ``z[..., -n.shape[-1]:] = n``; the prompt
frames' noise is thus fresh every call. Here the whole z is an argument (``noise``): pinning it pins the
output. Module names follow the official ``flow.`` of ``s3gen_meanflow.safetensors``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from voxcast.models.chatterbox_turbo.s3gen_encoder import WIDTH, S3GenEncoder
from voxcast.models.chatterbox_turbo.s3gen_estimator import Estimator, EstimatorConfig
from voxcast.models.chatterbox_turbo.s3gen_prefix import PromptCache
from voxcast.models.chatterbox_turbo.state import check_state

__all__ = ["MELS", "MELS_PER_TOKEN", "STEPS", "VOCAB", "S3GenFlow"]

VOCAB = 6561  # FSQ 3^8; T3's start/stop tokens (6561, 6562) must be dropped before the flow
SPEAKER_DIM = 192  # CAMPPlus x-vector
MELS = 80
MELS_PER_TOKEN = 2
#: Meanflow Euler steps (upstream's default for ``meanflow=True``).
STEPS = 2


def _check_ids(tokens: Tensor) -> None:
    if tokens.is_floating_point():
        raise TypeError("speech tokens must be integers (a float cast corrupts ids in bf16)")
    if bool(((tokens < 0) | (tokens >= VOCAB)).any()):  # one host sync per call
        raise ValueError(f"speech token ids must be in [0, {VOCAB}): drop T3's start/stop tokens")


class CFM(nn.Module):
    """``CausalConditionalCFM.basic_euler``: x <- x + (r - t) * v(x, t, r) over ``linspace(0, 1, steps + 1)``."""

    def __init__(self, cfg: EstimatorConfig) -> None:
        super().__init__()
        self.estimator = Estimator(cfg)
        self._schedules: dict[tuple[int, torch.device, torch.dtype], list[tuple[Tensor, ...]]] = {}

    def forward(
        self,
        z: Tensor,
        mu: Tensor,
        spks: Tensor,
        cond: Tensor,
        steps: int = STEPS,
        cache: PromptCache | None = None,
    ) -> Tensor:
        x = z
        for i, (t, r, dt, time) in enumerate(self._schedule(steps, mu.device, mu.dtype)):
            view = None if cache is None else cache.at(i)
            x = x + dt * self.estimator(x, mu, t, r, spks, cond, view, time=time)
        return x

    def _schedule(self, steps: int, device: torch.device, dtype: torch.dtype) -> list[tuple[Tensor, ...]]:
        """Per Euler step: t, r, r - t (``[1]`` each) and the estimator's time embedding of (t, r),
        which depend on nothing but the step: computed once per steps, device and dtype."""
        key = (steps, device, dtype)
        hit = self._schedules.get(key)
        if hit is None:
            with torch.inference_mode(False), torch.no_grad():  # normal tensors: usable in any mode
                span = torch.linspace(0, 1, steps + 1, device=device, dtype=dtype)
                hit = []
                for t, r in itertools.pairwise(span):
                    t, r = t[None], r[None]
                    hit.append((t, r, r - t, self.estimator.time(t, r)))
            self._schedules[key] = hit
        return hit


class S3GenFlow(nn.Module):
    def __init__(self, cfg: EstimatorConfig) -> None:
        super().__init__()
        self.input_embedding = nn.Embedding(VOCAB, WIDTH)
        self.spk_embed_affine_layer = nn.Linear(SPEAKER_DIM, MELS)
        self.encoder = S3GenEncoder()
        self.encoder_proj = nn.Linear(WIDTH, MELS)
        self.decoder = CFM(cfg)

    def mu(self, tokens: Tensor, cache: PromptCache | None = None) -> Tensor:
        """``[B, T]`` token ids -> ``[B, 80, 2T]`` encoded features (the CFM's condition)."""
        h = self.encoder_proj(self.encoder(self.input_embedding(tokens.long()), cache))
        return h.transpose(1, 2).contiguous()

    def speaker(self, x_vector: Tensor) -> Tensor:
        """``[B or 1, 192]`` or ``[192]`` CAMPPlus x-vector -> ``[B or 1, 80]`` (L2-normalised, affine)."""
        affine = self.spk_embed_affine_layer
        return affine(F.normalize(torch.atleast_2d(x_vector).to(affine.weight), dim=1))

    def prompt_cache(
        self, prompt_tokens: Tensor, prompt_mel: Tensor, x_vector: Tensor, noise: Tensor
    ) -> PromptCache:
        """A voice prompt's part of every later call (:mod:`.s3gen_prefix`): its rows computed alone.

        Args:
            prompt_tokens: ``[1, P]`` ids, P >= 2.
            prompt_mel: ``[1, 80, 2P]``.
            x_vector: the voice's CAMPPlus embedding.
            noise: ``[1, 80, 2P]`` the prompt frames' pinned noise.

        Raises:
            ValueError: a prompt shorter than two tokens, or shapes that do not match.
        """
        p = prompt_tokens.shape[1]
        if (
            p < 2
            or tuple(prompt_mel.shape) != (1, MELS, MELS_PER_TOKEN * p)
            or noise.shape != prompt_mel.shape
        ):
            raise ValueError(
                f"a prompt cache needs >= 2 prompt tokens with a [1, 80, 2P] mel and noise; got "
                f"{tuple(prompt_tokens.shape)}, {tuple(prompt_mel.shape)}, {tuple(noise.shape)}"
            )
        _check_ids(prompt_tokens)
        cache = PromptCache(p)
        mu = self.mu(prompt_tokens, cache)
        self.decoder(noise.to(mu), mu, self.speaker(x_vector), prompt_mel.to(mu), cache=cache)
        return cache.freeze()

    def continue_prompt(
        self,
        cache: PromptCache,
        x_vector: Tensor,
        new_tokens: Tensor,
        noise: Tensor,
        *,
        check_ids: bool = True,
    ) -> Tensor:
        """The mel ``[B, 80, 2N]`` of ``new_tokens [B, N]`` after a cached prompt, from their noise
        ``[B, 80, 2N]``: only the new rows are computed (:mod:`.s3gen_prefix`). ``check_ids=False``:
        the caller checked the ids' range on the host (the device check is a sync)."""
        b, frames = new_tokens.shape[0], MELS_PER_TOKEN * new_tokens.shape[1]
        if tuple(noise.shape) != (b, MELS, frames):
            raise ValueError(f"noise {tuple(noise.shape)} should be {(b, MELS, frames)}")
        if check_ids:
            _check_ids(new_tokens)
        mu = self.mu(new_tokens, cache)
        spks = self.speaker(x_vector).expand(b, -1)
        return self.decoder(noise.to(mu), mu, spks, torch.zeros_like(mu), cache=cache)

    def rows(
        self, tokens: Tensor, cond: Tensor, x_vector: Tensor, noise: Tensor, cache: PromptCache
    ) -> Tensor:
        """The mel ``[B, 80, 2L]`` of whole rows ``tokens [B, L]`` (prompt and new tokens each) given
        their ``cond`` (each row's prompt mel over its prompt's frames, zeros after), x-vectors
        ``[B, 192]`` and ``noise`` ``[B, 80, 2L]``, with a ``cache`` that masks the rows' padding
        (:class:`~.s3gen_rows.PaddedRows`); ids checked by the caller."""
        mu = self.mu(tokens, cache)
        return self.decoder(noise.to(mu), mu, self.speaker(x_vector), cond.to(mu), cache=cache)

    def forward(
        self,
        prompt_tokens: Tensor,
        prompt_mel: Tensor,
        x_vector: Tensor,
        new_tokens: Tensor,
        noise: Tensor,
        *,
        check_ids: bool = True,
    ) -> Tensor:
        """The mel of ``new_tokens`` spoken in the prompt's voice (upstream's ``finalize=True``).

        Args:
            prompt_tokens: ``[B or 1, P]`` integer ids of the voice prompt (P may be 0).
            prompt_mel: ``[B or 1, 80, Pm]`` its mel (``Pm`` = 2P; upstream's ``prompt_feat`` is
                ``[1, Pm, 80]``: transpose it).
            x_vector: ``[B or 1, 192]`` or ``[192]`` the voice's CAMPPlus embedding.
            new_tokens: ``[B, N]`` integer ids, all < 6561.
            noise: ``[B, 80, 2 * (P + N)]`` z, the CFM's start over prompt and new frames (the model's
                dtype; see the module docstring for how upstream draws it).
            check_ids: check the ids' range here (one host sync); False where the caller checked
                them on the host.

        Returns:
            ``[B, 80, 2 * (P + N) - Pm]`` (2N frames for a prompt mel of 2P frames).

        Raises:
            TypeError: float token ids.
            ValueError: shapes that do not match, or a token id out of range (checked on the host:
                one sync per call).
        """
        if prompt_tokens.is_floating_point() or new_tokens.is_floating_point():
            raise TypeError("speech tokens must be integers (a float cast corrupts ids in bf16)")
        b = new_tokens.shape[0]
        tokens = torch.cat([prompt_tokens.expand(b, -1), new_tokens], dim=1)
        frames, prompt_frames = MELS_PER_TOKEN * tokens.shape[1], prompt_mel.shape[-1]
        if tuple(noise.shape) != (b, MELS, frames) or prompt_frames > frames:
            raise ValueError(
                f"{tokens.shape[1]} tokens make {frames} frames: noise {tuple(noise.shape)} should be "
                f"{(b, MELS, frames)}, the prompt mel ({prompt_frames} frames) at most that long"
            )
        if check_ids:
            _check_ids(tokens)
        spks = self.speaker(x_vector)
        mu = self.mu(tokens)  # [B, 80, frames]
        cond = torch.zeros_like(mu)
        cond[:, :, :prompt_frames] = prompt_mel
        mel = self.decoder(noise.to(mu), mu, spks.expand(b, -1), cond)
        return mel[:, :, prompt_frames:]

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor], *, prefix: str = "flow.") -> S3GenFlow:
        """The flow from a state (``s3gen_meanflow.safetensors``' tensors; keys under ``prefix``), in
        the tensors' dtype; the estimator's widths come from its tensors.

        Raises:
            CheckpointError: tensors missing, unexpected or of the wrong shape.
        """
        cfg = EstimatorConfig.from_tensors(tensors, prefix + "decoder.estimator.")
        state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        with torch.device("meta"):
            model = cls(cfg)
        check_state(model, state, f"not an S3Gen flow state (prefix {prefix!r})")
        model.load_state_dict(state, strict=True, assign=True)
        return model.eval().requires_grad_(False)
