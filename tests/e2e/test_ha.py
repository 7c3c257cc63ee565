"""Replicated servers, real ones: ``coorm up --ha`` (a 3-server NATS cluster, the streams at 3 replicas, a
Valkey primary with two replicas under three sentinels) keeps a live mixed workload going while the NATS
server that leads the decision stream is SIGKILLed, then the Valkey primary -- neither restarted: nothing
accepted is lost, no application hangs or goes untold, no node is held twice, no exit code lies, and a job
runs again within a bound after each kill (``benchmarks/bench_ha.py`` at a reduced size). And the pieces it
rests on: a write under Sentinel returns only once a replica has it; the settings' NATS list and sentinels;
the coorm script's light path trying each server of a list in turn."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coorm.shared import keys, valkey
from coorm.shared.credentials import CredentialStore
from coorm.shared.servers import _wait_port, free_port, start_servers, valkey_binary
from coorm.shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_ha", ROOT / "benchmarks" / "bench_ha.py")
assert _spec is not None and _spec.loader is not None
bench_ha = importlib.util.module_from_spec(_spec)
sys.modules["bench_ha"] = bench_ha
_spec.loader.exec_module(bench_ha)


@pytest.mark.slow
def test_killing_a_nats_server_and_the_valkey_primary_loses_nothing(tmp_path):
    r = asyncio.run(bench_ha.run({"c0": 8, "c1": 8}, apps=30, seed=5, workdir=tmp_path / "work", pause=4.0))
    print("\n" + bench_ha.report(r))
    assert r["apps"] == 32 and r["samples"] > 20
    assert (r["lost"], r["hung"], r["untold"], r["wrong"], r["double_bookings"]) == ([], [], [], [], [])
    assert set(r["recovery"]) == set(bench_ha.VICTIMS), r
    assert all(t < 30 for t in r["recovery"].values()), r["recovery"]
    # the sentinels promoted a replica: the primary killed is not the primary now
    assert r["failover"][bench_ha.PRIMARY] < 30, r["failover"]


# ================================================================================================
# under Sentinel, a write returns once a replica has it
# ================================================================================================
def _valkey(workdir: Path, store: CredentialStore, primary: int | None) -> tuple[subprocess.Popen, int]:
    from coorm.shared.credentials import write_secret
    from coorm.shared.servers import valkey_member_config

    port = free_port()
    workdir.mkdir(parents=True)
    conf = write_secret(workdir / "valkey.conf", valkey_member_config(workdir, store, primary))
    proc = subprocess.Popen([valkey_binary(), str(conf), "--port", str(port), "--bind", "127.0.0.1", "--dir",
                             str(workdir), "--save", ""], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    _wait_port(port, proc, "valkey-server")
    return proc, port


def test_a_write_returns_once_a_replica_has_it_and_fails_when_none_does(tmp_path):
    """A primary and its replica as ``coorm up --ha`` configures them: a write through the replicated client
    is on the replica when it returns; with the replica stopped (SIGSTOP, by pid), the primary takes the write
    but no replica confirms it, and the client says so (NotReplicated) instead of answering as if it were
    safe; a read does not wait."""
    import redis

    store = CredentialStore(tmp_path / "credentials").init(users=())
    password = store.valkey_password()
    procs = []
    try:
        primary, pport = _valkey(tmp_path / "p", store, None)
        procs.append(primary)
        replica, rport = _valkey(tmp_path / "r", store, pport)
        procs.append(replica)
        from coorm.shared.servers import _wait_replicas

        _wait_replicas(pport, password, 1)

        async def scenario() -> None:
            client = valkey.ReplicatedRedis(port=pport, username="coorm", password=password, decode_responses=True,
                                            socket_timeout=valkey.SOCKET_TIMEOUT)
            reader = redis.Redis(port=rport, username="coorm", password=password, decode_responses=True)
            try:
                for i in range(20):
                    await client.set(f"k{i}", str(i))
                    assert reader.get(f"k{i}") == str(i)  # on the replica as soon as the write returned
                pipe = client.pipeline(transaction=True)
                pipe.hset("h", "a", "1").incr("n")
                assert await pipe.execute() == [1, 1]
                assert reader.hget("h", "a") == "1" and reader.get("n") == "1"
                os.kill(replica.pid, signal.SIGSTOP)
                try:
                    t0 = time.monotonic()
                    assert await client.get("k1") == "1"  # a read: no wait
                    assert time.monotonic() - t0 < valkey.WAIT_MS / 1000
                    with pytest.raises(valkey.NotReplicated):
                        await client.set("lost?", "1")
                    with pytest.raises(valkey.NotReplicated):
                        await client.eval("return redis.call('set', KEYS[1], '1')", 1, "scripted")
                    # the lease is liveness, not state: its writes do not wait (a renewal must not lapse)
                    t0 = time.monotonic()
                    assert await client.set(keys.POLICY_LEASE, "me", px=3000)
                    assert await client.eval("return redis.call('pexpire', KEYS[1], ARGV[1])", 1,
                                             keys.POLICY_LEASE, 3000) == 1
                    assert time.monotonic() - t0 < valkey.WAIT_MS / 1000
                finally:
                    os.kill(replica.pid, signal.SIGCONT)
                await client.set("again", "1")
                assert reader.get("again") == "1"
            finally:
                await client.aclose()
                reader.close()

        asyncio.run(scenario())
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)


# ================================================================================================
# settings
# ================================================================================================
def test_sentinels_in_the_settings_become_the_sentinel_url(monkeypatch, tmp_path):
    monkeypatch.setenv("COORM_CONNECTION_FILE", str(tmp_path / "none.json"))
    monkeypatch.setenv("COORM_REDIS_URL", "redis://coorm:p%40ss@ignored:6379/2")
    monkeypatch.setenv("COORM_REDIS_SENTINEL", "s1:26379, s2:26380,s3:26381")
    monkeypatch.setenv("COORM_REDIS_MASTER", "prod")
    url = Settings().redis_url
    assert url == "redis+sentinel://coorm:p%40ss@s1:26379,s2:26380,s3:26381/2?master=prod"
    t = valkey.parse(url)
    assert t == valkey.Target((("s1", 26379), ("s2", 26380), ("s3", 26381)), "prod", "coorm", "p@ss", 2)
    assert "p@ss" not in valkey.describe(url) and "p%40ss" not in valkey.describe(url)
    assert Settings().redis_url == url  # (read again: not wrapped twice)
    monkeypatch.setenv("COORM_REDIS_SENTINEL", "")  # compose's empty default: one server
    assert Settings().redis_url == "redis://coorm:p%40ss@ignored:6379/2"
    monkeypatch.setenv("COORM_REDIS_SENTINEL", "s1")
    with pytest.raises(ValueError, match="host:port"):
        Settings()


def test_celery_gets_kombu_s_sentinel_urls():
    url = valkey.sentinel_url("redis://coorm:pw@x:6379/0", "a:1,b:2", "coorm")
    conf = valkey.celery_config(url)
    assert conf["broker_url"] == "sentinel://coorm:pw@a:1/0;sentinel://coorm:pw@b:2/0" == conf["result_backend"]
    assert conf["broker_transport_options"]["master_name"] == "coorm"
    assert valkey.celery_config("redis://x:6379/0") == {"broker_url": "redis://x:6379/0",
                                                         "result_backend": "redis://x:6379/0"}


# ================================================================================================
# the light path: each server of a list in turn
# ================================================================================================
FAST = [sys.executable, "-m", "coorm.cli.fast"]


def _fast(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("COORM_")},
            "COORM_CONNECTION_FILE": str(tmp_path / "connection.json"), **env}
    return subprocess.run([*FAST, *args], env=full, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_the_light_path_tries_each_server_of_a_list(tmp_path):
    """``coorm queue`` on the light path with a list whose first server is dead reaches the second: it is
    let in there (the store's identity), and NATS answers but no batch service does -- not "cannot reach"; with
    every server dead it gives up with exit 3, naming the list."""
    dead = f"nats://127.0.0.1:{free_port()}"
    with start_servers(tmp_path / "servers") as s:
        env = {"COORM_NATS_URL": f"{dead},{s.nats_url}", "COORM_CREDENTIALS_DIR": str(s.credentials),
               "COORM_CONNECT_TIMEOUT": "3"}
        run = _fast(["queue"], env, tmp_path)
        assert "answers but the batch service does not" in run.stderr, (run.returncode, run.stderr)
        assert "cannot reach" not in run.stderr, run.stderr
    dead2 = f"nats://127.0.0.1:{free_port()}"
    run = _fast(["queue"], {"COORM_NATS_URL": f"{dead},{dead2}", "COORM_CONNECT_TIMEOUT": "2"}, tmp_path)
    assert run.returncode == 3, (run.returncode, run.stderr)
    assert f"{dead},{dead2}" in run.stderr and "cannot reach" in run.stderr, run.stderr


# ================================================================================================
# coorm up --ha: a user added is let in by every NATS server
# ================================================================================================
def test_a_user_added_is_let_in_by_every_server_of_the_cluster(tmp_path):
    """``coorm user add`` rewrites the store's users and signals the server of the store's pid file only;
    ``coorm up --ha``'s supervision has the other two read them as well: before its next look a new user is
    refused by them, after it every server lets them in."""
    import nats as nats_client

    from coorm.cli.up import Up

    up = Up({"c0": 1}, tmp_path / "work", write_connection=False, accounting=False, ha=True)
    try:
        up.start(120)
        store = CredentialStore(up.servers.credentials)
        bob = store.add_user("bob")

        async def admitted(url: str) -> bool:
            async def quiet(e: Exception) -> None:
                pass

            try:
                nc = await nats_client.connect(url, nkeys_seed_str=bob.seed, inbox_prefix=bob.inbox_prefix,
                                               connect_timeout=2, allow_reconnect=False, error_cb=quiet)
            except Exception:  # noqa: BLE001 - refused
                return False
            await nc.close()
            return True

        urls = up.servers.nats_url.split(",")
        assert not any(asyncio.run(admitted(u)) for u in urls[1:])  # nobody told them yet
        assert up.supervise()
        deadline = time.monotonic() + 10
        while not all(asyncio.run(admitted(u)) for u in urls):
            assert time.monotonic() < deadline, "a NATS server did not let the new user in"
            time.sleep(0.1)  # the servers reload in the background: nothing to wait on
        assert "the store's users changed" in (up.workdir / "supervisor.log").read_text()
    finally:
        up.stop()
