"""Stand-in modules for the official packages' imports, in ``sys.modules`` only while a block runs."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator, Mapping

__all__ = ["swapped_modules"]


@contextlib.contextmanager
def swapped_modules(modules: Mapping[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` in ``sys.modules`` while the block runs; what was there (or nothing) afterwards."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
