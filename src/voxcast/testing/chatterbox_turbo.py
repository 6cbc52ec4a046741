"""Random-weight Chatterbox Turbo checkpoints in the official layout, for tests and benchmarks.

So far T3 only (``t3_turbo_v1.safetensors``): every key the official ``T3`` loads strictly (GPT-2's
``tfmr.wte`` and the ``text_head`` included, though inference reads neither), GPT-2's initialisation
(normal, std 0.02; layer norms 1 and 0). Random T3 weights almost never pick the stop token, so the
speech head's stop bias is raised (:data:`STOP_BIAS`) and sampled speech ends.

Sizes: "tiny" (2 layers, width 64: one 64-wide head; builds in well under a second) and "full"
(GPT-2 medium: 24 layers, width 1024, 16 heads). Vocabularies (50276 text, 6563 speech) and the special
tokens are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from voxcast.models.chatterbox_turbo.t3 import T3_FILE

__all__ = ["SIZES", "STOP_BIAS", "make_t3"]

#: (layers, width, positions)
SIZES = {"tiny": (2, 64, 8196), "full": (24, 1024, 8196)}
TEXT_VOCAB, SPEECH_VOCAB, SPEAKER_DIM, STOP = 50276, 6563, 256, 6562
#: Added to the stop token's bias, per size: with random weights, sampled speech (Turbo's defaults)
#: then ends after some tens of tokens. Greedy decoding picks the stop token at once with it: parity
#: tests of greedy tokens build with ``stop_bias=0`` and a token limit.
STOP_BIAS = {"tiny": 3.0, "full": 4.0}


def make_t3(out: str | Path, size: str = "tiny", seed: int = 0, stop_bias: float | None = None) -> Path:
    """Write ``t3_turbo_v1.safetensors`` into ``out`` (created); returns the file. ``stop_bias``:
    added to the stop token's bias (default :data:`STOP_BIAS` for the size)."""
    layers, width, positions = SIZES[size]
    g = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    state: dict[str, torch.Tensor] = {
        "tfmr.wte.weight": normal(TEXT_VOCAB, width),
        "tfmr.wpe.weight": normal(positions, width),
        "tfmr.ln_f.weight": torch.ones(width),
        "tfmr.ln_f.bias": torch.zeros(width),
        "cond_enc.spkr_enc.weight": normal(width, SPEAKER_DIM),
        "cond_enc.spkr_enc.bias": normal(width),
        "text_emb.weight": normal(TEXT_VOCAB, width),
        "speech_emb.weight": normal(SPEECH_VOCAB, width),
        "text_head.weight": normal(TEXT_VOCAB, width),
        "speech_head.weight": normal(SPEECH_VOCAB, width),
        "speech_head.bias": normal(SPEECH_VOCAB),
    }
    state["speech_head.bias"][STOP] += STOP_BIAS[size] if stop_bias is None else stop_bias
    for i in range(layers):
        p = f"tfmr.h.{i}."
        for ln in ("ln_1", "ln_2"):
            state[p + ln + ".weight"], state[p + ln + ".bias"] = torch.ones(width), torch.zeros(width)
        for name, n_in, n_out in (
            ("attn.c_attn", width, 3 * width),
            ("attn.c_proj", width, width),
            ("mlp.c_fc", width, 4 * width),
            ("mlp.c_proj", 4 * width, width),
        ):
            state[p + name + ".weight"], state[p + name + ".bias"] = normal(n_in, n_out), normal(n_out)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / T3_FILE))
    return folder / T3_FILE


#: HiFT widths per size: (filter channels, F0 predictor channels).
HIFT_SIZES = {"tiny": (64, 64), "full": (512, 512)}
#: Modules the official HiFT weight-normalises (stored as g = original0, v = original1).
_WEIGHT_NORMED = ("conv_pre", "ups.", "resblocks.", "source_resblocks.", "conv_post", "f0_predictor.condnet.")


def hift_state(size: str = "tiny", seed: int = 0, prefix: str = "mel2wav.") -> dict[str, torch.Tensor]:
    """A random HiFT state in the official layout (weight-normalised convolutions as g and v).

    Convolutions get HiFi-GAN's initialisation (normal, std 0.01), Snake's alphas scatter around 1.
    """
    from voxcast.models.chatterbox_turbo.hift import HiFT, HiFTConfig

    channels, f0_channels = HIFT_SIZES[size]
    torch.manual_seed(seed)  # nn.Module initialisation draws from the global generator
    model = HiFT(HiFTConfig(channels=channels, f0_channels=f0_channels))
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        value = value.clone()
        if key.endswith("alpha"):
            value = 1.0 + 0.1 * torch.randn(value.shape, generator=g)
        elif key.endswith(".weight") and value.dim() == 3:
            value = 0.01 * torch.randn(value.shape, generator=g)
        base = key[: -len(".weight")]
        if key.endswith(".weight") and value.dim() == 3 and key.startswith(_WEIGHT_NORMED):
            norm = value.norm(dim=tuple(range(1, value.dim())), keepdim=True)
            out[f"{prefix}{base}.parametrizations.weight.original0"] = norm
            out[f"{prefix}{base}.parametrizations.weight.original1"] = value
        else:
            out[prefix + key] = value
    return out


def ve_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A random ``ve.safetensors`` state (PyTorch's LSTM initialisation; the similarity scalars too)."""
    from voxcast.models.chatterbox_turbo.voice_encoder import VoiceEncoder

    torch.manual_seed(seed)
    state = {k: v.clone() for k, v in VoiceEncoder().state_dict().items()}
    state["similarity_weight"], state["similarity_bias"] = torch.tensor([10.0]), torch.tensor([-5.0])
    return state
