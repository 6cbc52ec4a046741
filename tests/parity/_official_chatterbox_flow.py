"""The official chatterbox-tts 0.1.7 S3Gen flow (``CausalMaskedDiffWithXvec`` with Turbo's meanflow
``CausalConditionalCFM`` and ``ConditionalDecoder``), for parity tests.

Its modules import ``diffusers`` (``Attention``, ``GELU``, ``get_activation``; 0.29.0, the wheel's pin,
imports beside huggingface_hub 0.36), ``conformer`` (imported, unused by Turbo) and ``einops``:
``pip install --no-deps diffusers==0.29.0 conformer==0.3.2``. Without them :func:`official_flow_modules`
returns None and the tests skip. ``flow.py`` also imports ``omegaconf`` for one default argument
(``DictConfig`` of a config it never reads); omegaconf 2.3 does not import beside the antlr4 runtime 4.13
installed here, so while ``flow.py`` loads a stand-in ``DictConfig`` (a dict) is put in its place and
removed afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from tests.parity._official_chatterbox import import_chatterbox, official_s3gen_encoder
from voxcast.models.chatterbox_turbo.s3gen_estimator import EstimatorConfig

__all__ = [
    "official_estimator",
    "official_flow",
    "official_flow_mel",
    "official_flow_modules",
    "pinned_noise",
]


@contextlib.contextmanager
def _omegaconf() -> Iterator[None]:
    """``omegaconf`` as it is, or a stand-in with ``DictConfig`` while the block runs."""
    try:
        importlib.import_module("omegaconf")
        yield
        return
    except Exception:  # ImportError, or antlr's "Could not deserialize ATN" with a mismatched runtime
        pass
    stub = types.ModuleType("omegaconf")
    stub.DictConfig = type("DictConfig", (dict,), {})  # type: ignore[attr-defined]
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "omegaconf"}
    sys.modules["omegaconf"] = stub
    try:
        yield
    finally:
        del sys.modules["omegaconf"]
        sys.modules.update(saved)


@functools.cache
def official_flow_modules() -> tuple[Any, Any, Any, Any] | None:
    """``(decoder, flow_matching, flow, configs)`` modules of ``chatterbox.models.s3gen``; None when
    chatterbox-tts, diffusers or conformer is missing (or fails to import: the tests skip)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # diffusers' deprecation of LoRACompatibleLinear and friends
            decoder = import_chatterbox("models.s3gen.decoder")
            matching = import_chatterbox("models.s3gen.flow_matching")
            configs = import_chatterbox("models.s3gen.configs")
            with _omegaconf():
                flow = import_chatterbox("models.s3gen.flow")
    except Exception:  # a broken install (e.g. a diffusers that does not import beside huggingface_hub)
        return None
    if decoder is None or matching is None or flow is None or configs is None:
        return None
    return decoder, matching, flow, configs


def official_estimator(cfg: EstimatorConfig) -> Any:
    """The official ``ConditionalDecoder`` with Turbo's arguments (``S3Token2Mel``) at ``cfg``'s widths."""
    modules = official_flow_modules()
    assert modules is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return modules[0].ConditionalDecoder(
            in_channels=cfg.in_channels, out_channels=cfg.out_channels, causal=True, channels=[cfg.channels],
            dropout=0.0, attention_head_dim=cfg.head_dim, n_blocks=cfg.blocks, num_mid_blocks=cfg.mid_blocks,
            num_heads=cfg.heads, act_fn="gelu", meanflow=True,
        ).eval()  # fmt: skip


def official_flow(state: dict[str, torch.Tensor], cfg: EstimatorConfig, prefix: str = "flow.") -> Any:
    """The official ``CausalMaskedDiffWithXvec`` as ``S3Gen(meanflow=True)`` builds it, loaded strictly
    from the ``prefix`` keys of ``state``."""
    modules = official_flow_modules()
    assert modules is not None
    _, matching, flow_mod, configs = modules
    decoder = matching.CausalConditionalCFM(
        spk_emb_dim=80, cfm_params=configs.CFM_PARAMS, estimator=official_estimator(cfg)
    )
    flow = flow_mod.CausalMaskedDiffWithXvec(encoder=official_s3gen_encoder(), decoder=decoder)
    flow.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, strict=True)
    return flow.eval()


def official_flow_mel(
    flow: Any,
    prompt_tokens: torch.Tensor,
    prompt_mel: torch.Tensor,
    x_vector: torch.Tensor,
    new_tokens: torch.Tensor,
    seed: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``S3Token2Wav.flow_inference`` (finalize, 2 meanflow steps) with PyTorch's global generator
    seeded: the new frames' noise ``randn(1, 80, 2N)`` first, then the CFM's ``randn_like(mu)``.
    ``prompt_mel`` is ``[1, 80, Pm]`` (transposed into upstream's ``prompt_feat``); the tokens stay
    integers (upstream's ``S3Token2Mel.forward`` casts them to the model's dtype)."""
    torch.manual_seed(seed)
    noise = torch.randn(1, 80, 2 * new_tokens.shape[-1], dtype=dtype)
    with contextlib.redirect_stdout(None):  # upstream prints and draws a tqdm bar (stderr) per call
        mel, _ = flow.inference(
            token=new_tokens, token_len=torch.tensor([new_tokens.shape[-1]]), prompt_token=prompt_tokens,
            prompt_token_len=torch.tensor([prompt_tokens.shape[-1]]),
            prompt_feat=prompt_mel.transpose(1, 2).to(dtype), prompt_feat_len=None,
            embedding=x_vector.to(dtype), finalize=True, n_timesteps=2, noised_mels=noise, meanflow=True,
        )  # fmt: skip
    return mel


def pinned_noise(
    seed: int, prompt_frames: int, new_frames: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The z :func:`official_flow_mel` draws for ``seed``: ``[1, 80, prompt_frames + new_frames]``."""
    torch.manual_seed(seed)
    new = torch.randn(1, 80, new_frames, dtype=dtype)
    z = torch.randn(1, 80, prompt_frames + new_frames, dtype=dtype)
    z[..., prompt_frames:] = new
    return z
