"""ServiceConfig from the environment: bounds that S3 or the store guard impose."""

from __future__ import annotations

import pytest

from voxcast.service import MAX_URL_EXPIRES_S, ServiceConfig


def test_presigned_url_lifetime_is_bounded_by_what_s3_allows() -> None:
    assert ServiceConfig.from_env({"VOXCAST_URL_EXPIRES_S": str(MAX_URL_EXPIRES_S)}).url_expires_s == 604800
    for bad in ("604801", "0", "-5"):
        with pytest.raises(ValueError, match="VOXCAST_URL_EXPIRES_S"):
            ServiceConfig.from_env({"VOXCAST_URL_EXPIRES_S": bad})
    with pytest.raises(ValueError, match="7 days"):
        ServiceConfig(url_expires_s=10**9)


def test_store_guard_settings_come_from_the_environment() -> None:
    cfg = ServiceConfig.from_env(
        {
            "VOXCAST_CACHE_LOOKUP_MS": "40",
            "VOXCAST_STORE_WRITE_S": "2.5",
            "VOXCAST_STORE_BREAKER_FAILURES": "5",
            "VOXCAST_STORE_BREAKER_COOLDOWN_S": "0",
        }
    ).store_guard
    assert (cfg.lookup_s, cfg.write_s, cfg.failures, cfg.cooldown_s) == (0.04, 2.5, 5, 0.0)
    with pytest.raises(ValueError, match="VOXCAST_CACHE_LOOKUP_MS"):
        ServiceConfig.from_env({"VOXCAST_CACHE_LOOKUP_MS": "0"})
