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


def campplus_state(seed: int = 0, prefix: str = "speaker_encoder.") -> dict[str, torch.Tensor]:
    """A random CAMPPlus state (the ``speaker_encoder.`` tensors of ``s3gen_meanflow.safetensors``).

    Convolutions get upstream's Kaiming-normal weights, batch norms random scales and shifts; their
    running means and variances are those of one training-mode pass over eight varied clips
    (speech-like sound at three levels, harmonic tones in noise), so each normalisation in eval mode is
    plausible (non-trivial) and x-vectors of other audio stay within tens.
    """
    import numpy as np
    from torch import nn

    from voxcast.models.chatterbox_turbo.campplus import CAMPPlus, kaldi_fbank
    from voxcast.testing.signals import speech_like

    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = CAMPPlus()
    model.to_empty(device="cpu")
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv1d, nn.Conv2d)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if module.bias is not None:
                    module.bias.copy_(0.05 * torch.randn(module.bias.shape, generator=g))
            elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
                module.reset_running_stats()
                module.momentum = None  # a cumulative average: one pass sets the batch's statistics
                if module.affine:
                    module.weight.copy_(1.0 + 0.1 * torch.randn(module.weight.shape, generator=g))
                    module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=g))
        rng = np.random.default_rng(seed)
        t = np.arange(41600) / 16000  # speech_like's 2 s and its 0.3 s of silence each side
        clips = [speech_like(2.0, 16000, seed=seed + i, level=(0.03, 0.1, 0.3)[i % 3]) for i in range(4)]
        for f0 in rng.uniform(80.0, 400.0, size=4):
            tones = sum(np.sin(2 * np.pi * f0 * h * t + rng.uniform(0, 6)) / h for h in range(1, 6))
            clips.append(
                (rng.uniform(0.02, 0.2) * tones + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
            )
        feats = [kaldi_fbank(torch.from_numpy(clip)) for clip in clips]
        model.train()(torch.stack([f - f.mean(dim=0, keepdim=True) for f in feats]))
    return {prefix + k: v.clone() for k, v in model.state_dict().items()}


#: S3 tokenizer sizes: (width, layers); heads of 64, 128 mels at every size.
S3_TOKENIZER_SIZES = {"tiny": (128, 2), "full": (1280, 6)}


def s3_tokenizer_state(
    size: str = "tiny", seed: int = 0, prefix: str = "tokenizer."
) -> dict[str, torch.Tensor]:
    """A random S3 tokenizer state as ``s3gen_meanflow.safetensors`` holds it (``_mel_filters`` and
    ``window`` included). PyTorch's initialisation; layer norms scattered around 1 and 0; the FSQ
    projection scaled so that its 8 digits take all three values and the tokens vary frame to frame."""
    from voxcast.models.chatterbox_turbo.s3_tokenizer import S3Tokenizer, S3TokenizerConfig

    width, layers = S3_TOKENIZER_SIZES[size]
    torch.manual_seed(seed)  # nn.Module initialisation draws from the global generator
    model = S3Tokenizer(S3TokenizerConfig(width=width, layers=layers))
    g = torch.Generator().manual_seed(seed)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for key, value in state.items():
        if "_ln." in key:
            centre = 1.0 if key.endswith("weight") else 0.0
            state[key] = centre + 0.1 * torch.randn(value.shape, generator=g)
    state["quantizer._codebook.project_down.weight"] = torch.randn(8, width, generator=g) * 1.5 / width**0.5
    state["quantizer._codebook.project_down.bias"] = 0.1 * torch.randn(8, generator=g)
    return {prefix + k: v for k, v in state.items()}


#: S3Gen estimator widths per size: (channels, transformer blocks per U-Net block, mid blocks, heads).
FLOW_SIZES = {"tiny": (32, 1, 2, 2), "full": (256, 4, 12, 8)}


def flow_state(size: str = "tiny", seed: int = 0, prefix: str = "flow.") -> dict[str, torch.Tensor]:
    """A random S3Gen flow state in the official layout (``flow.*`` of ``s3gen_meanflow.safetensors``).

    The encoder's widths are fixed (512 wide, as upstream's), so "tiny" shrinks the estimator only:
    32 channels, 1 transformer block per U-Net block, 2 mid blocks, 2 heads of 64 ("full": 256, 4, 12,
    8). Weights normal with std 1/sqrt(fan in), biases 0.02 x normal, layer norms 1 and 0 plus
    0.05 x normal, token embeddings standard normal, the meanflow time mixer [I | 0] (upstream's
    initialisation) plus noise.
    """
    from torch import nn

    from voxcast.models.chatterbox_turbo.s3gen_estimator import EstimatorConfig
    from voxcast.models.chatterbox_turbo.s3gen_flow import S3GenFlow

    channels, blocks, mid, heads = FLOW_SIZES[size]
    with torch.device("meta"):
        model = S3GenFlow(EstimatorConfig(channels=channels, blocks=blocks, mid_blocks=mid, heads=heads))
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        for key, p in module.named_parameters(recurse=False):
            noise = torch.randn(p.shape, generator=g)
            if isinstance(module, nn.LayerNorm):
                value = (1.0 if key == "weight" else 0.0) + 0.05 * noise
            elif isinstance(module, nn.Embedding):
                value = noise
            elif key == "weight":  # Linear and Conv1d: [out, in, (k)]
                value = noise * p.shape[1:].numel() ** -0.5
                if name.endswith("time_embed_mixer"):
                    value += torch.eye(*p.shape)
            else:
                value = 0.02 * noise
            out[f"{prefix}{name}.{key}"] = value
    return out
