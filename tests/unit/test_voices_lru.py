"""ByteLRU: a budget in bytes, least recently used out first."""

from __future__ import annotations

import pytest

from voxcast.voices import ByteLRU


def test_evicts_least_recently_used_by_bytes() -> None:
    lru: ByteLRU[str] = ByteLRU(100)
    lru.put("a", "A", 40)
    lru.put("b", "B", 40)
    assert lru.get("a") == "A"  # a is now most recent
    lru.put("c", "C", 40)  # 120 > 100: evicts b
    assert "b" not in lru and lru.get("a") == "A" and lru.get("c") == "C"
    assert lru.nbytes == 80 and len(lru) == 2


def test_oversized_item_not_cached_and_replace_updates_size() -> None:
    lru: ByteLRU[int] = ByteLRU(10)
    assert lru.put("big", 1, 11) is False and "big" not in lru and lru.nbytes == 0
    lru.put("k", 1, 5)
    lru.put("k", 2, 7)
    assert lru.get("k") == 2 and lru.nbytes == 7
    lru.discard("k")
    lru.discard("k")
    assert lru.nbytes == 0 and lru.get("k") is None


def test_negative_budget_rejected() -> None:
    with pytest.raises(ValueError):
        ByteLRU(-1)
