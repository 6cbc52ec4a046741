"""QueueConfig.from_env: defaults, parsing, validation (pure, no Redis)."""

from __future__ import annotations

import pytest

from voxcast.serving.rq.config import QueueConfig


def test_defaults_recover_a_killed_workers_job_within_90_s() -> None:
    cfg = QueueConfig.from_env({})
    assert cfg.redis_url == "redis://127.0.0.1:6379/0"
    assert cfg.queues == ("voxcast",)
    assert cfg.worst_case_recovery_s <= 90
    assert cfg.failure_ttl_s < 365 * 24 * 3600


def test_env_parsing() -> None:
    cfg = QueueConfig.from_env(
        {
            "VOXCAST_REDIS_URL": "redis://h:1/2",
            "VOXCAST_QUEUES": " hi, lo ,,",
            "VOXCAST_STREAM_MAXLEN": "50",
            "VOXCAST_STREAM_TTL_S": "60",
            "VOXCAST_JOB_TIMEOUT_S": "9",
            "VOXCAST_JOB_HEARTBEAT_TTL_S": "5",
            "VOXCAST_JOB_HEARTBEAT_INTERVAL_S": "0.5",
            "VOXCAST_JOB_RETRIES": "2",
        }
    )
    assert cfg.redis_url == "redis://h:1/2" and cfg.queues == ("hi", "lo")
    assert cfg.stream.maxlen == 50 and cfg.stream.ttl_s == 60
    assert cfg.synth_timeout_s == 9 and cfg.heartbeat_ttl_s == 5 and cfg.retries == 2
    assert cfg.with_overrides(queues=("x",), retries=None).queues == ("x",)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("VOXCAST_STREAM_MAXLEN", "many"),
        ("VOXCAST_WORKER_TTL_S", "10"),
        ("VOXCAST_JOB_HEARTBEAT_TTL_S", "4"),
        ("VOXCAST_JOB_TIMEOUT_S", "0"),
        ("VOXCAST_JOB_RETRIES", "-1"),
    ],
)
def test_bad_values_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=r"VOXCAST_|must"):
        QueueConfig.from_env({name: value})
