"""The compose profile ``ha`` (docs/ha.md), as far as it can be checked without a Docker engine: with the HA
block of ``.env.example`` set, every CooRM container gets the three NATS servers and the three sentinels the
profile runs, and the streams' 3 replicas; and the profile's own files and commands, run with the real
binaries on this machine (hosts and ports replaced): three nats-servers on ``nats-cluster.conf`` and the
routes file its comment says how to write form one cluster whose JetStream keeps a stream at 3 replicas;
the Valkey replica and sentinel commands make a primary, a replica and a sentinel that sees both."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from coorm.shared import valkey
from coorm.shared.credentials import CredentialStore
from coorm.shared.endpoints import Role
from coorm.shared.servers import _wait_port, free_port, nats_binary, valkey_binary
from coorm.shared.settings import Settings
from tests.deploy.stackfiles import (
    ENV_EXAMPLE,
    ROOT,
    TEST_SECRETS,
    command,
    compose,
    env_example,
    environment,
    is_coorm,
)

NATS_DIR = ROOT / "deploy" / "nats"
HA_SERVICES = {"nats-2", "nats-3", "redis-replica-2", "redis-replica-3", "sentinel-1", "sentinel-2", "sentinel-3"}


def ha_env() -> dict[str, str]:
    """``.env.example`` with its HA block (the commented ``#   KEY=VALUE`` lines under the profile's header)
    set, and the secrets filled in."""
    text = ENV_EXAMPLE.read_text()
    block = text[text.index('# ==== profile "ha"'):]
    block = block[:block.index("\n\n")]
    values = dict(re.findall(r"^#\s+([A-Z_]+)=(\S+)$", block, re.M))
    assert values.get("COMPOSE_PROFILES") == "ha", values
    return {**env_example().values, **TEST_SECRETS, **values}


def test_the_profile_adds_the_cluster_and_nothing_else():
    services = compose()["services"]
    profiled = {name for name, s in services.items() if s.get("profiles")}
    assert profiled == HA_SERVICES
    assert all(services[n]["profiles"] == ["ha"] for n in profiled)
    assert not any(is_coorm(services[n]) for n in profiled)


def test_with_the_ha_block_every_coorm_container_reaches_the_cluster(monkeypatch, tmp_path):
    services = compose(ha_env())["services"]
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "none.json"))
    for k in list(os.environ):
        if k.startswith("COORM_") and k != "COORM_CONNECTION_FILE":
            monkeypatch.delenv(k)
    nats_hosts = {"nats", "nats-2", "nats-3"}
    for name, s in services.items():
        if not is_coorm(s):
            continue
        env = environment(s)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        settings = Settings()
        for k in env:
            monkeypatch.delenv(k)
        if command(s)[0] != "celery":
            urls = settings.nats_url.split(",")
            assert {u.removeprefix("nats://").split(":")[0] for u in urls} == nats_hosts, (name, urls)
            assert all(u.endswith(":4222") for u in urls)
        assert settings.stream_replicas == 3, name
        if command(s)[0] == "agent":
            continue  # (no Redis)
        target = valkey.parse(settings.redis_url)
        assert target is not None, (name, settings.redis_url)
        assert {h for h, _ in target.sentinels} == {"sentinel-1", "sentinel-2", "sentinel-3"} <= set(services)
        assert {p for _, p in target.sentinels} == {26379} and target.master == "coorm"
        assert target.password == TEST_SECRETS["COORM_REDIS_PASSWORD"]
    nats_cmd = command(services["nats"])
    assert nats_cmd[nats_cmd.index("--config") + 1] == "/etc/nats/nats-cluster.conf"
    for n in ("nats", "nats-2", "nats-3"):
        assert "/etc/nats/nats-cluster.conf" in [v.split(":")[1] for v in services[n]["volumes"] if isinstance(v, str)]
    names = {environment(services[n])["NATS_SERVER_NAME"] for n in ("nats", "nats-2", "nats-3")}
    assert len(names) == 3  # JetStream's peers are told apart by name
    for n in ("redis-replica-2", "redis-replica-3"):
        cmd = command(services[n])
        assert cmd[cmd.index("--replicaof") + 1:cmd.index("--replicaof") + 3] == ["redis", "6379"], n
        assert cmd[cmd.index("--masterauth") + 1] == TEST_SECRETS["COORM_REDIS_PASSWORD"], n


# ================================================================================================
# the profile's files and commands, with the real binaries
# ================================================================================================
def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.loads(r.read())


def test_three_servers_on_nats_cluster_conf_form_one_jetstream_cluster(tmp_path):
    """deploy/nats/nats-cluster.conf (and nats.conf it includes), the routes file written as its comment
    says, a credential store's users: three nats-servers, each in its own folder with the compose hosts and
    ports replaced by local ones, route to each other, and a stream gets 3 replicas."""
    store = CredentialStore(tmp_path / "store").init(users=())
    secret_file = tmp_path / "nats-routes.conf"
    sed = subprocess.run(["sh", "-c", f'sed "s/ROUTE_PASSWORD/$(openssl rand -hex 24 2>/dev/null || echo x$$)/" '
                                      f'{NATS_DIR / "nats-routes.conf.example"} > {secret_file}'], check=True)
    assert sed.returncode == 0 and "ROUTE_PASSWORD" not in secret_file.read_text()
    client, route, monitor = ([free_port() for _ in range(3)] for _ in range(3))
    procs = []
    try:
        for i in range(3):
            d = tmp_path / f"nats-{i}"
            (d / "credentials").mkdir(parents=True)
            shutil.copy(NATS_DIR / "nats-cluster.conf", d)
            conf = (NATS_DIR / "nats.conf").read_text()
            conf = conf.replace("port: 4222", f"listen: 127.0.0.1:{client[i]}")
            conf = conf.replace("http_port: 8222", f"http: 127.0.0.1:{monitor[i]}")
            conf = conf.replace("/data/jetstream", str(d / "jetstream"))
            (d / "nats.conf").write_text(conf)
            shutil.copy(store.nats_auth_path, d / "credentials" / store.nats_auth_path.name)
            routes = secret_file.read_text().replace("port: 6222", f"listen: 127.0.0.1:{route[i]}")
            for host, port in zip(("nats", "nats-2", "nats-3"), route, strict=True):
                routes = routes.replace(f"@{host}:6222", f"@127.0.0.1:{port}")
            (d / "credentials" / "nats-routes.conf").write_text(routes)
            env = {**os.environ, "NATS_SERVER_NAME": f"coorm-nats-{i + 1}"}
            procs.append(subprocess.Popen([nats_binary(), "-c", str(d / "nats-cluster.conf")], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
        for i, p in enumerate(procs):
            _wait_port(client[i], p, f"nats-{i}")
        deadline = time.monotonic() + 20
        while True:
            routez = [_get(f"http://127.0.0.1:{m}/routez")["num_routes"] for m in monitor]
            if all(n >= 2 for n in routez) or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # routes forming: the monitoring endpoint is all there is to ask
        assert all(n >= 2 for n in routez), routez
        assert {_get(f"http://127.0.0.1:{m}/varz")["server_name"] for m in monitor} == {
            "coorm-nats-1", "coorm-nats-2", "coorm-nats-3"}

        async def replicated() -> int:
            import nats
            from nats.js.api import StreamConfig

            from coorm.shared import subjects

            me = store.role(Role.SERVICE)
            nc = await nats.connect([f"nats://127.0.0.1:{p}" for p in client], nkeys_seed_str=me.seed,
                                    inbox_prefix=me.inbox_prefix)
            try:
                js = nc.jetstream()
                for _ in range(100):
                    try:
                        info = await js.add_stream(StreamConfig(name="HA_CHECK", subjects=[subjects.DECISIONS],
                                                                num_replicas=3))
                        return info.config.num_replicas
                    except Exception:  # noqa: BLE001 - JetStream's meta leader not elected yet
                        await asyncio.sleep(0.2)
                raise AssertionError("no stream with 3 replicas")
            finally:
                await nc.close()

        assert asyncio.run(replicated()) == 3
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


def _shell_script(service: dict) -> str:
    cmd = command(service)
    assert cmd[:2] == ["sh", "-c"], cmd
    return cmd[2]


def test_the_replica_and_sentinel_commands_make_a_watched_group(tmp_path):
    """The compose commands of redis, redis-replica-2 and sentinel-1 (their folders, hosts and ports
    replaced), run with the local valkey-server: the replica follows the primary with the services'
    credentials, and the sentinel, on the configuration its script writes, sees the primary and the
    replica and wants the password itself."""
    password = "pw-" + "y" * 20
    services = compose({**ha_env(), "COORM_REDIS_PASSWORD": password})["services"]
    procs = []

    def valkey_cmd(name: str, port: int, folder: Path, primary: int | None = None) -> list[str]:
        args = command(services[name])[1:]
        i = args.index("--dir")
        args[i + 1] = str(folder)
        if "--replicaof" in args:
            j = args.index("--replicaof")
            args[j + 1:j + 3] = ["127.0.0.1", str(primary)]
        return [valkey_binary(), *args, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]

    try:
        pport, rport, sport = free_port(), free_port(), free_port()
        for name, port, primary in (("redis", pport, None), ("redis-replica-2", rport, pport)):
            folder = tmp_path / name
            folder.mkdir()
            p = subprocess.Popen(valkey_cmd(name, port, folder, primary), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
            procs.append(p)
            _wait_port(port, p, name)
        from coorm.shared.servers import _wait_replicas

        _wait_replicas(pport, password, 1)
        script = _shell_script(services["sentinel-1"])
        data = tmp_path / "sentinel"
        data.mkdir()
        script = (script.replace("/data", str(data)).replace("'port 26379'", f"'port {sport}'")
                  .replace("coorm redis 6379", f"coorm 127.0.0.1 {pport}")
                  .replace("exec valkey-server", f"exec {valkey_binary()}"))
        sentinel = subprocess.Popen(["sh", "-c", script], env={**os.environ, "COORM_REDIS_PASSWORD": password},
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(sentinel)
        _wait_port(sport, sentinel, "sentinel")
        anonymous = redis.Redis(port=sport)
        try:
            with pytest.raises(redis.exceptions.AuthenticationError):
                anonymous.ping()
        finally:
            anonymous.close()
        s = redis.Redis(port=sport, username="coorm", password=password, decode_responses=True)
        try:
            deadline = time.monotonic() + 20
            while True:
                master = s.execute_command("SENTINEL", "MASTER", "coorm")
                info = dict(zip(master[::2], master[1::2], strict=False)) if isinstance(master, list) else master
                if int(info.get("num-slaves", 0)) >= 1 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)  # the sentinel discovers the replica through the primary: nothing to wait on
            assert int(info["port"]) == pport and int(info["num-slaves"]) == 1, info
            assert "master_link_down" not in info.get("flags", ""), info
        finally:
            s.close()
        client = valkey.sync_client(f"redis+sentinel://coorm:{password}@127.0.0.1:{sport}/0?master=coorm",
                                    decode_responses=True)
        try:
            assert client.set("k", "v") and client.get("k") == "v"
        finally:
            client.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
