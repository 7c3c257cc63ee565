"""The compose stack's NATS configuration (``deploy/nats/nats.conf``) run by the real nats-server, beside a
credential store generated for the test where compose mounts one, and clients that connect as an identity
of the store and record what the server refuses them. Shared by the permission tests of this folder (and
the command line's tests, for the reload probe)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path

import nats

from coorm.shared import bus
from coorm.shared.credentials import CredentialStore, Identity
from coorm.shared.endpoints import Role
from coorm.shared.servers import _wait_port, free_port, nats_binary

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "nats" / "nats.conf"
TIMEOUT = 10.0  # seconds any single step may take


def include_of(text: str) -> str:
    """The file nats.conf includes (its users): a path relative to the conf's folder."""
    found = re.findall(r'(?m)^\s*include\s+"?([^"\s]+)"?\s*$', text)
    assert len(found) == 1, f"{CONF} should include one file (the store's nats-auth.conf), not {found}"
    return found[0]


def local_copy(text: str, port: int, monitor: int, jetstream: Path) -> str:
    """The compose file's configuration with its ports and JetStream folder replaced, on 127.0.0.1 only.
    Each replaced setting must be there exactly once (else the copy would not be the file under test)."""
    for pattern, repl in ((r"(?m)^port:\s*\d+\s*$", f"host: 127.0.0.1\nport: {port}"),
                          (r"(?m)^http_port:\s*\d+\s*$", f'http: "127.0.0.1:{monitor}"'),
                          (r"(?m)^(\s*)store_dir:.*$", rf'\g<1>store_dir: "{jetstream}"')):
        text, n = re.subn(pattern, repl, text)
        assert n == 1, f"{pattern} should match once in {CONF}"
    return text


class NatsWithStore:
    """``deploy/nats/nats.conf`` in ``workdir`` with a store where its include points (compose mounts the
    store's folder at the same place beside the conf), so the include resolves as it does in the container.
    nats-server writes its pid into the store, as ``coorm up``'s does: ``store.reload_nats()`` reaches it."""

    def __init__(self, workdir: Path, users: Iterable[str] = ("alice", "bob")) -> None:
        self.port, self.monitor = free_port(), free_port()
        text = CONF.read_text()
        include = Path(include_of(text))
        self.store = CredentialStore(workdir / include.parent).init(users=users)
        assert include.name == self.store.nats_auth_path.name, f"{CONF} includes {include}, the store writes " \
                                                               f"{self.store.nats_auth_path.name}"
        self.conf = workdir / "nats.conf"
        self.conf.write_text(local_copy(text, self.port, self.monitor, workdir / "jetstream"))
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def identity(self, who: str) -> Identity:
        """``service``, ``agent``, or a user's name."""
        return self.store.role(Role(who)) if who in ("service", "agent") else self.store.user(who)

    def check(self) -> subprocess.CompletedProcess:
        """nats-server's own test of the configuration (``-t``)."""
        return subprocess.run([nats_binary(), "-c", str(self.conf), "-t"], env={"PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=30)

    def start(self) -> None:
        self.proc = subprocess.Popen([nats_binary(), "-c", str(self.conf), "-P", str(self.store.nats_pid_path)],
                                     env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        _wait_port(self.port, self.proc, "nats-server")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def reload(self) -> None:
        """SIGHUP through the store's pid file, and wait until the server has read its configuration."""
        before = config_load_time(self.monitor)
        assert self.store.reload_nats(), "the store's pid file should name the running nats-server"
        wait_reloaded(self.monitor, before)


def config_load_time(monitor: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=TIMEOUT) as r:
        return json.load(r)["config_load_time"]


def wait_reloaded(monitor: int, before: str, timeout: float = TIMEOUT) -> None:
    """Until nats-server reports a configuration loaded after ``before`` (it sets the time once a reload
    has been applied; a configuration it refuses leaves it, and this times out)."""
    deadline = time.monotonic() + timeout
    while config_load_time(monitor) == before:
        assert time.monotonic() < deadline, "nats-server did not reload its configuration"
        time.sleep(0.01)


async def connect(url: str, ident: Identity | None, **kw) -> nats.NATS:
    """A connection as ``ident`` (None: anonymous), with no retries: a refusal raises."""
    auth = {} if ident is None else {"nkeys_seed_str": ident.seed, "inbox_prefix": ident.inbox_prefix}

    async def quiet(e: Exception) -> None:  # (the refusal is raised; nats-py would also log it)
        pass

    kw.setdefault("error_cb", quiet)
    return await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=TIMEOUT,
                              **auth, **kw)


async def refused(url: str, ident: Identity | None) -> str | None:
    """The server's refusal of a connection as ``ident``, or None if it let it in."""
    try:
        nc = await connect(url, ident)
    except nats.errors.Error as e:
        return str(e)
    await nc.close()
    return None


class Client:
    """A connection as one identity that records the errors the server reports. nats-py hands a permission
    violation (``-ERR 'Permissions Violation ...'``) to the error callback and keeps the connection. The
    server answers a client's operations in order, so after an action the client publishes to a sentinel
    subject no identity may publish to: once the sentinel's violation came back, whatever the action caused
    came before it. (``flush()`` alone is no such barrier: nats-py 2.16 writes its PING straight to the
    socket, ahead of publishes still in its buffer.)"""

    SENTINEL = "coorm-test.sentinel"

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.changed = asyncio.Condition()
        self.nc: nats.NATS | None = None
        self._n = 0

    async def on_error(self, e: Exception) -> None:
        async with self.changed:
            self.errors.append(str(e))
            self.changed.notify_all()

    async def connect(self, url: str, ident: Identity) -> Client:
        self.nc = await connect(url, ident, error_cb=self.on_error)
        return self

    async def refused(self, action) -> list[str]:
        """The errors the server reported for ``action`` (a coroutine function of the connection)."""
        before = len(self.errors)
        await action(self.nc)
        self._n += 1
        sentinel = f"{self.SENTINEL}.{self._n}"
        assert self.nc is not None
        await self.nc.publish(sentinel, b"")
        await bus.settled(self.nc, int(TIMEOUT))

        def index() -> int | None:
            return next((i for i, e in enumerate(self.errors) if f'"{sentinel}"' in e.lower()), None)

        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: index() is not None), TIMEOUT)
        return self.errors[before:index()]

    async def may(self, action: str, subject: str) -> bool:
        """Whether the server lets this connection publish to (``publish``) or subscribe to (``subscribe``)
        ``subject``."""
        if action == "publish":
            errors = await self.refused(lambda nc: nc.publish(subject, b"{}"))
            return not violation(errors, "publish", subject)
        errors = await self.refused(lambda nc: nc.subscribe(subject))
        return not violation(errors, "subscription", subject)

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


@contextlib.asynccontextmanager
async def client(url: str, ident: Identity):
    c = await Client().connect(url, ident)
    try:
        yield c
    finally:
        await c.close()


def violation(errors: list[str], what: str, subject: str) -> bool:
    """nats-py lowercases the server's message (``Permissions Violation for Publish to "SUBJECT"``)."""
    return any(f'permissions violation for {what} to "{subject.lower()}"' in e.lower() for e in errors)
