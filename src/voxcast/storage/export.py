"""Copy the objects under a prefix (a prerendered library, renders) out of any store, as plain files.

The destination is a directory (``<dest>/<key relative to the prefix>``) or, by its name, an archive
(``.zip``, ``.tar``, ``.tar.gz`` / ``.tgz``). Files are written to a temporary name and renamed, and
an archive is built beside its final name and renamed when complete, so an interrupted export never
leaves a truncated file under a final name.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

from voxcast.storage.base import BlobStore

__all__ = ["ExportReport", "export_prefix"]

_ARCHIVES = (".zip", ".tar", ".tar.gz", ".tgz")


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote."""

    dest: str
    files: int
    bytes: int


def _archive_kind(dest: Path) -> str | None:
    name = dest.name.lower()
    return next((ext for ext in _ARCHIVES if name.endswith(ext)), None)


def export_prefix(store: BlobStore, prefix: str, dest: str | os.PathLike[str]) -> ExportReport:
    """Copy every object whose key starts with ``prefix`` to ``dest`` (directory or archive).

    Raises:
        FileNotFoundError: nothing is stored under ``prefix``.
        StorageError: the store failed. OSError: the destination cannot be written.
    """
    out = Path(dest)
    keys = list(store.list_keys(prefix))
    if not keys:
        raise FileNotFoundError(f"nothing is stored under {prefix!r}")
    base = prefix[: prefix.rfind("/") + 1]  # keys are written relative to the prefix's last "/"
    kind = _archive_kind(out)
    total = 0
    if kind is None:
        for key in keys:
            data = store.get_bytes(key)
            target = out / key[len(base) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            total += len(data)
        return ExportReport(str(out), len(keys), total)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        if kind == ".zip":
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
                for key in keys:
                    data = store.get_bytes(key)
                    zf.writestr(key[len(base) :], data)
                    total += len(data)
        else:
            with tarfile.open(tmp, "w:gz") if kind in (".tar.gz", ".tgz") else tarfile.open(tmp, "w") as tf:
                for key in keys:
                    data = store.get_bytes(key)
                    member = tarfile.TarInfo(key[len(base) :])
                    member.size, member.mtime, member.mode = len(data), int(time.time()), 0o644
                    tf.addfile(member, io.BytesIO(data))
                    total += len(data)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return ExportReport(str(out), len(keys), total)
