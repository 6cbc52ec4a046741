"""The public API: a handful of names, importable from ``voxcast``, loaded on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import voxcast


def test_every_public_name_resolves_to_its_defining_object() -> None:
    from voxcast.engine.engine import Engine
    from voxcast.service import Service

    assert len(voxcast.__all__) <= 12
    for name in voxcast.__all__:
        assert getattr(voxcast, name).__name__ == name
    assert voxcast.Engine is Engine
    assert voxcast.Service is Service


def test_import_voxcast_loads_no_torch() -> None:
    code = "import sys, voxcast; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = voxcast.no_such_name  # type: ignore[attr-defined]
