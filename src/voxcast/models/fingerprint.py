"""A cheap fingerprint of weight files' contents, for checkpoint identities.

A checkpoint's identity names its content in the audio cache's keys, the int8 store's file names and
the calibration cache. Hashing configs and byte counts alone gives a fine-tune the identity of the
model it was tuned from (same config, same sizes): its renders would be served from the other
model's cache and its int8 weights read from the other model's store. Hashing whole files costs
seconds per start (1-4 GB), so :func:`weights_fingerprint` reads a safetensors file tensor by tensor:
its header (names, dtypes, shapes, offsets) whole, every tensor up to :data:`WHOLE` bytes whole
(biases, norms, small heads: where a small edit goes), and :data:`BLOCKS` evenly spaced blocks of
:data:`BLOCK` bytes of every larger one (a fine-tune changes a matrix densely, so any tuned matrix
is seen). An edit confined to a few KiB of a large matrix could be missed. A file that is not
safetensors is sampled the same way as one large tensor.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

__all__ = ["BLOCK", "BLOCKS", "WHOLE", "weights_fingerprint"]

#: Tensors up to this many bytes are hashed whole.
WHOLE = 1 << 20
#: Blocks sampled per larger tensor (the first starts it, the last ends it), and their size in bytes.
BLOCKS = 16
BLOCK = 4096


def _sample(f: BinaryIO, h: hashlib._Hash, start: int, size: int) -> None:
    """Hash ``size`` bytes from ``start``: whole up to :data:`WHOLE`, else :data:`BLOCKS` blocks."""
    if size <= WHOLE:
        f.seek(start)
        h.update(f.read(size))
        return
    for i in range(BLOCKS):
        f.seek(start + i * (size - BLOCK) // (BLOCKS - 1))
        h.update(f.read(BLOCK))


def _tensors(f: BinaryIO, size: int) -> tuple[bytes, list[tuple[int, int]]] | None:
    """A safetensors file's header and its tensors' ``(start, bytes)`` in the file; None if not one."""
    if size < 8:
        return None
    f.seek(0)
    (n,) = struct.unpack("<Q", f.read(8))
    if n > min(size - 8, 100 << 20):
        return None
    header = f.read(n)
    try:
        entries = json.loads(header)
        spans = [
            (8 + n + int(v["data_offsets"][0]), int(v["data_offsets"][1]) - int(v["data_offsets"][0]))
            for k, v in entries.items()
            if k != "__metadata__"
        ]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return header, sorted(spans)


def weights_fingerprint(paths: Iterable[Path]) -> str:
    """16 hex digits from each file's size, header and sampled contents (in the order given)."""
    h = hashlib.sha256()
    for path in paths:
        size = path.stat().st_size
        h.update(f"{size};".encode())
        with path.open("rb") as f:
            parsed = _tensors(f, size)
            if parsed is None:
                _sample(f, h, 0, size)
                continue
            header, spans = parsed
            h.update(header)
            for start, nbytes in spans:
                _sample(f, h, start, nbytes)
    return h.hexdigest()[:16]
