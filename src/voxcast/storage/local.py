"""A blob store in a local directory: the embedded default when no bucket is configured.

Each object is the plain file ``<root>/<key>`` (a WAV is a WAV: the directory can be handed to a
PBX or copied as it is), with its content type and metadata in a sidecar
``<root>/.meta/<key>.json`` that also records the body's size, SHA-256 and inode.

Writes go to ``<root>/.tmp/`` first (same filesystem) and are published with ``os.replace``
(overwrite) or ``os.link`` (create-once: fails if the target exists, so among concurrent writers
exactly one wins; the body is the commit point), then the sidecar is published. Readers never see
a torn body; a reader that finds a body and a sidecar that do not belong together (a writer between
its two renames) retries briefly. A sidecar whose inode differs but whose size and SHA-256 match
(a store copied with ``cp -r`` or rsync) is accepted and updated. A body whose sidecar stays wrong
is refused as changed outside voxcast (a StorageError); a file with no sidecar (put there by hand)
is served without metadata, its content type guessed from its name; files stored by older versions
carried a ``VXB1`` header with their metadata and are still read.

Needs a filesystem with hard links (any local POSIX filesystem). A key cannot be both an object and
a "directory" of other keys here (S3 allows it); voxcast's own layouts never need that.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mimetypes
import os
import struct
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

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
from voxcast.storage.retention import RenderRetention

__all__ = ["LocalBlobStore"]

log = logging.getLogger(__name__)

_LEGACY_MAGIC = b"VXB1"  # files of older versions: magic, header length, header JSON, body
_LEGACY_HEAD = struct.Struct(">4sI")
_MAX_HEADER = 64 * 1024
_TMP_DIR = ".tmp"
_META_DIR = ".meta"
#: How long a reader waits for a writer between publishing a body and its sidecar.
_SIDECAR_WAIT_S = 0.5


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
    """Objects as plain files under ``root`` (created if missing), metadata in sidecars.

    Args:
        root: the store's directory.
        fsync: flush each written file to disk before publishing it (durable across power loss).
        max_render_bytes: a cap on rendered audio (``renders/``, ``audio/``); the oldest renders
            are deleted past it (:mod:`voxcast.storage.retention`). None: no cap.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, fsync: bool = True, max_render_bytes: int | None = None
    ) -> None:
        self.root = Path(root).expanduser().resolve()
        self.fsync = fsync
        #: The cap on rendered audio, or None.
        self.retention = (
            RenderRetention(self.root, self.root / _META_DIR, max_render_bytes) if max_render_bytes else None
        )
        try:
            (self.root / _TMP_DIR).mkdir(parents=True, exist_ok=True)
            (self.root / _META_DIR).mkdir(exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create the store directory {self.root}: {e}") from e

    def __repr__(self) -> str:
        return f"LocalBlobStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = self.root / validate_key(key)
        if not path.resolve().is_relative_to(self.root):  # a symlink planted inside the store
            raise StorageError(f"key {key!r} resolves outside the store")
        return path

    def _meta_path(self, key: str) -> Path:
        return self.root / _META_DIR / f"{key}.json"

    def _tmp(self) -> Path:
        return self.root / _TMP_DIR / f"{os.getpid()}-{uuid.uuid4().hex}"

    def _write_tmp(self, data: bytes) -> Path:
        tmp = self._tmp()
        with open(tmp, "xb") as fh:
            fh.write(data)
            if self.fsync:
                fh.flush()
                os.fsync(fh.fileno())
        return tmp

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
        meta = {"content_type": content_type, "metadata": check_metadata(metadata)}
        body: Path | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            body = self._write_tmp(data)
            ino = os.stat(body).st_ino  # a hard link and a rename keep the inode
            if if_none_match:
                try:
                    os.link(body, path)
                except FileExistsError:
                    log.debug("create-once %s: already exists", key)
                    return False
            else:
                os.replace(body, path)
            self._write_sidecar(key, meta, len(data), hashlib.sha256(data).hexdigest(), ino)
            if self.retention is not None and self.retention.applies(key):
                self.retention.wrote(len(data))
            return True
        except OSError as e:
            raise StorageError(f"writing {key!r} to {self.root} failed: {e}") from e
        finally:
            if body is not None:
                body.unlink(missing_ok=True)

    def _write_sidecar(self, key: str, meta: Mapping[str, Any], size: int, sha256: str, ino: int) -> None:
        side = self._meta_path(key)
        side.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_tmp(json.dumps({**meta, "size": size, "sha256": sha256, "ino": ino}).encode())
        try:
            os.replace(tmp, side)
        finally:
            tmp.unlink(missing_ok=True)

    def _open(self, key: str) -> tuple[BlobInfo, BinaryIO]:
        path = self._path(key)
        deadline = time.monotonic() + _SIDECAR_WAIT_S
        while True:
            try:
                fh = open(path, "rb")  # noqa: SIM115 - handed to the stream, which closes it
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
                raise BlobNotFound(f"no object {key!r}") from e
            except OSError as e:
                raise StorageError(f"opening {key!r} failed: {e}") from e
            try:
                info = self._info(key, fh)
            except BaseException:
                fh.close()
                raise
            if info is not None:
                return info, fh
            fh.close()
            if time.monotonic() > deadline:
                if not self._meta_path(key).exists():  # a file put there by hand: no metadata
                    fh = open(path, "rb")  # noqa: SIM115
                    size = os.fstat(fh.fileno()).st_size
                    guess = mimetypes.guess_type(key)[0] or "application/octet-stream"
                    return BlobInfo(key, size, guess, {}), fh
                raise StorageError(
                    f"object {key!r} does not match its metadata in {_META_DIR}/ (changed outside voxcast?)"
                )
            time.sleep(0.005)  # a writer between publishing the body and its sidecar

    def _info(self, key: str, fh: BinaryIO) -> BlobInfo | None:
        """The object's info, positioned at its body; None while body and sidecar disagree."""
        try:
            st = os.fstat(fh.fileno())
            try:
                side = json.loads(self._meta_path(key).read_bytes())
            except FileNotFoundError:
                side = None
            if side is None:
                return self._legacy_info(key, fh)
            if side.get("size") != st.st_size:
                return None
            if side.get("ino") != st.st_ino:
                if side.get("sha256") != _sha256_of(fh):
                    return None
                fh.seek(0)  # a copied store: same content, new inode; remember the new one
                self._write_sidecar(key, side, st.st_size, side["sha256"], st.st_ino)
            return BlobInfo(key, st.st_size, str(side["content_type"]), dict(side["metadata"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise StorageError(f"object {key!r} has corrupt metadata: {e}") from e

    @staticmethod
    def _legacy_info(key: str, fh: BinaryIO) -> BlobInfo | None:
        """A file written by an older version (header in the file), or None (no sidecar yet)."""
        fixed = fh.read(_LEGACY_HEAD.size)
        magic, n = _LEGACY_HEAD.unpack(fixed) if len(fixed) == _LEGACY_HEAD.size else (b"", 0)
        if magic != _LEGACY_MAGIC or n > _MAX_HEADER:
            fh.seek(0)
            return None
        header = json.loads(fh.read(n))
        size = os.fstat(fh.fileno()).st_size - _LEGACY_HEAD.size - n
        return BlobInfo(key, size, str(header["content_type"]), dict(header["metadata"]))

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
            self._meta_path(key).unlink(missing_ok=True)
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
        """Always None: a local path is no URL for a remote client (the file is at ``root / key``)."""
        validate_key(key)
        return None


def _sha256_of(fh: BinaryIO) -> str:
    fh.seek(0)
    h = hashlib.sha256()
    while chunk := fh.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()
