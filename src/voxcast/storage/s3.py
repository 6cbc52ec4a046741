"""A blob store on S3 or any S3-compatible endpoint; the only module of voxcast that imports boto3.

The boto3 client is injected (or built by :func:`make_s3_client` from a
:class:`~voxcast.storage.config.StorageConfig`): retries with exponential backoff come from botocore's
``standard`` retry mode. Create-once writes use ``PutObject`` with ``IfNoneMatch="*"``: S3 answers
412 when the key exists, and a PUT is atomic, so concurrent writers cannot mix their bodies.
Every boto/connection failure becomes a :class:`~voxcast.errors.StorageError` (``raise ... from e``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

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

if TYPE_CHECKING:
    from voxcast.storage.config import StorageConfig

__all__ = ["S3BlobStore", "make_s3_client"]

log = logging.getLogger(__name__)

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_CONFLICT_RETRIES = 3


def make_s3_client(config: StorageConfig) -> Any:
    """A thread-safe boto3 S3 client for ``config`` (timeouts, retries, addressing style)."""
    session = boto3.session.Session(
        aws_access_key_id=config.access_key_id,
        aws_secret_access_key=config.secret_access_key,
        aws_session_token=config.session_token,
        profile_name=config.profile,
        region_name=config.region,
    )
    botocfg = Config(
        s3={"addressing_style": "path" if config.path_style else "auto"},
        retries={"total_max_attempts": config.max_attempts, "mode": "standard"},  # the first one included
        connect_timeout=config.connect_timeout_s,
        read_timeout=config.read_timeout_s,
        max_pool_connections=config.max_pool_connections,
        signature_version="s3v4",
    )
    return session.client("s3", endpoint_url=config.endpoint_url, config=botocfg)


def _code(e: ClientError) -> tuple[str, int]:
    err = e.response.get("Error", {})
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(err.get("Code", "")), int(status or 0)


class _S3Stream(BlobStream):
    def __init__(self, info: BlobInfo, body: Any, store: S3BlobStore) -> None:
        super().__init__(info)
        self._body = body
        self._store = store

    def iter_chunks(self, chunk_size: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        try:
            with self._store._errors("read", self.info.key):
                yield from self._body.iter_chunks(chunk_size)
        finally:
            self.close()

    def close(self) -> None:
        self._body.close()


class S3BlobStore(BlobStore):
    """Objects in ``bucket`` under ``prefix``.

    Args:
        client: a boto3 S3 client (thread-safe; see :func:`make_s3_client`).
        bucket: bucket name.
        prefix: key prefix (no leading/trailing ``/`` needed), e.g. ``voxcast/prod``.
        check_bucket: verify now that the bucket exists and is reachable.

    Raises:
        StorageError: ``check_bucket`` and the bucket is missing, forbidden or unreachable.
    """

    remote = True

    def __init__(self, client: Any, bucket: str, *, prefix: str = "", check_bucket: bool = True) -> None:
        self.client = client
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = validate_key(prefix, field="prefix") + "/" if prefix else ""
        if check_bucket:
            self.check_bucket()

    @classmethod
    def from_config(cls, config: StorageConfig, *, check_bucket: bool = True) -> S3BlobStore:
        """Build the client and the store from a :class:`StorageConfig` with a bucket."""
        if not config.bucket:
            raise ValueError("StorageConfig has no bucket")
        return cls(make_s3_client(config), config.bucket, prefix=config.prefix, check_bucket=check_bucket)

    def __repr__(self) -> str:
        return f"S3BlobStore(bucket={self.bucket!r}, prefix={self.prefix!r}, endpoint={self._endpoint()!r})"

    def _endpoint(self) -> str:
        return str(getattr(self.client.meta, "endpoint_url", "?"))

    @contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        """Translate boto/connection failures of ``op`` on ``key`` into StorageError."""
        try:
            yield
        except ClientError as e:
            code, status = _code(e)
            if code == "NoSuchBucket":
                raise StorageError(
                    f"S3 bucket {self.bucket!r} does not exist at {self._endpoint()}; create it or fix "
                    "VOXCAST_S3_BUCKET / VOXCAST_S3_ENDPOINT_URL"
                ) from e
            if code in _NOT_FOUND or status == 404:
                raise BlobNotFound(f"no object {key!r} in bucket {self.bucket!r}") from e
            raise StorageError(f"S3 {op} of {key!r} failed: {code or status}: {e}") from e
        except (BotoCoreError, OSError) as e:
            raise StorageError(f"S3 {op} of {key!r} at {self._endpoint()} failed: {e}") from e

    def check_bucket(self) -> None:
        """Raise a clear StorageError unless the bucket exists and we may use it."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as e:
            code, status = _code(e)
            if status == 404 or code in {"NoSuchBucket", "404", "NotFound"}:
                raise StorageError(
                    f"S3 bucket {self.bucket!r} does not exist at {self._endpoint()}; create it or fix "
                    "VOXCAST_S3_BUCKET / VOXCAST_S3_ENDPOINT_URL"
                ) from e
            raise StorageError(f"S3 bucket {self.bucket!r} is not usable: {code or status}: {e}") from e
        except (BotoCoreError, OSError) as e:
            raise StorageError(f"S3 endpoint {self._endpoint()} is unreachable: {e}") from e

    def put_bytes(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        metadata: Mapping[str, str] | None = None,
        if_none_match: bool = False,
    ) -> bool:
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.prefix + validate_key(key),
            "Body": data,
            "ContentType": content_type,
            "Metadata": check_metadata(metadata),
        }
        if if_none_match:
            args["IfNoneMatch"] = "*"
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                with self._errors("put", key):
                    self.client.put_object(**args)
                return True
            except StorageError as e:
                cause = e.__cause__
                code, status = _code(cause) if isinstance(cause, ClientError) else ("", 0)
                if if_none_match and (status == 412 or code == "PreconditionFailed"):
                    log.debug("create-once %s: already exists", key)
                    return False
                # 409 ConditionalRequestConflict: a concurrent conditional write is in flight; retry.
                if if_none_match and status == 409 and attempt < _CONFLICT_RETRIES:
                    continue
                raise
        raise AssertionError("unreachable")

    def open_stream(self, key: str) -> BlobStream:
        with self._errors("get", key):
            resp = self.client.get_object(Bucket=self.bucket, Key=self.prefix + validate_key(key))
        info = BlobInfo(
            key=key,
            size=int(resp.get("ContentLength", 0)),
            content_type=str(resp.get("ContentType") or "application/octet-stream"),
            metadata=dict(resp.get("Metadata") or {}),
        )
        return _S3Stream(info, resp["Body"], self)

    def head(self, key: str) -> BlobInfo | None:
        try:
            with self._errors("head", key):
                resp = self.client.head_object(Bucket=self.bucket, Key=self.prefix + validate_key(key))
        except BlobNotFound:
            return None
        return BlobInfo(
            key=key,
            size=int(resp.get("ContentLength", 0)),
            content_type=str(resp.get("ContentType") or "application/octet-stream"),
            metadata=dict(resp.get("Metadata") or {}),
        )

    def delete(self, key: str) -> None:
        try:
            with self._errors("delete", key):
                self.client.delete_object(Bucket=self.bucket, Key=self.prefix + validate_key(key))
        except BlobNotFound:
            return

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        with self._errors("list", prefix):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for obj in page.get("Contents", ()):
                    yield str(obj["Key"])[len(self.prefix) :]

    def presigned_url(self, key: str, expires_s: int = 3600) -> str | None:
        with self._errors("presign", key):
            url = self.client.generate_presigned_url(
                "get_object",
                Params={"Bucket": self.bucket, "Key": self.prefix + validate_key(key)},
                ExpiresIn=int(expires_s),
            )
        return str(url)

    def close(self) -> None:
        self.client.close()
