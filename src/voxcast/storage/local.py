"""A blob store in a local directory: the embedded default when no bucket is configured.

Each object is one file at ``<root>/<key>`` holding a small header (magic, content type, metadata as
JSON) followed by the body, so an object and its metadata change together, atomically. Writes go to
``<root>/.tmp/`` first (same filesystem) and are published with ``os.replace`` (overwrite) or
``os.link`` (create-once: fails if the target exists), so readers never see a torn or mixed file and
among concurrent create-once writers exactly one wins. Needs a filesystem with hard links (any local
POSIX filesystem). A key cannot be both an object and a "directory" of other keys here (S3 allows it);
voxcast's own layouts never need that.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from voxcast.errors import StorageError
from voxcast.storage.base import (
    DEFAULT_CHUNK_BYTES,
    BlobInfo,
    BlobNotFound,
    BlobStore,
    BlobStream,
    check_metadata,
)
from voxcast.storage.keys import validate_key

__all__ = ["LocalBlobStore"]

log = logging.getLogger(__name__)

_MAGIC = b"VXB1"
_HEAD = struct.Struct(">4sI")  # magic, header JSON length
_MAX_HEADER = 64 * 1024
_TMP_DIR = ".tmp"


class _LocalStream(BlobStream):
    def __init__(self, info: BlobInfo, fh: BinaryIO) -> None:
        super().__init__(info)
        self._fh = fh

    def iter_chunks(self, chunk_size: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        try:
            while chunk := self._fh.read(chunk_size):
                yield chunk
        except OSError as e:
            raise StorageError(f"reading {self.info.key!r} failed: {e}") from e
        finally:
            self.close()

    def close(self) -> None:
        self._fh.close()


class LocalBlobStore(BlobStore):
    """Objects as files under ``root`` (created if missing).

    Args:
        root: the store's directory.
        fsync: flush each written file to disk before publishing it (durable across power loss).
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root).expanduser().resolve()
        self.fsync = fsync
        try:
            (self.root / _TMP_DIR).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the store directory {self.root}: {e}") from e

    def __repr__(self) -> str:
        return f"LocalBlobStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = self.root / validate_key(key)
        if not path.resolve().is_relative_to(self.root):  # a symlink planted inside the store
            raise StorageError(f"key {key!r} resolves outside the store")
        return path

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        if_none_match: bool = False,
    ) -> bool:
        path = self._path(key)
        header = json.dumps({"content_type": content_type, "metadata": check_metadata(metadata)}).encode()
        tmp = self.root / _TMP_DIR / f"{os.getpid()}-{uuid.uuid4().hex}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as fh:
                fh.write(_HEAD.pack(_MAGIC, len(header)) + header)
                fh.write(data)
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            if not if_none_match:
                os.replace(tmp, path)
                return True
            try:
                os.link(tmp, path)
            except FileExistsError:
                log.debug("create-once %s: already exists", key)
                return False
            return True
        except OSError as e:
            raise StorageError(f"writing {key!r} to {self.root} failed: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)

    def _open(self, key: str) -> tuple[BlobInfo, BinaryIO]:
        path = self._path(key)
        try:
            fh = open(path, "rb")  # noqa: SIM115 - handed to the stream, which closes it
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise BlobNotFound(f"no object {key!r}") from e
        except OSError as e:
            raise StorageError(f"opening {key!r} failed: {e}") from e
        try:
            return self._read_header(key, fh), fh
        except BaseException:
            fh.close()
            raise

    @staticmethod
    def _read_header(key: str, fh: BinaryIO) -> BlobInfo:
        try:
            fixed = fh.read(_HEAD.size)
            magic, n = _HEAD.unpack(fixed) if len(fixed) == _HEAD.size else (b"", 0)
            if magic != _MAGIC or n > _MAX_HEADER:
                raise StorageError(f"object {key!r} is not a voxcast blob file (bad header)")
            header = json.loads(fh.read(n))
            size = os.fstat(fh.fileno()).st_size - _HEAD.size - n
            return BlobInfo(key, size, str(header["content_type"]), dict(header["metadata"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StorageError(f"object {key!r} has a corrupt header: {e}") from e

    def open_stream(self, key: str) -> BlobStream:
        info, fh = self._open(key)
        return _LocalStream(info, fh)

    def head(self, key: str) -> BlobInfo | None:
        try:
            info, fh = self._open(key)
        except BlobNotFound:
            return None
        fh.close()
        return info

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except IsADirectoryError:
            return
        except OSError as e:
            raise StorageError(f"deleting {key!r} failed: {e}") from e

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        start_dir = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if start_dir:
            validate_key(start_dir, field="prefix")
        base = self.root / start_dir
        keys: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in filenames:
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix) and not name.startswith("."):
                        keys.append(key)
        except OSError as e:
            raise StorageError(f"listing {prefix!r} failed: {e}") from e
        yield from sorted(keys)

    def presigned_url(self, key: str, expires_s: int = 3600) -> str | None:
        """Always None: local files carry a header, and a path is no URL for a remote client."""
        validate_key(key)
        return None
