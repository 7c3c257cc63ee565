"""The compose stack's NATS configuration (``deploy/nats/nats.conf``) on the real nats-server: it passes the
server's own configuration test; each role's user is refused what its role must not do (a permission
violation, reported by nats-py through the error callback); and the whole system works with each part
connected as its role's user -- the services in this process as ``service``, a node agent as ``agent``, a
launcher (the SDK, as ``coorm submit`` uses it) as ``launcher``: a rigid request starts, its processes run,
print and exit, and ``done`` has the allocator kill what still runs. That last test is what shows the
permissions are sufficient."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import subprocess
import sys
from pathlib import Path

import nats
import pytest
import redis

from coorm.cli.live import _status, _submit
from coorm.launchers.sdk import Session
from coorm.node_agent.agent import Agent
from coorm.node_agent.nodes import host_node_info
from coorm.services.accounting.service import AccountingService
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import keys, subjects
from coorm.shared.requests import RequestSpec
from coorm.shared.servers import _wait_port, free_port, nats_binary, valkey_binary
from coorm.shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "deploy" / "nats" / "nats.conf"
ROLES = ("service", "agent", "launcher")
TIMEOUT = 10.0  # seconds any single step below may take


def _password_env(passwords: dict[str, str]) -> dict[str, str]:
    return {f"COORM_NATS_{role.upper()}_PASSWORD": pw for role, pw in passwords.items()}


def _local_copy(text: str, port: int, monitor: int, store: Path) -> str:
    """The compose file's configuration with its ports and store directory replaced, on 127.0.0.1 only.
    Each replaced setting must be there exactly once (else the copy would not be the file under test)."""
    for pattern, repl in ((r"(?m)^port:\s*\d+\s*$", f"host: 127.0.0.1\nport: {port}"),
                          (r"(?m)^http_port:\s*\d+\s*$", f'http: "127.0.0.1:{monitor}"'),
                          (r"(?m)^(\s*)store_dir:.*$", rf'\g<1>store_dir: "{store}"')):
        text, n = re.subn(pattern, repl, text)
        assert n == 1, f"{pattern} should match once in {CONF}"
    return text


class NatsWithUsers:
    def __init__(self, workdir: Path) -> None:
        self.port, self.monitor = free_port(), free_port()
        self.passwords = {role: secrets.token_hex(12) for role in ROLES}
        self.conf = workdir / "nats.conf"
        self.conf.write_text(_local_copy(CONF.read_text(), self.port, self.monitor, workdir / "jetstream"))
        self.env = {"PATH": "/usr/bin:/bin", **_password_env(self.passwords)}
        self.proc: subprocess.Popen | None = None

    def url(self, role: str, password: str | None = None) -> str:
        return f"nats://{role}:{password or self.passwords[role]}@127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([nats_binary(), "-c", str(self.conf)], env=self.env, stdout=subprocess.DEVNULL,
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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = NatsWithUsers(tmp_path_factory.mktemp("nats"))
    s.start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def valkey(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("valkey")
    port = free_port()
    proc = subprocess.Popen([valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                             "--save", "", "--appendonly", "no", "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc, "valkey-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ================================================================================================
# the configuration itself
# ================================================================================================
def test_the_server_accepts_the_configuration(tmp_path):
    s = NatsWithUsers(tmp_path)
    ok = subprocess.run([nats_binary(), "-c", str(s.conf), "-t"], env=s.env, capture_output=True, text=True,
                        timeout=30)
    assert ok.returncode == 0, ok.stderr + ok.stdout
    # the passwords come from the environment: without them the server refuses to start
    missing = subprocess.run([nats_binary(), "-c", str(s.conf), "-t"], env={"PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0
    assert "COORM_NATS_" in missing.stderr + missing.stdout


def test_the_configuration_check_is_not_blind(tmp_path):
    """The same check refuses a broken permission block (so the test above can fail)."""
    s = NatsWithUsers(tmp_path)
    s.conf.write_text(s.conf.read_text().replace("allow_responses = true", "allow_responses = [oops"))
    bad = subprocess.run([nats_binary(), "-c", str(s.conf), "-t"], env=s.env, capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode != 0


# ================================================================================================
# what each role is refused
# ================================================================================================
class Client:
    """A connection as one role's user that records the errors the server reports. nats-py hands a
    permission violation (``-ERR 'Permissions Violation ...'``) to the error callback and keeps the
    connection. The server answers a client's operations in order, so after an action the client publishes
    to a sentinel subject no role may publish to: once the sentinel's violation came back, whatever the
    action caused came before it. (``flush()`` alone is no such barrier: nats-py 2.16 writes its PING
    straight to the socket, ahead of publishes still in its buffer.)"""

    SENTINEL = "coorm-test.sentinel"

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.changed = asyncio.Condition()
        self.nc = None
        self._n = 0

    async def on_error(self, e: Exception) -> None:
        async with self.changed:
            self.errors.append(str(e))
            self.changed.notify_all()

    async def connect(self, url: str) -> Client:
        self.nc = await nats.connect(url, error_cb=self.on_error, allow_reconnect=False, connect_timeout=TIMEOUT)
        return self

    async def refused(self, action) -> list[str]:
        """The errors the server reported for ``action`` (a coroutine function of the connection)."""
        before = len(self.errors)
        await action(self.nc)
        self._n += 1
        sentinel = f"{self.SENTINEL}.{self._n}"
        await self.nc.publish(sentinel, b"")
        await self.nc.flush(timeout=TIMEOUT)

        def index() -> int | None:
            return next((i for i, e in enumerate(self.errors) if f'"{sentinel}"' in e.lower()), None)

        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: index() is not None), TIMEOUT)
        return self.errors[before:index()]

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


@contextlib.asynccontextmanager
async def client(url: str):
    c = await Client().connect(url)
    try:
        yield c
    finally:
        await c.close()


def _publish(subject: str):
    return lambda nc: nc.publish(subject, b"{}")


def _subscribe(subject: str):
    return lambda nc: nc.subscribe(subject)


def _violation(errors: list[str], what: str, subject: str) -> bool:
    """nats-py lowercases the server's message (``Permissions Violation for Publish to "SUBJECT"``)."""
    return any(f'permissions violation for {what} to "{subject.lower()}"' in e.lower() for e in errors)


