"""The attacks of issue 12, each against the real servers with the real configuration (the NATS users and
Valkey ACL that :func:`coorm.shared.servers.start_servers` generates, as ``coorm up`` does) and the real
services and agents: a hostile user who holds valid credentials of their own (``daemon``) against a
victim (``nobody``), and clients with none. Each attack failed before authentication: any local user could
do all of it."""

from __future__ import annotations

import asyncio
import json
import os
import time

import nats
import pytest
import redis

from coorm.launchers.sdk import Session
from coorm.services.stack import LocalStack
from coorm.shared import bus, keys, subjects
from coorm.shared.credentials import CredentialStore, Identity, new_identity, signature_headers
from coorm.shared.endpoints import Role
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import (
    Ack,
    DoneMsg,
    ErrorReply,
    KillMsg,
    LaunchMsg,
    NodeAssign,
    StatusQuery,
    StatusReply,
)
from coorm.shared.requests import RequestSpec
from coorm.shared.settings import Settings

VICTIM, MALLORY = "nobody", "daemon"  # Unix users of any Debian-like host (processes run as them)
WAIT = 10.0


@pytest.fixture(scope="module")
def store(servers) -> CredentialStore:
    """The servers' credential store with the victim and the attacker added, and nats-server told."""
    store = CredentialStore(servers.credentials)
    for user in (VICTIM, MALLORY):
        store.add_user(user)
    assert store.reload_nats(), "nats-server did not write its pid file"
    for user in (VICTIM, MALLORY):  # the reload is asynchronous: the user is known once a connection works
        asyncio.run(_until_admitted(servers.nats_url, store.user(user)))
    return store


async def _until_admitted(url: str, ident: Identity) -> None:
    deadline = time.monotonic() + WAIT
    while True:
        try:
            nc = await nats.connect(url, nkeys_seed_str=ident.seed, inbox_prefix=ident.inbox_prefix,
                                    allow_reconnect=False, connect_timeout=1)
        except (nats.errors.Error, OSError):  # refused (the server may cut the connection before saying so)
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)  # polling the server's reload: it says nothing when it is done
            continue
        await nc.close()
        return


@pytest.fixture
async def system(servers, redis_url, store):
    settings = Settings(nats_url=servers.nats_url, redis_url=servers.redis_url, reschedule_interval=0.0,
                        fair_start=0.0, kill_grace=0.3, launcher_heartbeat=0.5, session_timeout=30.0)
    async with LocalStack(settings, {"c0": 4}) as stack:
        yield stack


def as_user(stack: LocalStack, store: CredentialStore, user: str) -> Settings:
    return stack.settings.model_copy(update={"nats_credentials": store.user_path(user), "credentials_dir": None})


class Hostile:
    """A bare NATS connection as one identity, recording what the server refused it."""

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self._said = asyncio.Event()
        self.nc: nats.NATS | None = None

    @classmethod
    async def connect(cls, url: str, ident: Identity) -> Hostile:
        self = cls()

        async def on_error(e: Exception) -> None:
            self.refusals.append(str(e).lower())
            self._said.set()

        self.nc = await nats.connect(url, nkeys_seed_str=ident.seed, inbox_prefix=ident.inbox_prefix,
                                     error_cb=on_error, allow_reconnect=False)
        return self

    async def refused(self, action: str, subject: str) -> None:
        """Wait for the server's refusal to ``action`` (publish, subscription) ``subject``."""
        want = f'permissions violation for {action} to "{subject}"'.lower()
        async with asyncio.timeout(WAIT):
            while not any(want in r for r in self.refusals):
                self._said.clear()
                await self._said.wait()

    async def close(self) -> None:
        assert self.nc is not None
        await self.nc.close()


async def _open(stack, store, user: str, nodes: int = 2) -> tuple[Session, str, str]:
    """A session of ``user`` whose request started: (the session, the request, its first node)."""
    app = await Session.open(as_user(stack, store, user), kind="rigid", name=f"{user}-job")
    (rid,) = await app.request(RequestSpec(id=app.rid("r"), cluster="c0", nodes=nodes, duration=600))
    started = await app.wait_start(rid, WAIT)
    return app, rid, started.nodes[0]


async def _printed(app: Session, out: asyncio.Queue, rid: str) -> list[str]:
    """Every line the request's one process printed, once it exited (its output comes before its exit)."""
    await app.wait_exits(rid, 1, WAIT)
    lines: list[str] = []
    while not out.empty():
        lines += out.get_nowait().data.splitlines()
    return lines


