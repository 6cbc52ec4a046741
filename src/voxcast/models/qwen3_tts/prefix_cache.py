"""Per-voice prefix KV cache: the talker keys/values of a prompt's constant leading positions.

The leading positions of a prompt (instruct block, role, codec tags, speaker slot, and for an ICL
voice its reference-text positions) depend only on the voice, speaker, language and instruct, not
on the text to speak. The first request of such a prefix runs the ordinary one-pass prefill
(bitwise the uncached path); its prefix keys/values are then copied out of its cache at no extra
model cost. Later requests copy them into their fresh cache and prefill only the rest, starting at
``prefix_len``: equal to a one-pass prefill up to the dtype's rounding (~1e-7 relative in float32,
where greedy codes stay equal; in bfloat16 the differences are large enough for greedy codes of
the tiny random checkpoint to diverge after some frames: 2 of 3 texts). With int8
weights (:mod:`voxcast.models.qwen3_tts.accel.quant`, activations quantized per call over all of the call's rows) a hit differs
from a miss by int8 noise instead: on the tiny checkpoint the last-position logits of hit and miss
were equally far from float32 (max abs 6-9e-2 each), but greedy codes then diverge from the miss's.

Keys are :attr:`.prompt.Prompt.prefix_key` digests, which cover the model identity, dtype, quant
and device as well as every input of the cached positions. The store is a byte-bounded LRU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from voxcast.lru import ByteLRU
from voxcast.models.qwen3_tts.kv_cache import KVCache

__all__ = ["PREFIX_KV_BYTES", "PrefixKVCache"]

#: Default budget of a model's prefix KV cache. A 0.6B float32 talker holds 224 KiB per position
#: (28 layers x K,V x 8 heads x 128 x 4 bytes), so an ICL voice of ~20 cached positions is ~4.5 MiB.
PREFIX_KV_BYTES = 256 << 20


@dataclass(frozen=True)
class _Entry:
    k: Tensor  # [layers, 1, H_kv, P, D]
    v: Tensor  # [layers, 1, H_kv, P, D]

    @property
    def length(self) -> int:
        return int(self.k.shape[3])

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class PrefixKVCache:
    """Byte-bounded LRU of prefix keys/values, with hit and miss counters.

    Args:
        max_bytes: budget for all entries; an entry larger than this is not kept.

    Attributes:
        hits, misses: lookups by :meth:`load` that found / did not find their key.
    """

    def __init__(self, max_bytes: int = PREFIX_KV_BYTES) -> None:
        self._lru: ByteLRU[_Entry] = ByteLRU(max_bytes)
        self.hits = 0
        self.misses = 0

    @property
    def max_bytes(self) -> int:
        """The byte budget."""
        return self._lru.max_bytes

    @property
    def nbytes(self) -> int:
        """Bytes held by the entries."""
        return self._lru.nbytes

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    def load(self, key: str, length: int, cache: list[KVCache]) -> bool:
        """Copy the entry of ``key`` into positions ``[0, length)`` of ``cache``.

        Returns:
            True on a hit; False (cache untouched) when the key is absent or its entry has another length.
        """
        entry = self._lru.get(key)
        if entry is None or entry.length != length:
            self.misses += 1
            return False
        for i, layer in enumerate(cache):
            layer.k[:, :, :length] = entry.k[i]
            layer.v[:, :, :length] = entry.v[i]
        self.hits += 1
        return True

    def store(self, key: str, length: int, cache: list[KVCache]) -> None:
        """Keep a copy of positions ``[0, length)`` of a prefilled ``cache`` under ``key``."""
        if length <= 0 or key in self._lru:
            return
        k = torch.stack([layer.k[:, :, :length] for layer in cache])  # [layers, 1, H_kv, P, D], a copy
        v = torch.stack([layer.v[:, :, :length] for layer in cache])
        entry = _Entry(k, v)
        self._lru.put(key, entry, entry.nbytes)

    def clear(self) -> None:
        """Drop every entry (counters are kept)."""
        self._lru = ByteLRU(self._lru.max_bytes)
