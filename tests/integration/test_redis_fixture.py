"""The redis fixtures themselves: a restarted server comes back empty on its port; every test gets
a running, flushed server (checked by asking for the fixture after spoiling the server)."""

from __future__ import annotations

from typing import Any

import redis


def test_restart_keeps_the_port_and_drops_the_data(redis_server: Any, redis_client: Any) -> None:
    redis_client.set(b"k", b"v")
    assert redis_client.get(b"k") == b"v"
    redis_server.restart()
    redis_client.ping()  # same port, same client
    assert redis_client.get(b"k") is None


def test_redis_url_flushes_what_was_left(redis_server: Any, request: Any) -> None:
    redis_server.start()
    raw = redis.Redis.from_url(redis_server.url)
    raw.set(b"left", b"over")
    assert raw.dbsize() == 1
    url = request.getfixturevalue("redis_url")
    assert redis.Redis.from_url(url).dbsize() == 0


def test_redis_url_restarts_a_stopped_server(redis_server: Any, request: Any) -> None:
    redis_server.stop()
    url = request.getfixturevalue("redis_url")
    assert redis.Redis.from_url(url).ping()
