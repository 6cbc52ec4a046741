"""Checks that a checkpoint's tensors make the module they are loaded into (one message for every
part of Chatterbox Turbo)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from voxcast.errors import CheckpointError

__all__ = ["check_state", "read_state"]


def read_state(path: Path, prefix: str = "") -> dict[str, Tensor]:
    """The tensors of the safetensors file ``path`` whose names start with ``prefix`` (on the CPU).

    Raises:
        CheckpointError: the file is missing (the checkpoint is incomplete) or unreadable.
    """
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: no {path.name} (not a complete Chatterbox Turbo checkpoint)")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}  # noqa: SIM118
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{path}: cannot read weights: {e}") from e


def check_state(module: nn.Module, state: Mapping[str, Tensor], what: str) -> None:
    """Raise :class:`CheckpointError` naming the tensors ``state`` lacks, has in excess or has in
    another shape than ``module`` needs (``what``: where they came from, for the message)."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"{what}: missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shape {wrong[:5]}"
        )
