"""Shared test setup: fixtures live in tests/fixtures/ (one plugin module per real service)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

_PLUGINS = ["tests.fixtures.models", "tests.fixtures.engines", "tests.fixtures.redis", "tests.fixtures.s3"]
pytest_plugins = [p for p in _PLUGINS if importlib.util.find_spec(p) is not None]

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

# Warm-up measures the decode thread again in every test (and in the processes tests start), rather
# than recall a choice an earlier run stored; tests of that cache point it at a folder of their own.
os.environ.setdefault("VOXCAST_CALIBRATION_DIR", "off")
os.environ.setdefault("VOXCAST_INT8_CACHE_DIR", "off")  # tests of the int8 store use a folder of their own


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU-marked tests where no CUDA device exists."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
