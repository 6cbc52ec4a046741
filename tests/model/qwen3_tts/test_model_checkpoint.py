"""Checkpoint resolution, layout validation, loading (fp32/bf16) and the identity string."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from voxcast.errors import CheckpointError
from voxcast.models.qwen3_tts.checkpoint import locate_checkpoint, resolve_checkpoint
from voxcast.models.qwen3_tts.model import Qwen3TTS


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    "missing",
    [
        "config.json",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "model.safetensors",
        "speech_tokenizer/config.json",
        "speech_tokenizer/model.safetensors",
    ],
)
def test_missing_file_is_named(tiny_model_dir: Any, tmp_path: Path, missing: str) -> None:
    root = _copy(tiny_model_dir("custom_voice"), tmp_path / "m")
    (root / missing).unlink()
    with pytest.raises(CheckpointError, match=missing.split("/")[-1]) as e:
        Qwen3TTS.from_pretrained(str(root))
    assert missing in str(e.value)


def test_several_missing_files_all_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError) as e:
        locate_checkpoint(tmp_path)
    for name in ("vocab.json", "model.safetensors", "speech_tokenizer/config.json"):
        assert name in str(e.value)


def test_sharded_weights(tiny_model_dir: Any, tmp_path: Path) -> None:
    root = _copy(tiny_model_dir("custom_voice"), tmp_path / "m")
    state = load_file(str(root / "model.safetensors"))
    keys = sorted(state)
    half = len(keys) // 2
    shards = {
        "model-00001-of-00002.safetensors": keys[:half],
        "model-00002-of-00002.safetensors": keys[half:],
    }
    weight_map = {}
    for name, ks in shards.items():
        save_file({k: state[k] for k in ks}, str(root / name))
        weight_map.update(dict.fromkeys(ks, name))
    (root / "model.safetensors").unlink()
    import json

    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    files = locate_checkpoint(root)
    assert len(files.weights) == 2
    model = Qwen3TTS.from_pretrained(str(root))
    assert torch.equal(model.talker.codec_head.weight, state["talker.codec_head.weight"])
    (root / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002"):
        locate_checkpoint(root)


def test_weights_that_do_not_match_the_config(tiny_model_dir: Any, tmp_path: Path) -> None:
    root = _copy(tiny_model_dir("custom_voice"), tmp_path / "m")
    state = load_file(str(root / "model.safetensors"))
    state.pop("talker.codec_head.weight")
    state["talker.model.norm.weight"] = torch.ones(3)
    state["extra.weight"] = torch.ones(1)
    save_file(state, str(root / "model.safetensors"))
    with pytest.raises(CheckpointError) as e:
        Qwen3TTS.from_pretrained(str(root))
    msg = str(e.value)
    assert "talker.codec_head.weight" in msg and "extra.weight" in msg and "talker.model.norm.weight" in msg


def test_corrupt_weights(tiny_model_dir: Any, tmp_path: Path) -> None:
    root = _copy(tiny_model_dir("custom_voice"), tmp_path / "m")
    (root / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        Qwen3TTS.from_pretrained(str(root))


def test_resolve_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        resolve_checkpoint(f)
    with pytest.raises(CheckpointError, match="no such directory"):
        resolve_checkpoint(tmp_path / "a" / "b" / "c")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError, match="offline"):
        resolve_checkpoint("nobody/not-a-real-model-xyz")
    assert resolve_checkpoint(tmp_path) == tmp_path


def test_hub_id_from_the_local_cache(
    tiny_model_dir: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub id resolves offline from a hub cache laid out as huggingface_hub writes it."""
    src = tiny_model_dir("voice_design")
    repo = tmp_path / "hub" / "models--acme--tiny-tts"
    commit = "0" * 40
    shutil.copytree(src, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    model = Qwen3TTS.from_pretrained("acme/tiny-tts")
    assert model.model_type == "voice_design"


def test_identity_is_stable_and_location_free(tiny_model_dir: Any, tmp_path: Path) -> None:
    src = tiny_model_dir("custom_voice")
    a = Qwen3TTS.from_pretrained(str(src))
    b = Qwen3TTS.from_pretrained(str(_copy(src, tmp_path / "elsewhere")))
    assert a.identity == b.identity
    assert a.identity.startswith("qwen3-tts-12hz-0b6-custom_voice:")
    other = Qwen3TTS.from_pretrained(str(tiny_model_dir("voice_design")))
    assert other.identity != a.identity


def test_facade_attributes(tiny_model_dir: Any) -> None:
    m = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")))
    assert m.model_type == "custom_voice"
    assert m.sample_rate == 24000 and m.samples_per_frame == 1920
    assert "ryan" in m.speakers and m.languages[0] == "auto"
    assert m.load_s > 0
    assert not any(p.requires_grad for p in m.net.parameters())
    assert m.net.speaker_encoder is None and m.codec_encoder is None


def test_base_model_has_encoders(tiny_model_dir: Any) -> None:
    m = Qwen3TTS.from_pretrained(str(tiny_model_dir("base")))
    assert m.net.speaker_encoder is not None and m.codec_encoder is not None
    assert m.speakers == ()


def test_bfloat16_weights(tiny_model_dir: Any) -> None:
    m = Qwen3TTS.from_pretrained(str(tiny_model_dir("custom_voice")), dtype=torch.bfloat16)
    assert {p.dtype for p in m.net.parameters()} == {torch.bfloat16}
    assert m.talker.inv_freq.dtype == torch.float32  # RoPE tables stay float32


def test_a_tuned_copy_with_the_same_config_and_sizes_has_its_own_identity(
    tiny_model_dir: Any, tmp_path: Path
) -> None:
    """A fine-tune keeps the config and the byte counts: the identity (audio cache keys, int8 store)
    must still tell it from the model it was tuned from."""
    from voxcast.models.qwen3_tts.checkpoint import checkpoint_identity
    from voxcast.models.qwen3_tts.config import Qwen3TTSConfig

    def identity(root: Path) -> str:
        files = locate_checkpoint(root)
        return checkpoint_identity(files, Qwen3TTSConfig.from_file(files.config))

    src = tiny_model_dir("custom_voice")
    tuned = _copy(src, tmp_path / "tuned")
    weights = tuned / "model.safetensors"
    state = load_file(str(weights))
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata()
    tuned_layers = [k for k in state if ".layers." in k and k.endswith("proj.weight")]
    assert tuned_layers
    for name in tuned_layers:  # what a fine-tune (or a merged LoRA) changes: the layers' matrices
        state[name] = state[name] * 1.01
    size = weights.stat().st_size
    save_file(state, str(weights), metadata=metadata)
    assert weights.stat().st_size == size  # same layout, other values
    assert identity(tuned) != identity(src)
    assert identity(_copy(src, tmp_path / "plain")) == identity(src)
