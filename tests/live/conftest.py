"""Fixtures for tests against the real servers: a nats-server (JetStream) and a valkey-server started from
the project's own install on free ports, one pair per test module, with a clean Redis database per test."""

from __future__ import annotations

import pytest

from shared.servers import start_servers


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with start_servers(tmp_path_factory.mktemp("servers")) as s:
        yield s


@pytest.fixture
def redis_url(servers):
    import redis

    r = redis.Redis.from_url(servers.redis_url)
    r.flushall()
    r.close()
    return servers.redis_url


@pytest.fixture
def nats_url(servers):
    return servers.nats_url
