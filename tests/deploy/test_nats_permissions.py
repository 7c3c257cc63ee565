"""The compose stack's NATS configuration (``deploy/nats/nats.conf``, its users the generated
``nats-auth.conf`` of a credential store) on the real nats-server: it passes the server's own configuration
test; no one gets in without an identity of the store; a user is refused every subject of another user's
(their sessions, requests, notifications, output, launches and replies); users added and removed take
effect on a SIGHUP, without a restart; and the whole system works with each part connected as its own
identity -- the services in this process as the services', a node agent as the agents', a launcher (the
SDK, as ``coorm submit`` uses it) as a user's: a rigid request starts, its processes run, print and exit,
and ``done`` has the allocator kill what still runs. That last test is what shows the permissions are
sufficient. (Every subject of the endpoint table, for every identity: test_endpoints_permissions.py.)"""

from __future__ import annotations

import asyncio
import getpass
import subprocess
import sys

import pytest
import redis

from coorm.shared import bus, keys, subjects
from coorm.shared.credentials import new_identity
from coorm.shared.endpoints import Role
from coorm.shared.servers import _wait_port, free_port, valkey_binary, valkey_config
from tests.deploy.natsserver import TIMEOUT, NatsWithStore, client, connect, refused

LOGIN = getpass.getuser()  # the system test's launcher: the agent runs its processes as this Unix user


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = NatsWithStore(tmp_path_factory.mktemp("nats"), users=("alice", "bob", LOGIN))
    s.start()
    yield s
    s.stop()


# ================================================================================================
# the configuration itself
# ================================================================================================
def test_the_server_accepts_the_configuration(tmp_path):
    s = NatsWithStore(tmp_path)
    ok = s.check()
    assert ok.returncode == 0, ok.stderr + ok.stdout
    # the users come from the store: without its nats-auth.conf the server refuses to start (it would
    # otherwise run with no users at all, open to anyone)
    s.store.nats_auth_path.unlink()
    missing = s.check()
    assert missing.returncode != 0
    assert "nats-auth.conf" in missing.stderr + missing.stdout


def test_the_configuration_check_is_not_blind(tmp_path):
    """The same check refuses a broken users file (so the test above can fail)."""
    s = NatsWithStore(tmp_path)
    s.store.nats_auth_path.write_text(s.store.nats_auth_path.read_text().replace('"allow_responses": true',
                                                                                 '"allow_responses": [oops', 1))
    assert s.check().returncode != 0


# ================================================================================================
# who gets in
# ================================================================================================
async def test_every_identity_of_the_store_gets_in(server):
    for who in ("service", "agent", "alice", "bob"):
        assert await refused(server.url, server.identity(who)) is None, who


async def test_an_anonymous_connection_is_refused(server):
    why = await refused(server.url, None)
    assert why is not None and "authorization violation" in why.lower(), why


async def test_an_unknown_nkey_is_refused(server):
    """A key pair the store does not have, even under a known user's name: the name is not the identity."""
    for who in ("alice", "carol"):
        why = await refused(server.url, new_identity(who, Role.LAUNCHER))
        assert why is not None and "authorization violation" in why.lower(), (who, why)


# ================================================================================================
# a user is confined to their own subjects
# ================================================================================================
# (action alice may take on her own, subject of user {u}): bob's form of each must be refused to her, both ways
OWN = [
    ("publish", subjects.session_open("{u}")),
    ("publish", subjects.app_request("{u}.a1")),
    ("publish", subjects.app_done("{u}.a1")),
    ("publish", subjects.app_close("{u}.a1")),
    ("publish", subjects.app_heartbeat("{u}.a1")),
    ("publish", subjects.app_views("{u}.a1")),
    ("publish", subjects.app_allocations("{u}.a1")),
    ("publish", subjects.node_launch("c0n0", "{u}")),
    ("publish", subjects.node_exits("c0n0", "{u}")),
    ("subscribe", subjects.notify_change("{u}.a1")),
    ("subscribe", subjects.notify_start("{u}.a1")),
    ("subscribe", subjects.notify_kill("{u}.a1")),
    ("subscribe", subjects.app_output("{u}.a1", "{u}.a1.r.1")),
    ("subscribe", subjects.app_output_any("{u}.a1")),
    ("subscribe", subjects.app_exited("{u}.a1")),
    ("subscribe", subjects.inbox_user("{u}") + ".>"),
    ("subscribe", subjects.inbox_user("{u}") + ".x1"),
]
# what no user may read at all: other connections' replies, and wildcards that span users
NOBODY_S = [subjects.INBOX_SERVICE + ".>", subjects.INBOX_AGENT + ".>", "_INBOX.>", "_INBOX.u.>", "_INBOX.u.*.>",
            "coorm.v1.app.*.*.notify.change", "coorm.v1.app.*.a1.notify.*", "coorm.v1.app.>",
            subjects.SESSION_OPEN_ANY, "coorm.v1.node.c0n0.>", "coorm.v1.>", ">"]


