"""Per-layer key/value cache of the talker and the code predictor (see :class:`KVCache`)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache"]


class KVCache:
    """Keys/values of one attention layer: ``[B, H_kv, S, D]`` each, holding up to ``max_len`` positions.

    With ``reserve`` the tensors start with room for that many positions and grow (doubling, capped
    at ``max_len``, old positions copied) when :meth:`update` writes past them, so a stream holds
    memory for the positions it used rather than for its frame limit: a 0.6B float32 talker keeps
    224 KiB per position, and a 2400-frame limit would otherwise reserve ~550 MB per stream up front.
    Without ``reserve`` (compiled static-shape steps read whole tensors) all ``max_len`` positions are
    allocated at once. Positions past the last write are never read (views stop at the last write).
    """

    def __init__(
        self,
        batch: int,
        heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        reserve: int | None = None,
    ) -> None:
        self._max_len = max_len
        size = max_len if reserve is None else max(1, min(max_len, reserve))
        shape = (batch, heads, size, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @classmethod
    def wrap(cls, k: Tensor, v: Tensor) -> KVCache:
        """A cache over existing ``k``/``v`` tensors (no copy, no growth)."""
        cache = cls.__new__(cls)
        cache.k, cache.v = k, v
        cache._max_len = int(k.shape[2])
        return cache

    @property
    def max_len(self) -> int:
        """Positions this cache may hold."""
        return self._max_len

    @property
    def capacity(self) -> int:
        """Positions allocated now (<= ``max_len``)."""
        return int(self.k.shape[2])

    def reserve(self, length: int) -> None:
        """Make room for positions ``[0, length)`` (at least doubling), keeping what is written.

        Raises:
            ValueError: ``length`` exceeds ``max_len``.
        """
        if length <= self.capacity:
            return
        if length > self._max_len:
            raise ValueError(f"KV cache overflow: position {length} > {self._max_len}")
        size = min(self._max_len, max(length, 2 * self.capacity))
        b, h, old, d = self.k.shape
        for name in ("k", "v"):
            t = getattr(self, name)
            grown = torch.zeros((b, h, size, d), dtype=t.dtype, device=t.device)
            grown[:, :, :old] = t
            setattr(self, name, grown)

    def update(self, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write ``k, v [B, H_kv, L, D]`` at ``start`` and return views of positions ``[0, start + L)``."""
        end = start + k.shape[2]
        if end > self.capacity:
            self.reserve(end)
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]
