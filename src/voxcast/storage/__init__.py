"""Object storage for voice prompts and rendered audio: S3 (boto3) or a local directory.

Public surface: :class:`BlobStore` (the interface), :class:`BlobInfo`, :class:`BlobNotFound`,
:class:`LocalBlobStore`, :class:`StorageConfig` + :func:`open_store`, and the key functions in
:mod:`voxcast.storage.keys`. ``S3BlobStore`` lives in :mod:`voxcast.storage.s3` (importing it imports
boto3); :func:`open_store` imports it only when a bucket is configured.
"""

from voxcast.storage.base import BlobInfo, BlobNotFound, BlobStore, BlobStream
from voxcast.storage.config import StorageConfig
from voxcast.storage.factory import open_store
from voxcast.storage.local import LocalBlobStore

__all__ = [
    "BlobInfo",
    "BlobNotFound",
    "BlobStore",
    "BlobStream",
    "LocalBlobStore",
    "StorageConfig",
    "open_store",
]
