"""The store factory: the :class:`~voxcast.storage.base.BlobStore` a :class:`StorageConfig` describes.

Apart from :mod:`voxcast.storage.config` so that the configuration does not depend on the stores it
configures (:mod:`voxcast.storage.s3` reads the configuration).
"""

from __future__ import annotations

from voxcast.storage.base import BlobStore
from voxcast.storage.config import StorageConfig
from voxcast.storage.local import LocalBlobStore

__all__ = ["open_store"]


def open_store(config: StorageConfig, *, check_bucket: bool = True) -> BlobStore:
    """The store ``config`` describes: S3 when a bucket is set, else the local directory.

    Args:
        config: storage configuration.
        check_bucket: with S3, verify at once that the bucket exists and is reachable.

    Raises:
        StorageError: the bucket is missing or unreachable, or the directory cannot be created.
    """
    if config.bucket:
        from voxcast.storage.s3 import S3BlobStore  # boto3 is imported only when S3 is configured

        return S3BlobStore.from_config(config, check_bucket=check_bucket)
    cap = int(config.local_max_render_gb * 1e9) or None
    return LocalBlobStore(config.local_dir, fsync=config.local_fsync, max_render_bytes=cap)
