"""Fixtures for tests against the real servers: a nats-server (JetStream) and a Valkey, one pair per test
module, with a clean Redis database per test: containers of docker-compose's images where a Docker engine
answers, else started from the project's own install on free ports (:mod:`tests.servers`)."""

from __future__ import annotations

import pytest

from tests.servers import servers_for_tests


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The servers, and their credential store where every Settings of the module finds its identity
    (``COORM_CREDENTIALS_DIR``): the services', the agents', and this user's."""
    with servers_for_tests(tmp_path_factory.mktemp("servers")) as s, pytest.MonkeyPatch.context() as mp:
        mp.setenv("COORM_CREDENTIALS_DIR", str(s.credentials))
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
