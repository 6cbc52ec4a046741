"""Checkpoint fingerprints (:mod:`voxcast.models.fingerprint`): the same bytes anywhere give the same
fingerprint; a dense change in any large tensor, any change in a small one or in a file that is not
safetensors where sampled, gives another."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from voxcast.models.fingerprint import BLOCK, BLOCKS, WHOLE, weights_fingerprint


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "big.weight": torch.randn(WHOLE // 4 * 3, generator=g).view(-1, 64),  # 3 MiB: sampled
        "small.bias": torch.randn(100, generator=g),  # hashed whole
        "other.weight": torch.randn(WHOLE // 4 * 2, generator=g).view(-1, 32),
    }


def _save(path: Path, state: dict[str, torch.Tensor]) -> Path:
    save_file(state, str(path))
    return path


def test_same_bytes_elsewhere_same_fingerprint(tmp_path: Path) -> None:
    a = _save(tmp_path / "a.safetensors", _state())
    (tmp_path / "copy").mkdir()
    b = Path(shutil.copy(a, tmp_path / "copy" / "a.safetensors"))
    assert weights_fingerprint([a]) == weights_fingerprint([b])
    assert len(weights_fingerprint([a])) == 16


def test_a_dense_change_in_any_large_tensor_is_seen(tmp_path: Path) -> None:
    base = weights_fingerprint([_save(tmp_path / "a.safetensors", _state())])
    for name in ("big.weight", "other.weight"):
        state = _state()
        state[name] = state[name] * 1.001  # a fine-tune: every value moves a little
        assert weights_fingerprint([_save(tmp_path / f"{name}.safetensors", state)]) != base


def test_one_value_of_a_small_tensor_is_seen(tmp_path: Path) -> None:
    base = weights_fingerprint([_save(tmp_path / "a.safetensors", _state())])
    state = _state()
    state["small.bias"][37] += 1.0  # e.g. a stop token's bias
    assert weights_fingerprint([_save(tmp_path / "b.safetensors", state)]) != base


def test_a_file_that_is_not_safetensors_is_sampled(tmp_path: Path) -> None:
    size = 3 * BLOCKS * BLOCK + WHOLE
    path = tmp_path / "w.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    before = weights_fingerprint([path])
    data = bytearray(path.read_bytes())
    data[size - 1] ^= 0xFF  # the last block ends the file
    path.write_bytes(bytes(data))
    assert weights_fingerprint([path]) != before


def test_order_and_sizes_count(tmp_path: Path) -> None:
    a, b = _save(tmp_path / "a", _state(1)), _save(tmp_path / "b", _state(2))
    assert weights_fingerprint([a, b]) != weights_fingerprint([b, a])
    (tmp_path / "c").write_bytes(b"x" * 5000)
    (tmp_path / "d").write_bytes(b"x" * 5001)
    assert weights_fingerprint([tmp_path / "c"]) != weights_fingerprint([tmp_path / "d"])
