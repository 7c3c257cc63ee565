"""The servers the live tests talk to. Where a Docker engine answers, containers of the very images
docker-compose runs (started with testcontainers); elsewhere -- these machines have none -- nats-server and
valkey-server from the project's own install (:mod:`coorm.shared.servers`).

``COORM_TEST_SERVERS`` chooses: ``auto`` (the default: containers when an engine answers), ``containers``
(fail when none does) or ``local``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.stackfiles import interpolate, raw_compose

CHOICES = ("auto", "containers", "local")


class NoDockerEngine(RuntimeError):
    pass


def docker_engine() -> str | None:
    """Why no Docker engine can be used (None when one answers a ping)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
    except Exception as e:  # noqa: BLE001 - no socket, no permission, a bad DOCKER_HOST: all mean "none"
        return f"{type(e).__name__}: {e}"
    try:
        client.ping()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    finally:
        client.close()
    return None


def choose(setting: str | None = None) -> str:
    """``containers`` or ``local``, from ``COORM_TEST_SERVERS`` (or ``setting``) and the engine's answer."""
    setting = (setting if setting is not None else os.environ.get("COORM_TEST_SERVERS", "auto")).lower()
    if setting not in CHOICES:
        raise ValueError(f"COORM_TEST_SERVERS={setting!r}: expected one of {', '.join(CHOICES)}")
    if setting == "local":
        return "local"
    why_not = docker_engine()
    if why_not is None:
        return "containers"
    if setting == "containers":
        raise NoDockerEngine(f"COORM_TEST_SERVERS=containers but no Docker engine answers ({why_not})")
    return "local"


def compose_image(service: str) -> str:
    """The image docker-compose runs for ``service`` (``NATS_IMAGE`` and the like override it there too)."""
    return interpolate(raw_compose()["services"][service]["image"], dict(os.environ))


@dataclass(frozen=True)
class ContainerServers:
    """Where the containers' ports are mapped (read once: each lookup asks the Docker engine)."""

    nats_url: str
    redis_url: str
    credentials: Path


@contextmanager
def container_servers(workdir: Path) -> Iterator[ContainerServers]:
    """docker-compose's NATS (JetStream on) and Valkey, each wanting the credentials of a store made here:
    the configuration files of :mod:`coorm.shared.servers`, mounted."""
    import getpass

    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    from coorm.shared.credentials import CredentialStore
    from coorm.shared.servers import nats_config, valkey_config

    workdir.mkdir(parents=True, exist_ok=True)
    store = CredentialStore(workdir / "credentials").init(users=(getpass.getuser(),))
    nats_conf, valkey_conf = nats_config(workdir, store), valkey_config(workdir, store)
    for path in (store.root, store.nats_auth_path, valkey_conf):  # (the containers' users read them)
        path.chmod(0o755 if path.is_dir() else 0o644)
    nats = (DockerContainer(compose_image("nats")).with_volume_mapping(str(workdir), "/etc/coorm", "ro")
            .with_command(f"-js -c /etc/coorm/{nats_conf.name}").with_exposed_ports(4222)
            .waiting_for(LogMessageWaitStrategy("Server is ready")))
    redis = (DockerContainer(compose_image("redis")).with_volume_mapping(str(workdir), "/etc/coorm", "ro")
             .with_command(f"valkey-server /etc/coorm/{valkey_conf.name} --appendonly yes")
             .with_exposed_ports(6379).waiting_for(LogMessageWaitStrategy("Ready to accept connections")))
    started = []
    try:
        for c in (nats, redis):
            c.start()
            started.append(c)
        yield ContainerServers(
            nats_url=f"nats://{nats.get_container_host_ip()}:{nats.get_exposed_port(4222)}",
            redis_url=store.redis_url(redis.get_container_host_ip(), int(redis.get_exposed_port(6379))),
            credentials=store.root)
    finally:
        for c in started:
            c.stop()


@contextmanager
def servers_for_tests(workdir: Path, setting: str | None = None) -> Iterator[object]:
    """Whichever servers :func:`choose` picks, stopped on exit; both kinds have ``nats_url``, ``redis_url`` and
    ``credentials`` (their credential store)."""
    if choose(setting) == "containers":
        with container_servers(workdir) as s:
            yield s
    else:
        from coorm.shared.servers import start_servers

        with start_servers(workdir) as s:
            yield s