async def test_a_user_may_use_their_own_subjects(server):
    """The positive control of the refusals below: the same client, the same checks, no error."""
    async with client(server.url, server.identity("alice")) as c:
        for action, subject in OWN:
            assert await c.may(action, subject.format(u="alice")), (action, subject)


@pytest.mark.parametrize("subject", sorted({s for _, s in OWN}))
async def test_a_user_may_not_touch_another_user_s_subjects(server, subject):
    theirs = subject.format(u="bob")
    async with client(server.url, server.identity("alice")) as c:
        assert not await c.may("publish", theirs), theirs
        assert not await c.may("subscribe", theirs), theirs


@pytest.mark.parametrize("subject", NOBODY_S)
async def test_a_user_may_not_subscribe_to(server, subject):
    async with client(server.url, server.identity("alice")) as c:
        assert not await c.may("subscribe", subject)


async def test_a_user_may_not_answer_in_another_s_place(server):
    """Replies to a user go to the user's own inbox: another user may not publish there (nor to the
    services' or agents' inboxes), so no reply can be forged."""
    async with client(server.url, server.identity("alice")) as c:
        for subject in (subjects.inbox_user("bob") + ".x1", subjects.INBOX_SERVICE + ".x1",
                        subjects.INBOX_AGENT + ".x1", subjects.inbox_user("alice") + ".x1"):
            assert not await c.may("publish", subject), subject


async def test_a_user_s_requests_are_answered_on_the_user_s_inbox(server):
    """The other way round: a service's reply reaches alice, on the inbox prefix her identity names, with
    the services' reply permission (allow_responses), though she may publish to no inbox."""
    service = await connect(server.url, server.identity("service"))
    alice = await connect(server.url, server.identity("alice"))
    try:
        seen: list[str] = []

        async def answer(msg) -> None:
            seen.append(msg.reply)
            await msg.respond(b"pong")

        await service.subscribe(subjects.SESSION_OPEN_ANY, cb=answer)
        await bus.settled(service, int(TIMEOUT))
        reply = await alice.request(subjects.session_open("alice"), b"{}", timeout=TIMEOUT)
        assert reply.data == b"pong"
        assert seen and seen[0].startswith(subjects.inbox_user("alice") + "."), seen
    finally:
        await alice.close()
        await service.close()


# ================================================================================================
# users come and go without a restart
# ================================================================================================
async def test_a_user_added_is_let_in_and_a_user_removed_is_shut_out(tmp_path):
    s = NatsWithStore(tmp_path, users=("alice",))
    s.start()
    try:
        carol = s.store.add_user("carol")
        assert await refused(s.url, carol) is not None  # the server has not read the new file yet
        s.reload()
        assert await refused(s.url, carol) is None

        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        open_conn = await connect(s.url, carol, closed_cb=on_closed)
        assert s.store.remove_user("carol")
        s.reload()
        why = await refused(s.url, carol)
        assert why is not None and "authorization violation" in why.lower(), why
        # and the connection she had is closed: a removed user keeps nothing
        await asyncio.wait_for(closed.wait(), TIMEOUT)
        assert open_conn.is_closed
        assert await refused(s.url, s.store.user("alice")) is None  # the others stay
    finally:
        s.stop()


async def test_a_rotated_identity_replaces_the_old_one(tmp_path):
    s = NatsWithStore(tmp_path, users=("alice",))
    s.start()
    try:
        old = s.store.user("alice")
        new = s.store.add_user("alice", rotate=True)
        s.reload()
        assert await refused(s.url, new) is None
        assert await refused(s.url, old) is not None
    finally:
        s.stop()