@pytest.mark.parametrize("subject", ["coorm.v1.internal.decisions", "coorm.v1.node.c0n0.assign",
                                     "coorm.v1.node.c0n0.kill", "coorm.v1.agent.register", "coorm.v1.lifecycle",
                                     "$JS.API.STREAM.LIST"])
async def test_a_launcher_may_not_publish_to(server, subject):
    async with client(server.url("launcher")) as c:
        errors = await c.refused(_publish(subject))
        assert _violation(errors, "publish", subject), errors


@pytest.mark.parametrize("subject", ["coorm.v1.agent.register", "coorm.v1.internal.decisions",
                                     "coorm.v1.node.c0n0.launch", "coorm.v1.>"])
async def test_a_launcher_may_not_subscribe_to(server, subject):
    async with client(server.url("launcher")) as c:
        errors = await c.refused(_subscribe(subject))
        assert _violation(errors, "subscription", subject), errors


async def test_a_launcher_may_do_what_the_sdk_does(server):
    """The positive control of the refusals above: the same client, the same check, no error."""
    async with client(server.url("launcher")) as c:
        for subject in (subjects.SESSION_OPEN, subjects.app_request("a1"), subjects.app_done("a1"),
                        subjects.node_launch("c0n0"), subjects.QUERY_STATUS):
            assert await c.refused(_publish(subject)) == [], subject
        for subject in (subjects.notify_change("a1"), subjects.app_output_any("a1"), subjects.app_exited("a1")):
            assert await c.refused(_subscribe(subject)) == [], subject


@pytest.mark.parametrize("subject", ["coorm.v1.app.x.request", "coorm.v1.session.open", "coorm.v1.app.x.done",
                                     "coorm.v1.internal.nodes", "coorm.v1.node.c0n1.launch"])
async def test_an_agent_may_not_publish_to(server, subject):
    async with client(server.url("agent")) as c:
        errors = await c.refused(_publish(subject))
        assert _violation(errors, "publish", subject), errors


async def test_an_agent_may_do_what_the_agent_does(server):
    async with client(server.url("agent")) as c:
        for subject in (subjects.AGENT_HEARTBEAT, subjects.AGENT_EXITED, subjects.app_exited("a1"),
                        subjects.app_output("a1", "a1.r")):
            assert await c.refused(_publish(subject)) == [], subject
        for subject in ("coorm.v1.node.c0n0.*", subjects.AGENT_HELLO):
            assert await c.refused(_subscribe(subject)) == [], subject
        # but not the launchers' notifications
        errors = await c.refused(_subscribe(subjects.notify_start("a1")))
        assert _violation(errors, "subscription", subjects.notify_start("a1")), errors


