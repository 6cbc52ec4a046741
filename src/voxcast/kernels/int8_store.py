"""The int8 weights a checkpoint quantizes to, kept on disk so that a later start skips the work.

Loading 0.6B with ``quant=int8`` on 2 CPU cores spent ~5 s quantizing the talker's and the code
predictor's projections (per-channel min/max, rounding, fbgemm's packing) and ~2 s laying the same
weights out for voxcast's kernel, every start, for the same result. The first start writes the result
(the int8 weights, their per-channel scales, biases and the kernel's layout) to one safetensors file
under ``VOXCAST_INT8_CACHE_DIR`` (default ``~/.cache/voxcast/int8``; ``off`` disables it), named by the
checkpoint's identity, PyTorch's version and this format's version. A later start reads it instead:
the checkpoint's float weights of those projections are then never converted (nor, being memory-mapped,
even read), and the model is bitwise the one quantization gives (same int8 values and scales; a test
compares the codes). Reading or writing the file never fails a load: a problem is logged, and the
weights are quantized as before (and the file written again).

On a serverless platform, point the directory at a volume the workers share (a RunPod network volume)
so that only the first worker ever quantizes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

__all__ = ["INT8_CACHE_ENV", "StoredInt8", "load", "save", "store_dir", "store_path"]

log = logging.getLogger(__name__)

INT8_CACHE_ENV = "VOXCAST_INT8_CACHE_DIR"
#: Bumped whenever what is stored, or how it is quantized, changes.
FORMAT = 1
_OFF = {"off", "0", "false", "no", "none"}


@dataclass
class StoredInt8:
    """What one file holds.

    Attributes:
        tensors: per quantized module (its name in the talker, e.g. ``model.layers.0.mlp.gate_up``):
            ``<name>.int8`` (int8 [N, K]), ``<name>.scale`` (float64 [N]), ``<name>.bias`` (if any) and
            ``<name>.packed.<variant>`` (the kernel's layout, where it was packed).
        sources: the talker's float weights these modules replace (``model.layers.0.mlp.gate_proj.weight``...).
        path: the file.
    """

    tensors: dict[str, Tensor]
    sources: tuple[str, ...]
    path: Path


def store_dir() -> Path | None:
    """Where the files are kept (None: off)."""
    raw = os.environ.get(INT8_CACHE_ENV, "").strip()
    if raw.lower() in _OFF:
        return None
    return Path(raw) if raw else Path.home() / ".cache" / "voxcast" / "int8"


def store_path(identity: str) -> Path | None:
    """The file for a checkpoint identity under this PyTorch (None: the store is off)."""
    root = store_dir()
    if root is None:
        return None
    key = json.dumps({"identity": identity, "torch": torch.__version__, "format": FORMAT}, sort_keys=True)
    return root / f"int8-{hashlib.sha256(key.encode()).hexdigest()[:32]}.safetensors"


def load(identity: str) -> StoredInt8 | None:
    """The stored weights for ``identity``, or None (none stored, the store is off or unreadable)."""
    path = store_path(identity)
    if path is None or not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:  # one open: the metadata, then the tensors
            meta = f.metadata() or {}
            if meta.get("identity") != identity or meta.get("format") != str(FORMAT):
                raise ValueError("written for another checkpoint or format")
            sources = tuple(json.loads(meta["sources"]))
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a Mapping)
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        log.warning("int8 weight store %s unreadable (%s): quantizing again", path, e)
        return None
    log.info("int8 weights read from %s (%d tensors)", path, len(tensors))
    return StoredInt8(tensors=tensors, sources=sources, path=path)


def save(identity: str, tensors: dict[str, Tensor], sources: list[str]) -> Path | None:
    """Write the store for ``identity`` (atomically: a reader never sees half a file). Returns the
    path, or None where the store is off or the write failed (logged)."""
    path = store_path(identity)
    if path is None:
        return None
    meta = {"identity": identity, "format": str(FORMAT), "sources": json.dumps(sources)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".int8-", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=meta)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, ValueError, SafetensorError) as e:
        log.warning("int8 weight store %s not written (%s)", path, e)
        return None
    log.info("int8 weights written to %s (%d tensors)", path, len(tensors))
    return path