# ================================================================================================
# no credentials, no entry
# ================================================================================================
async def test_nothing_answers_without_credentials(servers, store):
    settings = Settings(nats_url=servers.nats_url, connect_timeout=2.0)
    with pytest.raises(bus.Refused, match="wants credentials"):
        await bus.connect_client(servers.nats_url, "anonymous", timeout=2.0, reconnect_window=1.0, identity=None)
    stranger = new_identity(MALLORY, Role.LAUNCHER)  # a well-formed nkey the operator never issued
    with pytest.raises(bus.Refused, match="refused the credentials"):
        await bus.connect_client(servers.nats_url, "stranger", timeout=2.0, reconnect_window=1.0, identity=stranger)
    with pytest.raises(bus.Refused):  # what a launcher without credentials meets: a refusal, not a hang
        await Session.open(settings.model_copy(update={"credentials_dir": None}), kind="rigid")
    # valkey: the services' state (the leader's lease, the event log) is out of reach without the password
    for url in (f"redis://127.0.0.1:{servers.redis_port}/0", f"redis://default:x@127.0.0.1:{servers.redis_port}/0",
                f"redis://coorm:wrong@127.0.0.1:{servers.redis_port}/0"):
        r = redis.Redis.from_url(url, socket_timeout=5)
        with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
            r.set("coorm:policy:leader", "mallory")
        r.close()
    r = redis.Redis.from_url(servers.redis_url)
    assert r.ping()  # the services' user does get in
    r.close()


# ================================================================================================
# one user against another
# ================================================================================================
async def test_a_user_reads_neither_another_users_replies_nor_notifications_nor_output(system, store, servers):
    mallory = await Hostile.connect(servers.nats_url, store.user(MALLORY))
    try:
        heard: list = []

        async def got(msg) -> None:
            heard.append(msg.subject)

        snoops = ["_INBOX.>", subjects.inbox_user(VICTIM) + ".>", "_INBOX.u.*.>", subjects.INBOX_SERVICE + ".>",
                  f"{subjects.PREFIX}.app.{VICTIM}.>", f"{subjects.PREFIX}.app.*.*.notify.start",
                  subjects.app_output_any(f"{VICTIM}.*"), f"{subjects.PREFIX}.>", ">"]
        for pattern in snoops:
            await mallory.nc.subscribe(pattern, cb=got)
        for pattern in snoops:
            await mallory.refused("subscription", pattern)
        # the victim's whole session: its open (the reply carries the token), views, start, output, exit
        victim, rid, node = await _open(system, store, VICTIM)
        out = victim.all_output()
        await victim.launch(rid, node, ["/bin/echo", "the victim's secret"], cwd="/")
        assert await _printed(victim, out, rid) == ["the victim's secret"]
        await victim.close()
        await bus.settled(mallory.nc)
        assert heard == [], f"the attacker heard {heard}"
    finally:
        await mallory.close()


async def test_a_user_cannot_end_or_launch_on_another_users_request(system, store, servers):
    victim, rid, node = await _open(system, store, VICTIM)
    pids = await victim.launch(rid, node, ["/bin/sleep", "300"], cwd="/")
    seq = victim.app.split(".")[1]
    mallory = await Hostile.connect(servers.nats_url, store.user(MALLORY))
    try:
        # on the victim's own subjects (even knowing the victim's token): NATS drops it
        for subject, message in (
                (subjects.app_done(victim.app), DoneMsg(token=victim.token, request=rid)),
                (subjects.node_launch(node, VICTIM), LaunchMsg(token=victim.token, app=victim.app, request=rid,
                                                               argv=["/bin/true"]))):
            await mallory.nc.publish(subject, bus.encode(message))
            await mallory.refused("publish", subject)
        # on the attacker's own subjects, naming the victim's application: refused by the RMS
        with pytest.raises(bus.WireError) as e:
            await bus.call(mallory.nc, subjects.app_done(f"{MALLORY}.{seq}"),
                           DoneMsg(token=victim.token, request=rid), Ack)
        assert e.value.code is ErrorCode.UNKNOWN_APP
        with pytest.raises(bus.WireError) as e:
            await bus.call(mallory.nc, subjects.node_launch(node, MALLORY),
                           LaunchMsg(token=victim.token, app=victim.app, request=rid, argv=["/bin/true"]), Ack)
        assert e.value.code is ErrorCode.NOT_OWNER
        # nothing happened to the victim: its request runs, its process too
        st = await bus.call(mallory.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply)
        assert {(r.request, r.state) for r in st.requests if r.app == victim.app} == {(rid, "started")}
        assert all(_alive(pid) for pid in pids)
    finally:
        await mallory.close()
        await victim.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_only_the_services_assign_nodes_and_kill(system, store, servers):
    victim, rid, node = await _open(system, store, VICTIM)
    pids = await victim.launch(rid, node, ["/bin/sleep", "300"], cwd="/")
    agent = system.agents["c0"]
    owner = agent.book.assignment(node)
    grab = NodeAssign(app=f"{MALLORY}.a1", request="grab", nodes=[node], token_sha256="0" * 64)
    kill = KillMsg(request=rid, grace=0.0, reason="mallory")
    # a user, and an agent, may not publish either: NATS drops them
    for ident in (store.user(MALLORY), store.role(Role.AGENT)):
        hostile = await Hostile.connect(servers.nats_url, ident)
        try:
            for subject, message in ((subjects.node_assign(node), grab), (subjects.node_kill(node), kill)):
                await hostile.nc.publish(subject, bus.encode(message))
                await hostile.refused("publish", subject)
        finally:
            await hostile.close()
    # and should the server let one through (a misconfiguration, a stolen connection), the agent still wants
    # the services' signature: unsigned, or signed by another key, it refuses and changes nothing
    service_nc = await bus.connect(servers.nats_url, "forger", store.role(Role.SERVICE))
    try:
        for subject, message in ((subjects.node_assign(node), grab), (subjects.node_kill(node), kill)):
            data = bus.encode(message)
            for headers in (None, signature_headers(store.user(MALLORY), subject, data)):
                reply = await service_nc.request(subject, data, timeout=WAIT, headers=headers)
                refusal = ErrorReply.model_validate_json(reply.data)
                assert refusal.error.code is ErrorCode.FORBIDDEN, refusal
        assert agent.book.assignment(node) == owner
        assert all(_alive(pid) for pid in pids)
    finally:
        await bus.shutdown(service_nc)
        await victim.close()


