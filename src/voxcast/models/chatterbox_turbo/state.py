"""Checks that a checkpoint's tensors make the module they are loaded into (one message for every
part of Chatterbox Turbo)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from voxcast.errors import CheckpointError

__all__ = ["check_state"]


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
