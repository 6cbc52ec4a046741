"""StorageConfig.from_env is a pure function of its mapping; open_store picks the backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from voxcast.errors import InvalidRequest, StorageError
from voxcast.storage import LocalBlobStore, StorageConfig, open_store


def test_defaults_are_local() -> None:
    cfg = StorageConfig.from_env({"XDG_CACHE_HOME": "/x/cache"})
    assert cfg.backend == "local"
    assert cfg.local_dir == "/x/cache/voxcast/store"
    assert cfg.path_style is False and cfg.local_fsync is True


def test_s3_settings() -> None:
    cfg = StorageConfig.from_env(
        {
            "VOXCAST_S3_BUCKET": "b",
            "VOXCAST_S3_ENDPOINT_URL": "http://127.0.0.1:9",
            "AWS_DEFAULT_REGION": "eu-west-1",
            "VOXCAST_S3_PREFIX": "/team/prod/",
            "AWS_ACCESS_KEY_ID": "AKIA",
            "AWS_SECRET_ACCESS_KEY": "secret",
        }
    )
    assert cfg.backend == "s3" and cfg.region == "eu-west-1" and cfg.prefix == "team/prod"
    assert cfg.path_style is True  # default on with a custom endpoint
    assert "secret" not in repr(cfg)
    assert (
        StorageConfig.from_env(
            {"VOXCAST_S3_ENDPOINT_URL": "http://h", "VOXCAST_S3_PATH_STYLE": "no"}
        ).path_style
        is False
    )


@pytest.mark.parametrize(
    "env",
    [
        {"VOXCAST_S3_PATH_STYLE": "maybe"},
        {"VOXCAST_S3_MAX_ATTEMPTS": "x"},
        {"VOXCAST_S3_READ_TIMEOUT_S": "-1"},
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=next(iter(env))):
        StorageConfig.from_env(env)


def test_bad_prefix_rejected() -> None:
    with pytest.raises(InvalidRequest, match="unsafe") as err:
        StorageConfig.from_env({"VOXCAST_S3_PREFIX": "a/../b"})
    assert err.value.field == "VOXCAST_S3_PREFIX"


def test_open_store_local(tmp_path: Path) -> None:
    store = open_store(StorageConfig.from_env({"VOXCAST_STORAGE_DIR": str(tmp_path / "s")}))
    assert isinstance(store, LocalBlobStore) and (tmp_path / "s").is_dir()


def test_open_store_unwritable_dir(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError):
        open_store(StorageConfig.from_env({"VOXCAST_STORAGE_DIR": str(tmp_path / "file" / "s")}))