async def test_a_wrong_password_is_refused(server):
    with pytest.raises(nats.errors.Error):
        await nats.connect(server.url("service", password="not-" + server.passwords["service"]),
                           allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=TIMEOUT)


# ================================================================================================
# the system, each part as its role's user
# ================================================================================================
async def _views_show(session: Session, cluster: str, nodes: int) -> None:
    """Until the session's non-preemptive view of ``cluster`` shows ``nodes`` free now."""
    def free() -> int:
        view = session.np.get(cluster)
        return -1 if view is None else view.value_at(session.now)

    while free() != nodes:
        await session.next_event(TIMEOUT)  # a views change, or another event: look again


async def test_the_system_runs_with_each_role_as_its_own_user(server, valkey, capsys):
    r = redis.Redis.from_url(valkey)
    r.flushall()
    r.close()
    fast = dict(redis_url=valkey, reschedule_interval=0.05, fair_start=0.2, preempt_grace=1.0, kill_grace=0.3,
                launcher_heartbeat=0.5, session_timeout=10.0, agent_heartbeat=0.5, agent_timeout=5.0)
    as_service = Settings(nats_url=server.url("service"), **fast)
    as_agent = Settings(nats_url=server.url("agent"), **fast)
    as_launcher = Settings(nats_url=server.url("launcher"), **fast)
    nodes = [f"c0n{i}" for i in range(4)]

    async with LocalStack(as_service, {}):  # policy engine, node allocator, view publisher
        accounting = AccountingService(as_service)
        stop_accounting = asyncio.Event()
        acct_task = asyncio.create_task(accounting.run(stop_accounting))
        agent = Agent(as_agent, "agent-c0", "c0", host_node_info(nodes, cores=1, memory_mb=1024))
        try:
            await asyncio.wait_for(accounting.ready.wait(), TIMEOUT)
            await asyncio.wait_for(agent.start(), TIMEOUT)  # registered: the allocator answered it
            async with await Session.open(as_launcher, kind="rigid", name="perm") as s:
                await asyncio.wait_for(_views_show(s, "c0", 4), TIMEOUT)
                # coorm status, as a launcher user
                st = await _status(as_launcher)
                assert {c.cluster: c.up for c in st.clusters} == {"c0": 4}
                assert {c.id: c.nodes for c in (await s.clusters_info()).clusters} == {"c0": 4}
                await s.inter_cluster_info()

                (rid,) = await s.request(RequestSpec(id=s.rid("job"), cluster="c0", nodes=2, duration=60))
                start = await s.wait_start(rid, TIMEOUT)
                assert len(start.nodes) == 2 and set(start.nodes) <= set(nodes)
                first, second = start.nodes
                output = s.output(rid)
                (pid1,) = await s.launch(rid, first, [sys.executable, "-c", "print('hello from a node')"])
                (pid2,) = await s.launch(rid, second, ["sleep", "60"])
                line = await asyncio.wait_for(anext(output), TIMEOUT)  # agent -> launcher: the output
                assert "hello from a node" in line.data and line.node == first
                (ex,) = await s.wait_exits(rid, 1, TIMEOUT)  # agent -> launcher: the exit
                assert (ex.pid, ex.code, ex.killed) == (pid1, 0, False)
                # done: the allocator has the agent kill what still runs (service -> agent request/reply)
                await s.done(rid)
                exits = await s.wait_exits(rid, 2, TIMEOUT)
                assert exits[1].pid == pid2 and exits[1].killed

            # coorm submit, as a launcher user: its own session, the job's output and exit code
            probe = [sys.executable, "-c", "import os; print('on', os.environ['COORM_NODE'])"]
            code = await asyncio.wait_for(_submit(as_launcher, "c0", 2, 60.0, probe, None, False, "submit"),
                                          TIMEOUT)
            assert code == 0
            ran_on = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("on ")]
            assert len(ran_on) == 2 and len(set(ran_on)) == 2 and set(ran_on) <= set(nodes), ran_on

            # accounting read the lifecycle stream (the pull consumer, as the service user)
            check = redis.Redis.from_url(valkey, decode_responses=True)
            try:
                await wait_until(lambda: "ended_at" in check.hgetall(keys.acct_request(rid)), TIMEOUT,
                                 "accounting to record the request's end")
                assert check.hget(keys.acct_request(rid), "started_at")
            finally:
                check.close()
        finally:
            await agent.stop()
            stop_accounting.set()
            await asyncio.wait_for(acct_task, TIMEOUT)
