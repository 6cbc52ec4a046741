"""Storage configuration from environment variables (:func:`~voxcast.storage.factory.open_store` opens it).

With ``VOXCAST_S3_BUCKET`` set, objects go to S3 (or any S3-compatible endpoint); without it, to a
local directory. Credentials follow boto3's standard chain unless given explicitly: the ``AWS_*``
variables of the mapping passed to :meth:`StorageConfig.from_env` are forwarded when present, else
boto3 looks at its usual places (environment, ``~/.aws``, instance/container roles).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from voxcast.envvars import env_bool, env_float, env_int, env_str
from voxcast.storage.keys import validate_key

__all__ = ["StorageConfig"]


@dataclass(frozen=True)
class StorageConfig:
    """Where voices and rendered audio are stored. Build with :meth:`from_env`.

    Attributes:
        bucket: S3 bucket (``VOXCAST_S3_BUCKET``); None = use ``local_dir``.
        endpoint_url: S3-compatible endpoint (``VOXCAST_S3_ENDPOINT_URL``); None = AWS.
        region: region (``VOXCAST_S3_REGION``, else ``AWS_REGION``/``AWS_DEFAULT_REGION``).
        prefix: key prefix inside the bucket (``VOXCAST_S3_PREFIX``), e.g. ``voxcast/prod``.
        path_style: path-style addressing (``VOXCAST_S3_PATH_STYLE``); default: on when an
            endpoint URL is set (MinIO & co.), else boto3's automatic choice.
        max_attempts: total attempts per S3 call incl. retries with backoff (``VOXCAST_S3_MAX_ATTEMPTS``, 4).
        connect_timeout_s / read_timeout_s: socket timeouts (``VOXCAST_S3_CONNECT_TIMEOUT_S`` 2,
            ``VOXCAST_S3_READ_TIMEOUT_S`` 10).
        max_pool_connections: HTTP connection pool size (``VOXCAST_S3_MAX_POOL``, 32).
        access_key_id / secret_access_key / session_token / profile: explicit credentials
            (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``);
            None = boto3's chain.
        local_dir: directory of the local store (``VOXCAST_STORAGE_DIR``; default
            ``$XDG_CACHE_HOME/voxcast/store`` or ``~/.cache/voxcast/store``).
        local_fsync: fsync local writes before publishing them (``VOXCAST_STORAGE_FSYNC``, on).
        local_max_render_gb: the local store's cap on rendered audio, oldest deleted first
            (``VOXCAST_STORAGE_MAX_RENDER_GB``, 10; 0: none). Voices and libraries are never deleted.
        voice_cache_mb: in-memory LRU budget for voice prompts (``VOXCAST_VOICE_CACHE_MB``, 256).
        voice_recheck_s: a voice prompt held in memory longer than this is checked in the store
            (one existence check) before its next use, so a voice deleted through any worker stops
            speaking everywhere within this time (``VOXCAST_VOICE_RECHECK_S``, 30; 0: every use).
    """

    bucket: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    prefix: str = ""
    path_style: bool = False
    max_attempts: int = 4
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 10.0
    max_pool_connections: int = 32
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    profile: str | None = None
    local_dir: str = "~/.cache/voxcast/store"
    local_fsync: bool = True
    local_max_render_gb: float = 10.0
    voice_cache_mb: float = 256.0
    voice_recheck_s: float = 30.0

    def __post_init__(self) -> None:
        prefix = self.prefix.strip("/")
        if prefix:
            validate_key(prefix, field="VOXCAST_S3_PREFIX")
        object.__setattr__(self, "prefix", prefix)

    @property
    def backend(self) -> str:
        """``"s3"`` or ``"local"``."""
        return "s3" if self.bucket else "local"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StorageConfig:
        """Read the configuration from an environment mapping (pure: pass ``os.environ`` or a dict).

        Raises:
            ValueError: a malformed value, naming its variable.
        """
        endpoint = env_str(env, "VOXCAST_S3_ENDPOINT_URL")
        cache_home = env_str(env, "XDG_CACHE_HOME") or "~/.cache"
        return cls(
            bucket=env_str(env, "VOXCAST_S3_BUCKET"),
            endpoint_url=endpoint,
            region=env_str(env, "VOXCAST_S3_REGION")
            or env_str(env, "AWS_REGION")
            or env_str(env, "AWS_DEFAULT_REGION"),
            prefix=env.get("VOXCAST_S3_PREFIX", ""),
            path_style=env_bool(env, "VOXCAST_S3_PATH_STYLE", endpoint is not None),
            max_attempts=env_int(env, "VOXCAST_S3_MAX_ATTEMPTS", 4, positive=True),
            connect_timeout_s=env_float(env, "VOXCAST_S3_CONNECT_TIMEOUT_S", 2.0, positive=True),
            read_timeout_s=env_float(env, "VOXCAST_S3_READ_TIMEOUT_S", 10.0, positive=True),
            max_pool_connections=env_int(env, "VOXCAST_S3_MAX_POOL", 32, positive=True),
            access_key_id=env_str(env, "AWS_ACCESS_KEY_ID"),
            secret_access_key=env_str(env, "AWS_SECRET_ACCESS_KEY"),
            session_token=env_str(env, "AWS_SESSION_TOKEN"),
            profile=env_str(env, "AWS_PROFILE"),
            local_dir=env_str(env, "VOXCAST_STORAGE_DIR") or f"{cache_home}/voxcast/store",
            local_fsync=env_bool(env, "VOXCAST_STORAGE_FSYNC", True),
            local_max_render_gb=env_float(env, "VOXCAST_STORAGE_MAX_RENDER_GB", 10.0, lo=0.0),
            voice_cache_mb=env_float(env, "VOXCAST_VOICE_CACHE_MB", 256.0, positive=True),
            voice_recheck_s=env_float(env, "VOXCAST_VOICE_RECHECK_S", 30.0, lo=0.0),
        )
