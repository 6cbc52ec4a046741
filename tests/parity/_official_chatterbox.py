"""The official chatterbox-tts 0.1.7 modules, for parity tests (installed ``--no-deps``).

``import chatterbox`` runs its package ``__init__``, which imports the whole pipeline (perth, librosa,
diffusers, s3tokenizer...). The parts under test import only torch, transformers and einops, so the
two package levels are registered as bare namespace modules and the wanted submodules load directly.
"""

from __future__ import annotations

import copy
import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

__all__ = ["import_chatterbox", "official_hift", "official_s3gen_encoder", "official_t3", "official_tokens"]


def import_chatterbox(module: str) -> types.ModuleType | None:
    """``chatterbox.<module>`` without the package's ``__init__``; None when it is not installed."""
    if "chatterbox" not in sys.modules:
        spec = importlib.util.find_spec("chatterbox")
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations)))
        packages = ("chatterbox", "chatterbox.models", "chatterbox.models.s3gen")
        for name in packages:
            path = root.joinpath(*name.split(".")[1:])
            mod = types.ModuleType(name)
            mod.__path__ = [str(path)]
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            mod.__spec__.submodule_search_locations = [str(path)]
            sys.modules[name] = mod
    try:
        return importlib.import_module(f"chatterbox.{module}")
    except ImportError:
        return None


def official_t3(folder: Path, layers: int, width: int, heads: int) -> Any:
    """The official ``T3`` with Turbo's settings (``ChatterboxTurboTTS.from_local``), built for the
    given GPT-2 shape (upstream hard-codes GPT-2 medium) and loaded strictly from ``folder``."""
    t3_mod = import_chatterbox("models.t3.t3")
    cfg_mod = import_chatterbox("models.t3.modules.t3_config")
    assert t3_mod is not None and cfg_mod is not None
    configs = import_chatterbox("models.t3.llama_configs")
    assert configs is not None
    shape = copy.deepcopy(configs.GPT2_MEDIUM_CONFIG)
    shape.update(n_layer=layers, n_embd=width, hidden_size=width, n_head=heads)
    name = f"GPT2_test_{layers}x{width}x{heads}"
    configs.LLAMA_CONFIGS[name] = shape
    t3_mod.LLAMA_CONFIGS[name] = shape
    hp = cfg_mod.T3Config(text_tokens_dict_size=50276)
    hp.llama_config_name = name
    hp.speech_tokens_dict_size = 6563
    hp.input_pos_emb = None
    hp.speech_cond_prompt_len = 375
    hp.use_perceiver_resampler = False
    hp.emotion_adv = False
    t3 = t3_mod.T3(hp)
    t3.load_state_dict(load_file(str(folder / "t3_turbo_v1.safetensors")))
    del t3.tfmr.wte
    return t3.eval()


def official_tokens(
    t3: Any, speaker: torch.Tensor, prompt: torch.Tensor, text: torch.Tensor, **kw: Any
) -> list[int]:
    """``T3.inference_turbo`` (the caller seeds PyTorch's global generator first)."""
    cond_mod = import_chatterbox("models.t3.modules.cond_enc")
    assert cond_mod is not None
    cond = cond_mod.T3Cond(
        speaker_emb=speaker, cond_prompt_speech_tokens=prompt, emotion_adv=0.5 * torch.ones(1, 1, 1)
    )
    return [int(x) for x in t3.inference_turbo(cond, text, **kw)[0]]


def official_hift(state: dict[str, torch.Tensor], channels: int, f0_channels: int) -> Any:
    """The official ``HiFTGenerator`` as ``S3Gen`` builds it, at the given widths, loaded strictly from
    a ``mel2wav.`` state."""
    hifigan = import_chatterbox("models.s3gen.hifigan")
    f0 = import_chatterbox("models.s3gen.f0_predictor")
    assert hifigan is not None and f0 is not None
    model = hifigan.HiFTGenerator(
        sampling_rate=24000,
        base_channels=channels,
        upsample_rates=[8, 5, 3],
        upsample_kernel_sizes=[16, 11, 7],
        source_resblock_kernel_sizes=[7, 7, 11],
        source_resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
        f0_predictor=f0.ConvRNNF0Predictor(cond_channels=f0_channels),
    )
    model.load_state_dict({k[len("mel2wav.") :]: v for k, v in state.items() if k.startswith("mel2wav.")})
    return model.eval()


def official_s3gen_encoder() -> Any:
    """The official ``UpsampleConformerEncoder`` with the arguments ``S3Gen`` gives it (random weights)."""
    mod = import_chatterbox("models.s3gen.transformer.upsample_encoder")
    assert mod is not None
    return mod.UpsampleConformerEncoder(
        output_size=512, attention_heads=8, linear_units=2048, num_blocks=6, dropout_rate=0.1,
        positional_dropout_rate=0.1, attention_dropout_rate=0.1, normalize_before=True, input_layer="linear",
        pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn", input_size=512,
        use_cnn_module=False, macaron_style=False,
    ).eval()  # fmt: skip
