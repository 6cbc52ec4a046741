"""The Perth watermark (voxcast.watermark): the packaged weights mark audio their detector finds and
leave unmarked audio unflagged; loading refuses what is not Perth's; the settings name their variable."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from voxcast.audio.formats import AudioFormat
from voxcast.errors import CheckpointError
from voxcast.testing.signals import speech_like
from voxcast.watermark import check_watermark, load_watermarker, mark, mark_file, watermark_from_env
from voxcast.watermark.perth import PerthConfig, PerthWatermarker, find_perth_weights

packaged = pytest.mark.skipif(find_perth_weights() is None, reason="resemble-perth is not installed")


def _random_weights(folder: Path, step: int, hidden: int = 8, seed: int = 0) -> Path:
    """A Perth-layout checkpoint with random weights at a small width, and its hparams.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hparams.yaml").write_text(f"hidden_size: {hidden}\nsample_rate: 32000\nn_fft: 2048\n")
    cfg = PerthConfig(hidden_size=hidden)
    torch.manual_seed(seed)
    from voxcast.watermark import perth

    state = {f"encoder.{k}": v for k, v in perth._Encoder(hidden, cfg.subband).state_dict().items()}
    state |= {f"decoder.{k}": v for k, v in perth._Decoder(hidden, cfg.subband).state_dict().items()}
    state["ap.spectrogram.window"] = torch.hann_window(2048)  # read by upstream, rebuilt by us
    path = folder / f"perth_net_{step:06d}.pth.tar"
    torch.save({"model": state, "step": step}, path)
    return path


@packaged
def test_packaged_weights_mark_what_their_detector_finds() -> None:
    wm = PerthWatermarker.load()
    for seed in (1, 2):
        x = speech_like(3.0, 24000, seed=seed, pause_s=0.3)
        marked = wm.apply(x, 24000)
        assert marked.dtype == np.float32 and 0 <= len(x) - len(marked) < 24000 // 100 + 1  # at most one hop
        assert wm.detect(marked, 24000) > 0.9
        assert wm.detect(x, 24000) < 0.1
    assert wm.detect(np.zeros(48000, dtype=np.float32), 24000) == 0.0  # silence: no mark, no NaN
    x = speech_like(2.013, 24000, seed=9)  # not a whole number of 10 ms hops
    padded = mark(wm, x, 24000)  # as long as the input: the official output, then zeros
    official = wm.apply(x, 24000)
    assert len(padded) == len(x) > len(official)
    assert np.array_equal(padded[: len(official)], official) and not padded[len(official) :].any()


@packaged
def test_a_marked_file_decodes_to_the_marked_audio() -> None:
    wm = PerthWatermarker.load()
    x = speech_like(2.0, 24000, seed=3)
    data = mark_file(wm, [x[:20000], x[20000:]], 24000, AudioFormat.WAV, 24000)
    pcm, sr = sf.read(io.BytesIO(data), dtype="float32")
    want = mark(wm, x, 24000)
    assert sr == 24000 and len(pcm) == len(want) == len(x)
    assert np.abs(pcm - want).max() < 1 / 16000  # int16 rounding only
    assert wm.detect(pcm, 24000) > 0.9


def test_loads_the_newest_checkpoint_of_a_folder_or_a_file(tmp_path: Path) -> None:
    old = _random_weights(tmp_path / "w", 1000, seed=1)
    new = _random_weights(tmp_path / "w", 20000, seed=2)
    assert PerthWatermarker.load(tmp_path / "w").source == str(new)
    assert PerthWatermarker.load(old).source == str(old)
    wm = PerthWatermarker.load(new)
    x = speech_like(1.0, 24000, seed=4)
    assert np.array_equal(wm.apply(x, 24000), PerthWatermarker.load(tmp_path / "w").apply(x, 24000))
    other = PerthWatermarker.load(old)
    assert not np.array_equal(other.apply(x, 24000), wm.apply(x, 24000))
    assert wm.identity != other.identity and wm.identity.startswith("perth-")  # cache keys tell them apart


def test_audio_shorter_than_half_a_window_is_left_as_it_is(tmp_path: Path) -> None:
    wm = PerthWatermarker.load(_random_weights(tmp_path, 1))
    x = speech_like(0.01, 24000, seed=1, lead_s=0.0, tail_s=0.0)
    assert np.array_equal(wm.apply(x, 24000), x)
    assert wm.detect(x, 24000) == 0.0


def test_refuses_what_is_not_a_perth_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        PerthWatermarker.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no \*_<step>\.pth\.tar"):
        PerthWatermarker.load(tmp_path / "empty")
    evil = tmp_path / "evil" / "perth_net_1.pth.tar"
    evil.parent.mkdir()
    evil.write_bytes(pickle.dumps({"model": {}, "step": 1, "code": print}, protocol=2))  # beyond tensors
    with pytest.raises(CheckpointError, match=r"VOXCAST_WATERMARK_MODEL.*not a checkpoint of tensors"):
        PerthWatermarker.load(evil)
    (tmp_path / "evil" / "hparams.yaml").write_text("hidden_size: [1, 2\n")
    with pytest.raises(CheckpointError, match=r"VOXCAST_WATERMARK_MODEL.*hparams\.yaml"):
        PerthWatermarker.load(evil)
    path = _random_weights(tmp_path / "w", 5)
    state = torch.load(path, weights_only=True)
    del state["model"]["encoder.layers.0.conv.weight"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"VOXCAST_WATERMARK_MODEL.*encoder"):
        PerthWatermarker.load(path)


def test_settings_name_their_variable() -> None:
    assert watermark_from_env({}) == ("off", None)
    assert watermark_from_env({"VOXCAST_WATERMARK": "Perth", "VOXCAST_WATERMARK_MODEL": "/w"}) == (
        "perth",
        "/w",
    )
    with pytest.raises(ValueError, match="VOXCAST_WATERMARK='audioseal'"):
        watermark_from_env({"VOXCAST_WATERMARK": "audioseal"})
    assert load_watermarker("off") is None
    with pytest.raises(ValueError, match="watermark='Perth'"):
        check_watermark("Perth")
    with pytest.raises(ValueError, match="watermark='audioseal'"):
        load_watermarker("audioseal")


def test_perth_without_weights_fails_naming_the_way_to_get_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from voxcast.watermark import perth

    monkeypatch.setattr(perth, "find_perth_weights", lambda: None)
    with pytest.raises(CheckpointError, match=r"voxcast\[watermark\]"):
        load_watermarker("perth")