async def test_a_request_in_flight_across_a_reload_of_the_users_is_answered(tmp_path):
    """``coorm user add`` reloads nats-server while the services answer requests: the server forgets then
    the replies a responder owes (allow_responses alone), so a request received before the reload and
    answered after it must still reach its user -- the responders may publish on the inboxes."""
    s = NatsWithStore(tmp_path, users=("alice",))
    s.start()
    service = alice = None
    try:
        service = await connect(s.url, s.identity("service"))
        alice = await connect(s.url, s.identity("alice"))
        received: asyncio.Queue = asyncio.Queue()
        await service.subscribe(subjects.SESSION_OPEN_ANY, cb=received.put)
        await bus.settled(service, int(TIMEOUT))
        asking = asyncio.create_task(alice.request(subjects.session_open("alice"), b"{}", timeout=TIMEOUT))
        msg = await asyncio.wait_for(received.get(), TIMEOUT)
        s.store.add_user("carol")  # a change of users: the server re-reads every client's permissions
        await asyncio.to_thread(s.reload)
        await msg.respond(b"pong")
        assert (await asking).data == b"pong"
    finally:
        for c in (alice, service):
            if c is not None:
                await c.close()
        s.stop()


# ================================================================================================
# the system, each part as its own identity
# ================================================================================================
@pytest.fixture(scope="module")
def valkey(tmp_path_factory, server):
    """valkey-server wanting the store's credentials, as coorm up runs it: its URL as the services'."""
    workdir = tmp_path_factory.mktemp("valkey")
    port = free_port()
    proc = subprocess.Popen([valkey_binary(), str(valkey_config(workdir, server.store)), "--port", str(port),
                             "--bind", "127.0.0.1", "--dir", str(workdir), "--save", "", "--appendonly", "no",
                             "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc, "valkey-server")
        yield server.store.redis_url("127.0.0.1", port)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _views_show(session, cluster: str, nodes: int) -> None:
    """Until the session's non-preemptive view of ``cluster`` shows ``nodes`` free now."""
    def free() -> int:
        view = session.np.get(cluster)
        return -1 if view is None else view.value_at(session.now)

    while free() != nodes:
        await session.next_event(TIMEOUT)  # a views change, or another event: look again


async def test_the_system_runs_with_each_part_as_its_own_identity(server, valkey, capsys):
    # (imported here: the permission tests above need none of the services' code)
    from coorm.cli.live import _status, _submit
    from coorm.launchers.sdk import Session
    from coorm.node_agent.agent import Agent
    from coorm.node_agent.nodes import host_node_info
    from coorm.services.accounting.service import AccountingService
    from coorm.services.stack import LocalStack, wait_until
    from coorm.shared.requests import RequestSpec
    from coorm.shared.settings import Settings

    r = redis.Redis.from_url(valkey)
    r.flushall()
    r.close()
    fast = dict(nats_url=server.url, redis_url=valkey, reschedule_interval=0.05, fair_start=0.2, preempt_grace=1.0,
                kill_grace=0.3, launcher_heartbeat=0.5, session_timeout=10.0, agent_heartbeat=0.5,
                agent_timeout=5.0, nats_seed=None, service_key=None)
    store = server.store
    # services and agents take their role's identity from the store (coorm up's way), the agent the services'
    # key from its service.pub; the user's programs have only the user's identity file
    as_service = Settings(credentials_dir=store.root, nats_credentials=None, **fast)
    as_agent = Settings(credentials_dir=store.root, nats_credentials=None, **fast)
    as_launcher = Settings(nats_credentials=store.user_path(LOGIN), credentials_dir=None, **fast)
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
                assert s.app.startswith(f"{LOGIN}.")
                await asyncio.wait_for(_views_show(s, "c0", 4), TIMEOUT)
                # coorm status, as a user
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
                # done: the allocator has the agent kill what still runs (service -> agent, signed)
                await s.done(rid)
                exits = await s.wait_exits(rid, 2, TIMEOUT)
                assert exits[1].pid == pid2 and exits[1].killed

            # coorm submit, as a user: its own session, the job's output and exit code
            probe = [sys.executable, "-c", "import os; print('on', os.environ['COORM_NODE'])"]
            code = await asyncio.wait_for(_submit(as_launcher, "c0", 2, 60.0, probe, None, False, "submit"),
                                          TIMEOUT)
            assert code == 0
            ran_on = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("on ")]
            assert len(ran_on) == 2 and len(set(ran_on)) == 2 and set(ran_on) <= set(nodes), ran_on

            # accounting read the lifecycle stream (the pull consumer, as the services)
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


async def test_valkey_refuses_anyone_without_the_services_password(valkey):
    """The system test's Valkey is the one coorm up runs: no default user."""
    anonymous = redis.Redis.from_url(valkey.replace(valkey.split("@")[0] + "@", "redis://"))
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()
    finally:
        anonymous.close()
    services = redis.Redis.from_url(valkey)
    try:
        assert services.ping()
    finally:
        services.close()
