"""The blob-store interface shared by the S3 and local-directory backends.

A :class:`BlobStore` holds immutable-looking objects (bytes + content type + small string metadata)
under keys checked by :func:`voxcast.storage.keys.validate_key`. Writes are atomic from a reader's
point of view (a reader sees the old object, the new one, or nothing; never a mixture). With
``if_none_match=True`` a write is create-once: among concurrent writers of one key exactly one wins and
the stored object is entirely the winner's; the others get ``False``, which is not an error.

Every backend failure (unreachable server, missing bucket, I/O error) is a
:class:`~voxcast.errors.StorageError`; a missing key on a read is :class:`BlobNotFound` (a subclass).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType

from voxcast.errors import StorageError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "MAX_METADATA_BYTES",
    "BlobInfo",
    "BlobNotFound",
    "BlobStore",
    "BlobStream",
    "check_metadata",
]

DEFAULT_CHUNK_BYTES = 64 * 1024
"""Default chunk size of streaming reads."""

MAX_METADATA_BYTES = 2000
"""Total size of user metadata (keys + values); S3 allows 2 KB in the request headers."""

_META_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


class BlobNotFound(StorageError):
    """A read of a key that holds no object."""

    code = "blob_not_found"


@dataclass(frozen=True)
class BlobInfo:
    """What a store knows about one object without reading its body."""

    key: str
    size: int
    content_type: str = "application/octet-stream"
    metadata: Mapping[str, str] = field(default_factory=dict)


def check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """Validate user metadata so that both backends store it identically.

    Keys: lowercase ``[a-z0-9-]`` (S3 lowercases them anyway); values: printable ASCII; total
    <= :data:`MAX_METADATA_BYTES`. JSON-encode (``ensure_ascii=True``) anything richer.

    Raises:
        ValueError: metadata that S3 would mangle or reject.
    """
    out = dict(metadata or {})
    total = 0
    for k, v in out.items():
        if not _META_KEY_RE.match(k):
            raise ValueError(f"metadata key {k!r} must match [a-z0-9][a-z0-9-]*")
        if not isinstance(v, str) or not v.isascii() or not v.isprintable():
            raise ValueError(f"metadata value of {k!r} must be printable ASCII")
        total += len(k) + len(v)
    if total > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is {total} bytes; the limit is {MAX_METADATA_BYTES}")
    return out


class BlobStream(ABC):
    """An open object: its :class:`BlobInfo` plus a body to stream once. Close it (or use ``with``)."""

    def __init__(self, info: BlobInfo) -> None:
        self.info = info

    @abstractmethod
    def iter_chunks(self, chunk_size: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
        """Yield the body in pieces of at most ``chunk_size`` bytes (non-empty).

        Raises:
            StorageError: the body could not be read to the end.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the connection or file handle (idempotent)."""

    def read(self) -> bytes:
        """The whole body.

        Raises:
            StorageError: the body was shorter than announced or could not be read.
        """
        data = b"".join(self.iter_chunks(1 << 20))
        if len(data) != self.info.size:
            raise StorageError(f"object {self.info.key!r}: read {len(data)} of {self.info.size} bytes")
        return data

    def __enter__(self) -> BlobStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class BlobStore(ABC):
    """A key -> object store. Implementations are thread-safe."""

    #: Whether calls cross a network and so may hang (request-path calls then get deadlines).
    remote: bool = False

    @abstractmethod
    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        if_none_match: bool = False,
    ) -> bool:
        """Store ``data`` under ``key`` atomically.

        Args:
            key: object key (validated).
            data: the whole body.
            content_type: MIME type, returned by reads and presigned GETs.
            metadata: small string metadata (see :func:`check_metadata`).
            if_none_match: create-once: do nothing if ``key`` already holds an object.

        Returns:
            True if this call stored the object; False if ``if_none_match`` and it already existed.

        Raises:
            InvalidRequest: unsafe key. ValueError: bad metadata. StorageError: the write failed.
        """

    @abstractmethod
    def open_stream(self, key: str) -> BlobStream:
        """Open ``key`` for a streaming read (one request; the info comes with the body).

        Raises:
            BlobNotFound: no object under ``key``. StorageError: any other failure.
        """

    @abstractmethod
    def head(self, key: str) -> BlobInfo | None:
        """Size, content type and metadata of ``key``, or None if it holds no object.

        Raises:
            StorageError: the store could not be asked.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if absent).

        Raises:
            StorageError: the delete failed.
        """

    @abstractmethod
    def list_keys(self, prefix: str = "") -> Iterator[str]:
        """Keys starting with ``prefix``, in lexicographic order (lazily paginated).

        Raises:
            StorageError: listing failed.
        """

    @abstractmethod
    def presigned_url(self, key: str, expires_s: int = 3600) -> str | None:
        """A URL that GETs ``key`` without credentials for ``expires_s`` seconds, or None if the
        backend has no such thing (the local directory). Does not check that the key exists."""

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing to release
        """Release clients and pools (optional)."""

    def get_bytes(self, key: str) -> bytes:
        """The whole body of ``key``.

        Raises:
            BlobNotFound: no object under ``key``. StorageError: any other failure.
        """
        with self.open_stream(key) as stream:
            return stream.read()

    def iter_chunks(self, key: str, chunk_size: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
        """Stream ``key``. The object is opened when this is called (a missing key raises here, not
        on the first ``next()``); the body is read as the iterator is consumed.

        Raises:
            BlobNotFound: no object under ``key``. StorageError: any other failure.
        """
        stream = self.open_stream(key)
        return _closing_iter(stream, chunk_size)

    def exists(self, key: str) -> bool:
        """True if ``key`` holds an object."""
        return self.head(key) is not None


def _closing_iter(stream: BlobStream, chunk_size: int) -> Iterator[bytes]:
    with stream:
        yield from stream.iter_chunks(chunk_size)
