"""The redis_server fixture itself: restart on the same port, flush between tests."""


def test_a(redis_server, redis_client):
    redis_client.set(b"k", b"v")
    assert redis_client.get(b"k") == b"v"
    redis_server.restart()
    redis_client.ping()
    assert redis_client.get(b"k") is None
    redis_server.stop()


def test_b(redis_client):
    assert redis_client.dbsize() == 0