async def test_the_user_recorded_is_the_authenticated_one(system, store, servers):
    mallory = await Hostile.connect(servers.nats_url, store.user(MALLORY))
    try:
        # a message cannot name a user: the field does not exist
        reply = await mallory.nc.request(subjects.session_open(MALLORY), b'{"user": "root"}', timeout=WAIT)
        assert ErrorReply.model_validate_json(reply.data).error.code is ErrorCode.BAD_MESSAGE
        # nor can a user open on another's subject
        await mallory.nc.publish(subjects.session_open(VICTIM), b"{}")
        await mallory.refused("publish", subjects.session_open(VICTIM))
    finally:
        await mallory.close()
    app, _, _ = await _open(system, store, MALLORY)
    try:
        assert subjects.owner(app.app) == MALLORY
        st = await bus.call(app.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply)
        assert [a.user for a in st.apps if a.app == app.app] == [MALLORY]
        # the session's record, which every lifecycle event for accounting takes its user from
        r = redis.Redis.from_url(servers.redis_url)
        assert json.loads(r.hget(keys.SESSIONS, app.app))["user"] == MALLORY
        r.close()
    finally:
        await app.close()


# ================================================================================================
# processes: as the user, in a clean environment, where the user may go
# ================================================================================================
@pytest.mark.skipif(os.geteuid() != 0, reason="an agent drops privileges only when it runs as root")
async def test_processes_run_as_the_submitting_user_in_a_clean_environment(system, store):
    app, rid, node = await _open(system, store, VICTIM, nodes=1)
    try:
        out = app.all_output()
        await app.launch(rid, node, ["/bin/sh", "-c", "id -u; id -g; pwd; env"], cwd="/", env={"MY_SETTING": "42"})
        lines = await _printed(app, out, rid)
        assert lines[:3] == ["65534", "65534", "/"]
        env = dict(line.split("=", 1) for line in lines[3:] if "=" in line)
        assert env["USER"] == VICTIM and env["HOME"] == "/nonexistent" and env["MY_SETTING"] == "42"
        assert env["COORM_APP"] == app.app and env["COORM_NODE"] == node
        leaked = sorted(k for k in env if k in os.environ and k not in ("PATH", "HOME", "USER", "LOGNAME", "SHELL",
                                                                          "PWD", "SHLVL", "_"))
        assert leaked == [], f"the agent's environment leaked into the job: {leaked}"
        assert "COORM_CREDENTIALS_DIR" not in env
        for kw, code in (({"env": {"LD_PRELOAD": "/tmp/evil.so"}}, ErrorCode.FORBIDDEN),
                         ({"cwd": "/root"}, ErrorCode.BAD_CWD)):  # (root's home: 0700)
            with pytest.raises(bus.WireError) as e:
                await app.launch(rid, node, ["/bin/true"], **{"cwd": "/", **kw})
            assert e.value.code is code, e.value
    finally:
        await app.close()


async def test_a_user_the_node_does_not_know_is_refused(system, store, servers):
    store.add_user("no_such_unix_user")
    assert store.reload_nats()
    await _until_admitted(servers.nats_url, store.user("no_such_unix_user"))
    app, rid, node = await _open(system, store, "no_such_unix_user", nodes=1)
    try:
        with pytest.raises(bus.WireError) as e:
            await app.launch(rid, node, ["/bin/true"], cwd="/")
        assert e.value.code is ErrorCode.UNKNOWN_USER
    finally:
        await app.close()
        store.remove_user("no_such_unix_user")
        store.reload_nats()


async def test_an_agent_without_the_services_key_does_not_start(servers, store):
    from coorm.node_agent import procs
    from coorm.node_agent.agent import Agent
    from coorm.node_agent.nodes import host_node_info

    settings = Settings(nats_url=servers.nats_url, credentials_dir=None,
                        nats_credentials=store.role_path(Role.AGENT))
    agent = Agent(settings, "keyless", "c9", host_node_info(["c9n0"], cores=1, memory_mb=64))
    subreaper = procs.is_child_subreaper()
    with pytest.raises(RuntimeError, match="public key"):
        await agent.start()
    assert agent.nc is None and procs.is_child_subreaper() == subreaper  # nothing taken, nothing left held
