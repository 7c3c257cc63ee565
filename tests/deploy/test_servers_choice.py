"""Which servers the live tests get (tests/servers.py): containers of docker-compose's images when a Docker
engine answers, the local binaries otherwise, and a clear refusal when containers are demanded and no engine
answers."""

from __future__ import annotations

import pytest

from tests.deploy.stackfiles import raw_compose
from tests.servers import NoDockerEngine, choose, compose_image, docker_engine, servers_for_tests

NO_ENGINE = "unix:///nonexistent/docker.sock"


def test_the_images_are_docker_composes_own(monkeypatch):
    monkeypatch.delenv("NATS_IMAGE", raising=False)
    monkeypatch.delenv("REDIS_IMAGE", raising=False)
    raw = raw_compose()["services"]
    for service, image in (("nats", compose_image("nats")), ("redis", compose_image("redis"))):
        assert raw[service]["image"].endswith(f":-{image}}}")  # the default of ${X_IMAGE:-default}
    monkeypatch.setenv("NATS_IMAGE", "registry.example.org/nats:2.11")
    assert compose_image("nats") == "registry.example.org/nats:2.11"


def test_without_an_engine_auto_picks_the_local_binaries(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    assert docker_engine() is not None
    assert choose("auto") == "local"
    assert choose("local") == "local"


def test_containers_demanded_without_an_engine_is_refused_readably(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    with pytest.raises(NoDockerEngine, match="no Docker engine answers"):
        choose("containers")
    with pytest.raises(ValueError, match="expected one of auto, containers, local"):
        choose("podman")


def test_the_local_servers_answer(tmp_path, monkeypatch):
    import redis

    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    with servers_for_tests(tmp_path) as s:
        assert s.nats_url.startswith("nats://") and redis.Redis.from_url(s.redis_url).ping()


@pytest.mark.skipif(docker_engine() is not None, reason="no Docker engine answers here")
def test_the_container_servers_answer(tmp_path):
    import asyncio

    import nats
    import redis

    from coorm.shared.credentials import CredentialStore
    from coorm.shared.endpoints import Role

    with servers_for_tests(tmp_path, "containers") as s:
        r = redis.Redis.from_url(s.redis_url)
        assert r.ping()
        r.close()

        async def jetstream() -> None:
            me = CredentialStore(s.credentials).role(Role.SERVICE)
            nc = await nats.connect(s.nats_url, nkeys_seed_str=me.seed, inbox_prefix=me.inbox_prefix)
            try:
                await nc.jetstream().account_info()  # JetStream is on, as the services need
            finally:
                await nc.close()

        asyncio.run(jetstream())
