"""Store commands of ``voxcast``: export a library (or any prefix) as plain files or an archive.

::

    voxcast export libraries/acme/ ./acme            # a directory of mulaw8k/*.wav, mp3/*.mp3, ...
    voxcast export libraries/acme/mulaw8k/ acme-mulaw.zip
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["add_parsers"]
from voxcast.serving.cli.errors import CommandError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="copy stored objects under a prefix (e.g. libraries/<name>/) to a directory or archive",
        description="Works on the configured store: S3 (VOXCAST_S3_BUCKET) or the local directory "
        "(VOXCAST_STORAGE_DIR). Keys are written relative to the prefix's last '/'.",
    )
    p.add_argument("prefix", help="key prefix, e.g. libraries/acme/ or renders/")
    p.add_argument("dest", type=Path, help="a directory, or an archive named .zip, .tar, .tar.gz or .tgz")
    p.set_defaults(func=run_export)


#: Archive names export cannot write: refused rather than made into a folder of that name.
_OTHER_ARCHIVES = (
    ".rar",
    ".7z",
    ".bz2",
    ".xz",
    ".gz",
    ".zst",
    ".tbz2",
    ".txz",
    ".lz",
    ".lzma",
    ".cab",
    ".jar",
)


def run_export(args: argparse.Namespace) -> int:
    name = args.dest.name.lower()
    supported = name.endswith((".zip", ".tar", ".tar.gz", ".tgz"))
    if not supported and name.endswith(_OTHER_ARCHIVES) and not args.dest.is_dir():
        raise CommandError(
            f"dest: cannot write {args.dest.name!r}: export writes a directory or a .zip, .tar, .tar.gz or "
            ".tgz archive",
            code=2,
        )
    from voxcast.storage.config import StorageConfig
    from voxcast.storage.export import export_prefix
    from voxcast.storage.factory import open_store

    store = open_store(StorageConfig.from_env(os.environ))
    try:
        report = export_prefix(store, args.prefix, args.dest)
    finally:
        store.close()
    print(json.dumps({"dest": report.dest, "files": report.files, "bytes": report.bytes}))
    return 0
