"""The node agent: its pure bookkeeping (NodeBook, node lists) and the daemon against a real nats-server with
real processes. Every wait is on a message or a future (with a timeout), never a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import nats.errors
import pytest
from pydantic import BaseModel

from coorm.node_agent import procs
from coorm.node_agent.agent import Agent
from coorm.node_agent.containment import Cgroups
from coorm.node_agent.nodes import default_agent_id, host_memory_mb, host_node_info, parse_nodes
from coorm.node_agent.state import NodeBook, Refused
from coorm.services.stack import wait_until
from coorm.shared import bus, subjects
from coorm.shared.bus import WireError, call, connect, decode, encode, serve
from coorm.shared.credentials import CredentialStore
from coorm.shared.endpoints import Role
from coorm.shared.events import EndReason, ErrorCode
from coorm.shared.protocol import (
    Ack,
    AgentHeartbeat,
    AgentRegister,
    AgentRegistered,
    ErrorReply,
    KillMsg,
    KillNotify,
    KillReply,
    LaunchMsg,
    LaunchReply,
    NodeAssign,
    NodeInfo,
    ProcessExited,
    ProcessOutput,
    StartNotify,
)
from coorm.shared.settings import Settings
from tests.live.roles import ME, Roles
from tests.live.test_security import _until_admitted

# the live part's applications are this test user's (an agent launches for the subject's user only)
A1, A2, A3 = (subjects.app_id(ME, i) for i in (1, 2, 3))
EXITS = subjects.app_exited(f"{ME}.*")  # every exit of the user's applications (no one reads agent.exited)
TOKEN = "secret-token"
TOKEN_SHA = hashlib.sha256(TOKEN.encode()).hexdigest()
WAIT = 10.0


# ================================================================================================
# pure parts
# ================================================================================================
def test_parse_nodes_ranges_lists_prefixes():
    assert parse_nodes("n0..n3") == ["n0", "n1", "n2", "n3"]
    assert parse_nodes("n0..n15")[-1] == "n15" and len(parse_nodes("n0..n15")) == 16
    assert parse_nodes("a,b,c") == ["a", "b", "c"]
    assert parse_nodes("c0n0..c0n3") == ["c0n0", "c0n1", "c0n2", "c0n3"]
    assert parse_nodes("c0n0..c0n1, c1n0..c1n1") == ["c0n0", "c0n1", "c1n0", "c1n1"]
    assert parse_nodes("n8..12") == ["n8", "n9", "n10", "n11", "n12"]
    assert parse_nodes("n08..n11") == ["n08", "n09", "n10", "n11"]
    assert parse_nodes("solo") == ["solo"]
    for bad in ("", "a,,b", "n3..n1", "n0..m3", "a.b", "n*", "a,a", "n0..n1,n1", "x..y"):
        with pytest.raises(ValueError):
            parse_nodes(bad)


def test_host_node_info(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:  1 kB\n")
    assert host_memory_mb(meminfo) == 16000
    assert host_memory_mb(tmp_path / "missing") >= 1
    infos = host_node_info(["n0", "n1"])
    assert [i.id for i in infos] == ["n0", "n1"]
    assert infos[0].cores == (os.cpu_count() or 1) and infos[0].memory_mb == host_memory_mb()
    assert host_node_info(["n0"], cores=4, memory_mb=1000) == [NodeInfo(id="n0", cores=4, memory_mb=1000)]
    assert default_agent_id("c0").startswith("c0@")


def _assign(app="a1", request="r1", nodes=("n0",), end=None, previous=None, token_sha=TOKEN_SHA):
    return NodeAssign(app=app, request=request, nodes=list(nodes), token_sha256=token_sha, end=end,
                      previous=previous)


def test_book_launch_rights():
    book = NodeBook(["n0", "n1"], kill_grace=2.0)
    with pytest.raises(Refused) as e:
        book.check_launch("n0", "a1", "r1", TOKEN, now=0.0)
    assert e.value.code is ErrorCode.NOT_OWNER and "not allocated" in e.value.message
    book.assign("n0", _assign(nodes=("n0", "n1"), end=100.0))
    a = book.check_launch("n0", "a1", "r1", TOKEN, now=50.0)
    assert a.nodes == ("n0", "n1") and a.end == 100.0
    for app, request, token, now, code in [
        ("a2", "r1", TOKEN, 50.0, ErrorCode.NOT_OWNER),  # another application
        ("a1", "r2", TOKEN, 50.0, ErrorCode.NOT_OWNER),  # another request of the owner
        ("a1", "r1", "guess", 50.0, ErrorCode.BAD_TOKEN),  # the owner's request, the wrong token
        ("a1", "r1", TOKEN, 100.5, ErrorCode.NOT_OWNER),  # after the end
    ]:
        with pytest.raises(Refused) as e:
            book.check_launch("n0", app, request, token, now=now)
        assert e.value.code is code, (app, request, token, now)
    with pytest.raises(Refused):
        book.check_launch("n1", "a1", "r1", TOKEN, now=50.0)  # the assignment is per node
    with pytest.raises(KeyError):
        book.check_launch("n9", "a1", "r1", TOKEN, now=0.0)


def test_book_processes_kill_and_next_handover():
    book = NodeBook(["n0", "n1"], kill_grace=2.0)
    book.assign("n0", _assign())
    book.assign("n1", _assign(nodes=("n1",)))
    book.started(10, "n0", "a1", "r1")
    book.started(11, "n0", "a1", "r1")
    book.started(12, "n1", "a1", "r1")
    assert book.process_count == 3
    # NEXT: r2 takes n0 over from r1; its processes go on under r2
    assert book.assign("n0", _assign(request="r2", previous="r1")) == []
    assert {p.request for p in book.processes(node="n0")} == {"r2"}
    assert book.kill("n0", "r1") == []  # nothing of r1 left on n0
    assert book.assignment("n0").request == "r2"
    assert book.kill("n1", "r1") == [12]
    assert book.assignment("n1") is None and book.process(12).killed
    assert book.exited(12).killed
    assert sorted(book.kill("n0", "r2")) == [10, 11]
    assert book.assignment("n0") is None
    assert book.kill("n0", "nothing") == []


def test_book_new_owner_dooms_the_old_processes():
    book = NodeBook(["n0"], kill_grace=1.0)
    book.assign("n0", _assign())
    book.started(10, "n0", "a1", "r1")
    # the same request again (a new end): nothing to kill
    assert book.assign("n0", _assign(end=50.0)) == []
    # another application claiming r1 as previous does not inherit a1's processes
    assert book.assign("n0", _assign(app="a2", request="r9", previous="r1")) == [10]
    assert book.process(10).killed and book.process(10).request == "r1"


def test_book_expiry():
    book = NodeBook(["n0", "n1", "n2"], kill_grace=2.0)
    assert book.next_expiry() is None
    book.assign("n0", _assign(end=10.0))
    book.assign("n1", _assign(nodes=("n1",), end=20.0))
    book.assign("n2", _assign(request="r3", nodes=("n2",)))  # no end
    book.started(10, "n0", "a1", "r1")
    assert book.next_expiry() == 12.0
    assert book.expire(11.9) == [] and book.expire(12.0) == []
    # a new assignment before the grace ran out: the old end no longer counts
    book.assign("n0", _assign(request="r2", previous="r1", end=30.0))
    assert book.next_expiry() == 22.0
    [ex] = book.expire(25.0)
    assert (ex.node, ex.request, ex.pids) == ("n1", "r1", ())
    [ex] = book.expire(32.5)
    assert (ex.node, ex.request, ex.pids) == ("n0", "r2", (10,)) and book.process(10).killed
    assert book.assignment("n0") is None and book.assignment("n2") is not None
    assert book.next_expiry() is None


# ================================================================================================
# live: real nats-server, real processes
# ================================================================================================
class Inbox:
    """Every message on ``subject`` (wildcards allowed), decoded, in arrival order."""

    def __init__(self, model: type[BaseModel]) -> None:
        self.model = model
        self.queue: asyncio.Queue = asyncio.Queue()

    async def subscribe(self, nc, subject: str) -> Inbox:
        async def cb(msg):
            self.queue.put_nowait((msg.subject, msg.data))

        self.sub = await nc.subscribe(subject, cb=cb)
        return self

    async def get(self, timeout: float = WAIT):
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def until(self, pred: Callable[[BaseModel], bool], timeout: float = WAIT) -> BaseModel:
        async def loop():
            while True:
                _, data = await self.queue.get()
                m = decode(data, self.model)
                if pred(m):
                    return m

        return await asyncio.wait_for(loop(), timeout)


class FakeAllocator:
    """Answers AGENT_REGISTER with Ack and keeps what it got."""

    def __init__(self) -> None:
        self.registrations: asyncio.Queue[AgentRegister] = asyncio.Queue()
        self.assignments: list[NodeAssign] = []  # what it answers: the nodes' current assignments

    async def handle(self, msg: AgentRegister, raw) -> AgentRegistered:
        self.registrations.put_nowait(msg)
        return AgentRegistered(assignments=self.assignments)


@pytest.fixture
async def nc(nats_url):
    """The allocator, the launcher and the observer at once (each part as the identity that may play it)."""
    c = await Roles(Settings(nats_url=nats_url)).connect()
    yield c
    await c.drain()


async def app_events(nc, app: str) -> Inbox:
    """The application's processes' output and exits, in the order the agent sent them."""
    events = Inbox(BaseModel)
    await events.subscribe(nc, subjects.app_output_any(app))
    await events.subscribe(nc, subjects.app_exited(app))
    return events


@pytest.fixture
async def allocator(nc):
    fake = FakeAllocator()
    await serve(nc, subjects.AGENT_REGISTER, AgentRegister, fake.handle)
    await bus.settled(nc)
    return fake


@pytest.fixture
def prefix():
    return f"t{uuid.uuid4().hex[:8]}"  # node names unique to the test: no crosstalk on the shared server


@pytest.fixture(params=[True, False], ids=["spawner", "fork"])
async def make_agent(request, nats_url, allocator, prefix, tmp_path):
    """Agents that fork their launches from their spawner, or (COORM_AGENT_SPAWNER=0) themselves: every test
    holds for both."""
    agents: list[Agent] = []

    async def make(nodes=("n0", "n1"), subreaper=True, **settings) -> Agent:
        s = Settings(nats_url=nats_url, **{"agent_heartbeat": 0.2, "kill_grace": 0.3, "agent_spawner": request.param,
                                           "agent_state_dir": tmp_path / "agents", **settings})
        infos = host_node_info([f"{prefix}{n}" for n in nodes], cores=2, memory_mb=1024)
        agent = Agent(s, f"agent-{prefix}-{len(agents)}", "c0", infos, subreaper=subreaper)
        agents.append(agent)
        await asyncio.wait_for(agent.start(), WAIT)
        return agent

    yield make
    for a in agents:
        await asyncio.wait_for(a.stop(), WAIT)


@pytest.fixture
async def agent(make_agent):
    return await make_agent()


def node(agent: Agent, i: int = 0) -> str:
    return agent.book.nodes[i]


async def assign(nc, node_id: str, *, app=A1, request="r1", nodes=None, end=None, previous=None) -> None:
    msg = NodeAssign(app=app, request=request, nodes=nodes or [node_id], token_sha256=TOKEN_SHA, end=end,
                     previous=previous)
    assert isinstance(await call(nc, subjects.node_assign(node_id), msg, Ack, timeout=WAIT), Ack)


async def launch(nc, node_id: str, argv: list[str], *, app=A1, request="r1", token=TOKEN, **kw) -> int:
    msg = LaunchMsg(token=token, app=app, request=request, argv=argv, **kw)
    reply = await call(nc, subjects.node_launch(node_id, ME), msg, LaunchReply, timeout=WAIT)
    [pid] = reply.pids
    return pid


async def kill(nc, node_id: str, request="r1", grace=0.3) -> list[int]:
    reply = await call(nc, subjects.node_kill(node_id), KillMsg(request=request, grace=grace), KillReply,
                       timeout=WAIT)
    return reply.killed


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_registers_and_registers_again_on_hello(nc, allocator, make_agent):
    a = await make_agent(nodes=("n0", "n1", "n2"))
    reg = await asyncio.wait_for(allocator.registrations.get(), WAIT)
    assert reg.agent == a.agent_id and reg.cluster == "c0"
    assert [n.id for n in reg.nodes] == list(a.book.nodes)
    assert reg.nodes[0].cores == 2 and reg.nodes[0].memory_mb == 1024
    await nc.publish(subjects.AGENT_HELLO, b"{}")
    again = await asyncio.wait_for(allocator.registrations.get(), WAIT)
    assert again == reg
    await asyncio.wait_for(a.registered.wait(), WAIT)
    assert a.registrations == 2


async def test_registration_retries_until_an_allocator_answers(nats_url, prefix):
    other = await connect(nats_url, "late-allocator", Settings().identity(Role.SERVICE))
    s = Settings(nats_url=nats_url, agent_heartbeat=0.2, kill_grace=0.3)
    agent = Agent(s, f"agent-{prefix}", "c0", host_node_info([f"{prefix}n0"], cores=1, memory_mb=1))
    starting = asyncio.create_task(agent.start())
    try:
        hb = await Inbox(AgentHeartbeat).subscribe(other, subjects.AGENT_HEARTBEAT)
        # the agent runs (heartbeats) but start() waits: nobody answers its registration yet
        await hb.until(lambda m: m.agent == agent.agent_id)
        assert not starting.done()
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        async def answer(msg: AgentRegister, raw) -> AgentRegistered:
            if msg.agent == agent.agent_id and not got.done():
                got.set_result(msg)
            return AgentRegistered()

        await serve(other, subjects.AGENT_REGISTER, AgentRegister, answer)
        await asyncio.wait_for(starting, WAIT)
        assert (await got).nodes[0].id == f"{prefix}n0"
    finally:
        await agent.stop()
        await other.drain()


async def test_heartbeats_carry_nodes_and_process_count(nc, agent):
    hb = await Inbox(AgentHeartbeat).subscribe(nc, subjects.AGENT_HEARTBEAT)
    first = await hb.until(lambda m: m.agent == agent.agent_id)
    assert first.nodes == list(agent.book.nodes) and first.processes == 0
    n = node(agent)
    await assign(nc, n)
    pid = await launch(nc, n, ["sleep", "1000"])
    busy = await hb.until(lambda m: m.agent == agent.agent_id and m.processes == 1)
    assert busy.nodes == list(agent.book.nodes)
    assert await kill(nc, n) == [pid]
    await hb.until(lambda m: m.agent == agent.agent_id and m.processes == 0)


async def test_launch_runs_the_owners_command_with_output_and_exit_code(nc, agent):
    n0, n1 = node(agent, 0), node(agent, 1)
    events = await app_events(nc, A1)
    agent_exited = await Inbox(ProcessExited).subscribe(nc, EXITS)
    await assign(nc, n0, nodes=[n0, n1, "elsewhere7"])
    script = 'echo "$COORM_NODE $COORM_NODES $COORM_REQUEST $COORM_APP $EXTRA"; echo oops >&2; exit 3'
    pid = await launch(nc, n0, ["sh", "-c", script], env={"EXTRA": "x1"})
    out: dict[str, str] = {"stdout": "", "stderr": ""}
    while True:
        subject, data = await events.get()
        if subject == subjects.app_exited(A1):
            exited = decode(data, ProcessExited)
            break
        assert subject == subjects.app_output(A1, "r1")
        o = decode(data, ProcessOutput)
        assert (o.node, o.request, o.pid) == (n0, "r1", pid)
        out[o.stream] += o.data
    # the output came before the exit, all of it
    assert out == {"stdout": f"{n0} {n0},{n1},elsewhere7 r1 {A1} x1\n", "stderr": "oops\n"}
    assert exited == ProcessExited(node=n0, app=A1, request="r1", pid=pid, code=3, killed=False)
    assert await agent_exited.until(lambda m: m.pid == pid) == exited
    assert agent.process_count == 0


async def test_launch_in_cwd_and_long_output(nc, agent, tmp_path):
    n = node(agent)
    events = await app_events(nc, A1)
    await assign(nc, n)
    pid = await launch(nc, n, ["sh", "-c", "pwd; head -c 200000 /dev/zero | tr '\\0' x; printf tail"],
                       cwd=str(tmp_path))
    text = ""
    while True:
        subject, data = await events.get()
        if subject == subjects.app_exited(A1):
            assert decode(data, ProcessExited).code == 0
            break
        text += decode(data, ProcessOutput).data
    assert text == f"{tmp_path}\n" + "x" * 200000 + "tail"
    assert pid > 0


async def _refused(nc, node_id: str, data: bytes) -> ErrorReply:
    msg = await nc.request(subjects.node_launch(node_id, ME), data, timeout=WAIT)
    return ErrorReply.model_validate_json(msg.data)


async def test_launch_refusals_start_nothing(nc, agent, tmp_path):
    n0, n1 = node(agent, 0), node(agent, 1)
    await assign(nc, n0)
    marker = tmp_path / "started"
    argv = ["sh", "-c", f"touch {marker}"]
    not_executable = tmp_path / "data.txt"
    not_executable.write_text("not a program\n")

    def launch_msg(**kw) -> bytes:
        return encode(LaunchMsg(**{"token": TOKEN, "app": A1, "request": "r1", "argv": argv, **kw}))

    cases = [
        (n0, launch_msg(app=A2), ErrorCode.NOT_OWNER, f"not allocated to request r1 of {A2}"),
        (n0, launch_msg(request="r2"), ErrorCode.NOT_OWNER, "not allocated to request r2"),
        (n0, launch_msg(token="not-the-token"), ErrorCode.BAD_TOKEN, "token"),
        (n1, launch_msg(), ErrorCode.NOT_OWNER, "not allocated to any request"),
        (n0, b"{not json", ErrorCode.BAD_MESSAGE, "not JSON"),
        (n0, json.dumps({"token": TOKEN, "app": A1, "request": "r1", "argv": []}).encode(),
         ErrorCode.BAD_MESSAGE, "argv"),
        # a shell's 127 and 126: the launcher fails the job at once
        (n0, launch_msg(argv=["/nonexistent/prog-xyz"]), ErrorCode.COMMAND_NOT_FOUND, "prog-xyz: command not found"),
        (n0, launch_msg(argv=["nonexistent_cmd_xyz"]), ErrorCode.COMMAND_NOT_FOUND, "nonexistent_cmd_xyz"),
        (n0, launch_msg(argv=[str(not_executable)]), ErrorCode.NOT_EXECUTABLE, "cannot execute"),
        (n0, launch_msg(cwd=str(tmp_path / "missing-dir")), ErrorCode.BAD_CWD, "missing-dir"),
    ]
    for node_id, data, code, words in cases:
        reply = await _refused(nc, node_id, data)
        assert reply.error.code is code, (data, reply)
        assert words in reply.error.message, reply.error.message
    assert agent.process_count == 0 and not marker.exists()
    with pytest.raises(WireError) as e:  # the helper the launchers use says the same
        await launch(nc, n0, argv, app=A2)
    assert e.value.code is ErrorCode.NOT_OWNER


async def test_launch_after_the_end_is_refused(nc, make_agent):
    agent = await make_agent(kill_grace=30)
    n = node(agent)
    await assign(nc, n, end=time.time() - 0.01)  # already over (the kill_grace has not run out yet)
    reply = await _refused(nc, n, encode(LaunchMsg(token=TOKEN, app=A1, request="r1", argv=["true"])))
    assert reply.error.code is ErrorCode.NOT_OWNER and "ended" in reply.error.message


async def test_a_published_assignment_is_in_force_for_the_next_launch(nc, agent):
    """No reply asked for: the agent handles a node's messages in the order the server got them. The
    allocator publishes the assignment, then tells the application (startNotify); the application launches
    once told: the launch reaches the agent after the assignment, though it comes on another connection."""
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A3))
    starts = await Inbox(StartNotify).subscribe(nc, subjects.notify_start(A3))
    kills = await Inbox(KillNotify).subscribe(nc, subjects.notify_kill(A3))
    await bus.settled(nc)
    msg = NodeAssign(app=A3, request="r1", nodes=[n], token_sha256=TOKEN_SHA)
    await nc.publish(subjects.node_assign(n), encode(msg))
    await nc.publish(subjects.notify_start(A3), encode(StartNotify(app=A3, request="r1", cluster="c0", nodes=[n])))
    await starts.get()
    pid = await launch(nc, n, ["true"], app=A3)
    assert (await exited.until(lambda m: m.pid == pid)).code == 0
    # and a kill takes effect at once for what follows, while it waits for the deaths
    pid = await launch(nc, n, ["sh", "-c", 'trap "" TERM; sleep 1000'], app=A3)
    inbox = nc.new_inbox()
    kill_replies = await Inbox(KillReply).subscribe(nc, inbox)
    await nc.publish(subjects.node_kill(n), encode(KillMsg(request="r1", grace=1.0)), reply=inbox)
    await nc.publish(subjects.notify_kill(A3), encode(KillNotify(app=A3, request="r1", reason=EndReason.DONE)))
    await kills.get()
    reply = await _refused(nc, n, encode(LaunchMsg(token=TOKEN, app=A3, request="r1", argv=["true"])))
    assert reply.error.code is ErrorCode.NOT_OWNER
    assert kill_replies.queue.empty()  # the process ignores TERM: the kill still waits for the grace
    _, data = await kill_replies.get()
    assert decode(data, KillReply).killed == [pid] and group_gone(pid)


async def test_assign_to_a_node_not_in_the_message_is_refused(nc, agent):
    msg = NodeAssign(app=A1, request="r1", nodes=["other"], token_sha256=TOKEN_SHA)
    with pytest.raises(WireError) as e:
        await call(nc, subjects.node_assign(node(agent)), msg, Ack, timeout=WAIT)
    assert e.value.code is ErrorCode.BAD_REQUEST
    assert agent.book.assignment(node(agent)) is None


async def test_kill_stops_a_process_and_forgets_the_assignment(nc, agent):
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A1))
    await assign(nc, n)
    pid = await launch(nc, n, ["sleep", "1000"])
    assert not group_gone(pid)
    assert await kill(nc, n, grace=5.0) == [pid]  # replies once it is dead
    assert group_gone(pid)
    ev = await exited.until(lambda m: m.pid == pid)
    assert ev.killed and ev.code == -15 and ev.request == "r1"
    assert agent.process_count == 0 and agent.book.assignment(n) is None
    reply = await _refused(nc, n, encode(LaunchMsg(token=TOKEN, app=A1, request="r1", argv=["true"])))
    assert reply.error.code is ErrorCode.NOT_OWNER
    assert await kill(nc, n) == []  # nothing left there


async def test_kill_uses_kill_after_grace_when_term_is_ignored(nc, agent):
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A1))
    output = await Inbox(ProcessOutput).subscribe(nc, subjects.app_output(A1, "r1"))
    await assign(nc, n)
    pid = await launch(nc, n, ["sh", "-c", 'trap "" TERM; echo ready; sleep 1000; echo never'])
    await output.until(lambda m: m.data == "ready\n")  # the trap is set
    t0 = time.monotonic()
    assert await kill(nc, n, grace=0.3) == [pid]
    assert time.monotonic() - t0 >= 0.3
    assert group_gone(pid)  # the shell and its sleep
    ev = await exited.until(lambda m: m.pid == pid)
    assert ev.killed and ev.code == -9


async def test_kill_waits_for_children_that_outlive_a_leader_dying_on_term(nc, agent):
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A1))
    output = await Inbox(ProcessOutput).subscribe(nc, subjects.app_output(A1, "r1"))
    await assign(nc, n)
    # the leader dies on TERM, its background child ignores TERM: KILLed at the end of the grace
    script = '(trap "" TERM; echo child; sleep 1000) & wait'
    pid = await launch(nc, n, ["sh", "-c", script])
    await output.until(lambda m: m.data == "child\n")
    assert await kill(nc, n, grace=0.3) == [pid]
    assert group_gone(pid)
    ev = await exited.until(lambda m: m.pid == pid)
    assert ev.killed and ev.code == -15


async def test_without_subreaper_a_kill_does_not_wait_for_init_to_reap_zombies(nc, make_agent):
    agent = await make_agent(subreaper=False)
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A1))
    output = await Inbox(ProcessOutput).subscribe(nc, subjects.app_output(A1, "r1"))
    await assign(nc, n)
    pid = await launch(nc, n, ["sh", "-c", '(trap "" TERM; echo child; sleep 1000) & wait'])
    await output.until(lambda m: m.data == "child\n")
    t0 = time.monotonic()
    assert await kill(nc, n, grace=0.2) == [pid]  # the orphaned sleep is dead: a zombie of init at most
    assert time.monotonic() - t0 < 1.0
    assert (await exited.until(lambda m: m.pid == pid)).killed


async def test_what_a_leader_leaves_behind_in_its_group_is_killed(nc, agent):
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A1))
    await assign(nc, n)
    pid = await launch(nc, n, ["sh", "-c", "sleep 1000 & echo started"])
    ev = await exited.until(lambda m: m.pid == pid)
    assert ev.code == 0 and not ev.killed
    assert group_gone(pid)


async def test_next_handover_keeps_processes_running_under_the_new_request(nc, agent):
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A1))
    out_r2 = await Inbox(ProcessOutput).subscribe(nc, subjects.app_output(A1, "r2"))
    await assign(nc, n, end=time.time() + 60)
    pid = await launch(nc, n, ["sh", "-c", "while :; do echo tick; sleep 0.05; done"])
    await assign(nc, n, request="r2", previous="r1", end=time.time() + 60)
    # the allocator ends r1: the node is r2's now, nothing of r1 remains there
    assert await kill(nc, n, request="r1") == []
    assert not group_gone(pid) and agent.process_count == 1
    got = await out_r2.until(lambda m: m.pid == pid)  # its output now goes to r2
    assert got.request == "r2"
    # and only r2's owner may launch there now
    reply = await _refused(nc, n, encode(LaunchMsg(token=TOKEN, app=A1, request="r1", argv=["true"])))
    assert reply.error.code is ErrorCode.NOT_OWNER
    assert await kill(nc, n, request="r2", grace=5.0) == [pid]
    ev = await exited.until(lambda m: m.pid == pid)
    assert ev.request == "r2" and ev.killed


async def test_a_new_owner_ends_the_old_owners_processes(nc, agent):
    n = node(agent)
    exited = await Inbox(ProcessExited).subscribe(nc, EXITS)
    await assign(nc, n)
    pid = await launch(nc, n, ["sleep", "1000"])
    await assign(nc, n, app=A2, request="q1")
    ev = await exited.until(lambda m: m.pid == pid)
    assert (ev.app, ev.request, ev.killed) == (A1, "r1", True)
    assert group_gone(pid)
    assert await launch(nc, n, ["true"], app=A2, request="q1") > 0


async def test_self_kill_when_the_end_passed_without_word(nc, make_agent):
    agent = await make_agent(kill_grace=0.2)
    n0, n1 = node(agent, 0), node(agent, 1)
    exited = await Inbox(ProcessExited).subscribe(nc, subjects.app_exited(A1))
    t_end = time.time() + 0.5
    await assign(nc, n0, end=t_end)
    await assign(nc, n1, request="r9")  # no end: left alone
    pid = await launch(nc, n0, ["sh", "-c", 'trap "" TERM; sleep 1000'])
    other = await launch(nc, n1, ["sleep", "1000"], request="r9")
    ev = await exited.until(lambda m: m.pid == pid)
    assert ev.killed and ev.code == -9 and ev.request == "r1"
    assert time.time() >= t_end + 0.2  # not before the end plus the grace
    assert group_gone(pid)
    assert agent.book.assignment(n0) is None and agent.book.assignment(n1) is not None
    assert not group_gone(other) and agent.process_count == 1


async def test_stop_kills_everything_and_reports_it(nc, make_agent):
    agent = await make_agent()
    n0, n1 = node(agent, 0), node(agent, 1)
    exited = await Inbox(ProcessExited).subscribe(nc, EXITS)
    await assign(nc, n0)
    await assign(nc, n1, app=A2, request="q1")
    pids = {await launch(nc, n0, ["sleep", "1000"]),
            await launch(nc, n1, ["sh", "-c", 'trap "" TERM; sleep 1000'], app=A2, request="q1")}
    assert procs.is_child_subreaper()
    await asyncio.wait_for(agent.stop(), WAIT)
    assert not procs.is_child_subreaper()  # the process is as it was before the agent
    assert all(group_gone(p) for p in pids)
    seen = {(await exited.until(lambda m: m.pid in pids)).pid for _ in range(2)}
    assert seen == pids
    with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):  # nobody serves n0 now
        await nc.request(subjects.node_launch(n0, ME), b"{}", timeout=2)


async def test_the_agent_command_serves_until_sigterm(nats_url, nc, allocator, prefix, tmp_path):
    env = {**os.environ, "COORM_NATS_URL": nats_url, "COORM_KILL_GRACE": "0.3", "COORM_AGENT_HEARTBEAT": "0.2",
           "COORM_CONNECTION_FILE": str(tmp_path / "none.json")}
    code = (f"from coorm.node_agent.agent import main; main('c7', '{prefix}n0..{prefix}n2', agent_id=None, cores=3, "
            "memory_mb=None)")
    exited = await Inbox(ProcessExited).subscribe(nc, EXITS)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        reg = await asyncio.wait_for(allocator.registrations.get(), 20)
        assert reg.cluster == "c7" and reg.agent.startswith("c7@")
        assert [(n.id, n.cores, n.memory_mb) for n in reg.nodes] == [
            (f"{prefix}n{i}", 3, host_memory_mb()) for i in range(3)]
        n = f"{prefix}n2"
        await assign(nc, n)
        pid = await launch(nc, n, ["sleep", "1000"])
        proc.send_signal(signal.SIGTERM)
        ev = await exited.until(lambda m: m.pid == pid)
        assert ev.killed and ev.node == n
        assert await asyncio.wait_for(proc.wait(), WAIT) == 0
        assert group_gone(pid)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_the_agent_waits_for_its_children_without_a_thread_each(tmp_path):
    """``procs.use_pidfd_child_watcher`` (called by the agent command): exit codes still come back, and a
    running child costs no waiting thread (Python 3.11's default watcher starts one per child)."""
    code = """
import asyncio, sys, threading
from coorm.node_agent import procs

async def main():
    procs.use_pidfd_child_watcher()
    before = threading.active_count()
    sleepers = [await asyncio.create_subprocess_exec("sleep", "30") for _ in range(3)]
    during = threading.active_count()
    quick = await asyncio.create_subprocess_exec("sh", "-c", "exit 3")
    code = await quick.wait()
    for p in sleepers:
        p.kill()
    codes = [await p.wait() for p in sleepers]
    print(before, during, code, codes)

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    before, during, code, *killed = out.stdout.replace("[", " ").replace("]", " ").replace(",", " ").split()
    assert during == before, out.stdout
    assert int(code) == 3
    assert [int(k) for k in killed] == [-signal.SIGKILL] * 3


# ================================================================================================
# issue 11: true exit codes, containment, restarts
# ================================================================================================
def test_reaping_a_group_never_takes_a_launched_leaders_exit_status():
    """The subreaper's clean-up of a group (``procs.reap_group``) must leave a launched leader's status to
    asyncio's child watcher: taken by the clean-up, the watcher reported a made-up status (255) and the
    agent's fallback a SIGKILL (``exit status lost``) -- 2.4 % of exits in the chaos runs."""
    code = """
import asyncio, os, select
from coorm.node_agent import procs

async def main():
    procs.use_pidfd_child_watcher()
    p = await asyncio.create_subprocess_exec("sh", "-c", "read line; exit 3", stdin=asyncio.subprocess.PIPE,
                                             start_new_session=True)
    fd = os.pidfd_open(p.pid)  # (it waits for its line: alive)
    os.write(p.stdin.transport.get_extra_info("pipe").fileno(), b"go\\n")  # from here the loop does not run:
    select.select([fd], [], [], 30)  # it has exited (a zombie), and the watcher has not reaped it
    stolen = procs.reap_group(p.pid, keep={p.pid}) + (0 if procs.group_alive(p.pid, keep={p.pid}) else 0)
    print(stolen, await p.wait())

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["0", "3"], out.stdout + out.stderr


async def test_many_short_processes_each_report_their_own_exit_code(nc, make_agent):
    """Exit statuses are collected once, by the child watcher: no status is made up, however many processes
    end at once (with a 1 ms check, the former fallback reported 243 of 640 clean exits as SIGKILL)."""
    agent = await make_agent(nodes=tuple(f"n{i}" for i in range(16)))
    exited = await Inbox(ProcessExited).subscribe(nc, EXITS)
    want: dict[int, int] = {}
    for r in range(4):
        for i, n in enumerate(agent.book.nodes):
            await assign(nc, n, request=f"r{r}")
            code = (i * 7 + r) % 5
            want[await launch(nc, n, ["sh", "-c", f"exit {code}"], request=f"r{r}")] = code
        got: dict[int, tuple] = {}
        while len(got) < len(agent.book.nodes):
            ev = await exited.until(lambda m, seen=got: m.pid in want and m.pid not in seen)
            got[ev.pid] = (ev.code, ev.killed, ev.reason)
        assert got == {pid: (want[pid], False, None) for pid in got}


@pytest.mark.parametrize("contained", [True, False])
async def test_a_process_that_leaves_its_session_dies_with_its_allocation_in_a_cgroup(nc, make_agent, contained):
    """``setsid`` takes a process out of its launch's process group; its cgroup it cannot leave. Without
    cgroups (``agent_cgroups=False``, or a host that forbids them) it escapes, as the agent's log says."""
    agent = await make_agent(agent_cgroups=contained)
    if contained and agent.cgroups is None:
        pytest.skip(f"this host gives the agent no cgroups: {Cgroups.why_not}")
    n0 = node(agent)
    await assign(nc, n0)
    out = await Inbox(ProcessOutput).subscribe(nc, subjects.app_output_any(A1))
    escape = "import os, time; os.setsid(); print(os.getpid(), flush=True); time.sleep(1000)"
    await launch(nc, n0, ["sh", "-c", f"{sys.executable} -c '{escape}' & sleep 1000"])
    escapee = int((await out.until(lambda m: m.data.strip().isdigit())).data)
    try:
        assert os.getsid(escapee) == escapee  # it left the launch's session
        await kill(nc, n0)
        alive = _state(escapee) not in ("Z", "gone")  # (a zombie runs nothing)
        assert alive is not contained
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(escapee, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0].decode()
    except OSError:
        return "gone"


async def test_every_kill_says_why(nc, make_agent):
    """A killed process's exit carries the reason: the RMS's (``walltime``...), or the agent's own
    (``allocation_ended``, ``reassigned``, ``agent_stopping``)."""
    agent = await make_agent(nodes=("n0", "n1", "n2", "n3"))
    n0, n1, n2, n3 = agent.book.nodes
    exited = await Inbox(ProcessExited).subscribe(nc, EXITS)
    for n in (n0, n1, n3):
        await assign(nc, n)
    await assign(nc, n2, end=time.time() + 0.5)
    by_rms = await launch(nc, n0, ["sleep", "1000"])
    replaced = await launch(nc, n1, ["sleep", "1000"])
    expired = await launch(nc, n2, ["sleep", "1000"])
    stopped = await launch(nc, n3, ["sleep", "1000"])
    await call(nc, subjects.node_kill(n0), KillMsg(request="r1", grace=0.3, reason="walltime"), KillReply,
               timeout=WAIT)
    await assign(nc, n1, app=A2, request="q1")
    reasons = {}
    for pid in (by_rms, replaced, expired):
        ev = await exited.until(lambda m, pid=pid: m.pid == pid)
        reasons[pid] = (ev.killed, ev.reason)
    await agent.stop()
    ev = await exited.until(lambda m: m.pid == stopped)
    reasons[stopped] = (ev.killed, ev.reason)
    assert reasons == {by_rms: (True, "walltime"), replaced: (True, "reassigned"),
                       expired: (True, "allocation_ended"), stopped: (True, "agent_stopping")}


async def test_registration_gives_the_agent_its_nodes_assignments_and_ends_stale_ones(nc, allocator, make_agent,
                                                                                      prefix):
    """The allocator's answer to a registration is the truth about each node: a restarted agent may let the
    owner launch without a new assignment message; an agent that was cut off (asked to register again) kills
    the processes of allocations that ended meanwhile."""
    n0 = f"{prefix}n0"
    allocator.assignments = [NodeAssign(app=A1, request="r1", nodes=[n0], token_sha256=TOKEN_SHA, end=None)]
    agent = await make_agent()
    exited = await Inbox(ProcessExited).subscribe(nc, EXITS)
    pid = await launch(nc, n0, ["sleep", "1000"])  # no NodeAssign was sent: the reply said so
    allocator.assignments = []
    agent.registered.clear()
    await nc.publish(subjects.AGENT_HELLO, b"{}")
    ev = await exited.until(lambda m: m.pid == pid)
    assert ev.killed and ev.reason == "allocation_ended" and group_gone(pid)
    with pytest.raises(WireError) as e:
        await launch(nc, n0, ["true"])
    assert e.value.code is ErrorCode.NOT_OWNER


async def test_a_restarted_agent_kills_and_reports_what_its_killed_predecessor_left(nats_url, nc, allocator,
                                                                                    prefix, tmp_path):
    """SIGKILL an agent: its processes run on, unsupervised. Its successor (same id, same state directory)
    kills them and tells their applications (``agent_restarted``, SIGKILL); launches work again."""
    env = {**os.environ, "COORM_NATS_URL": nats_url, "COORM_KILL_GRACE": "0.3", "COORM_AGENT_HEARTBEAT": "0.2",
           "COORM_CONNECTION_FILE": str(tmp_path / "none.json"), "COORM_AGENT_STATE_DIR": str(tmp_path / "state")}
    n0 = f"{prefix}n0"
    allocator.assignments = [NodeAssign(app=A1, request="r1", nodes=[n0], token_sha256=TOKEN_SHA, end=None)]
    code = (f"from coorm.node_agent.agent import main; main('c7', '{prefix}n0..{prefix}n1', agent_id='ag-{prefix}', "
            "cores=1, memory_mb=64)")
    exited = await Inbox(ProcessExited).subscribe(nc, EXITS)

    async def start_agent():
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, env=env,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)
        await asyncio.wait_for(allocator.registrations.get(), 20)
        return proc

    async def launch_once_registered(argv: list[str]) -> int:
        # the registration's answer is applied in the agent's process just after it is sent: nothing here
        # can wait on that, so the launch is retried (with a deadline) until the agent has it
        deadline = time.monotonic() + WAIT
        while True:
            try:
                return await launch(nc, n0, argv)
            except WireError as e:
                if e.code is not ErrorCode.NOT_OWNER or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    first = await start_agent()
    second = None
    try:
        pid = await launch_once_registered(["sleep", "1000"])
        first.kill()
        await first.wait()
        assert not group_gone(pid)  # orphaned, running unsupervised
        second = await start_agent()
        ev = await exited.until(lambda m: m.pid == pid)
        assert (ev.killed, ev.reason, ev.code, ev.app, ev.request) == (True, "agent_restarted", -signal.SIGKILL,
                                                                       A1, "r1")
        assert procs.start_time(pid) is None or _state(pid) == "Z"
        again = await launch_once_registered(["sh", "-c", "exit 4"])
        assert (await exited.until(lambda m: m.pid == again)).code == 4
    finally:
        for p in (first, second):
            if p is not None and p.returncode is None:
                p.terminate()
                await p.wait()


async def test_a_launch_before_the_registration_is_answered_waits_for_it(nats_url, prefix, tmp_path):
    """A restarted agent serves its nodes' subjects before the allocator's answer tells it whom they belong
    to: a launch arriving in between waits for that answer instead of being refused (in a 300-application
    chaos run, three jobs failed that way when their agent was restarted)."""
    other = await connect(nats_url, "slow-allocator", Settings().identity(Role.SERVICE))
    gate = asyncio.Event()
    n0 = f"{prefix}n0"

    async def answer(msg: AgentRegister, raw) -> AgentRegistered:
        await gate.wait()  # the allocator is busy: its answer comes late
        return AgentRegistered(assignments=[NodeAssign(app=A1, request="r1", nodes=[n0], token_sha256=TOKEN_SHA)])

    await serve(other, subjects.AGENT_REGISTER, AgentRegister, answer)
    s = Settings(nats_url=nats_url, agent_heartbeat=0.2, kill_grace=0.3, agent_state_dir=tmp_path / "state")
    agent = Agent(s, f"agent-{prefix}", "c0", host_node_info([n0], cores=1, memory_mb=1))
    starting = asyncio.create_task(agent.start())
    nc = await Roles(Settings(nats_url=nats_url)).connect()
    try:
        hb = await Inbox(AgentHeartbeat).subscribe(nc, subjects.AGENT_HEARTBEAT)
        await hb.until(lambda m: m.agent == agent.agent_id)  # it serves its nodes; not registered yet
        early = asyncio.create_task(launch(nc, n0, ["sh", "-c", "exit 0"]))
        await asyncio.sleep(0.3)  # the launch is in the agent's hands, waiting (nothing to wait on from here)
        assert not early.done()
        gate.set()
        assert await asyncio.wait_for(early, WAIT) > 0
        await asyncio.wait_for(starting, WAIT)
    finally:
        await agent.stop()
        await nc.drain()
        await other.drain()


async def test_a_launch_sent_again_with_its_id_is_not_started_twice(nc, agent):
    """A launcher whose launch timed out sends it again with the same ``launch_id``: the agent answers with
    the pids it started the first time."""
    n0 = node(agent)
    await assign(nc, n0)
    first = await launch(nc, n0, ["sleep", "1000"], launch_id="l-1")
    again = await launch(nc, n0, ["sleep", "1000"], launch_id="l-1")
    other = await launch(nc, n0, ["sleep", "1000"], launch_id="l-2")
    assert again == first and other != first and agent.process_count == 2
    await kill(nc, n0)


# ================================================================================================
# output files (a batch job's -o/-e): written by the process's user, not published
# ================================================================================================
async def _until_exit(events: Inbox, app: str = A1) -> tuple[list[ProcessOutput], ProcessExited]:
    """What the application's processes published, up to the first exit (the output comes before it)."""
    outputs = []
    while True:
        subject, data = await events.get()
        if subject == subjects.app_exited(app):
            return outputs, decode(data, ProcessExited)
        outputs.append(decode(data, ProcessOutput))


async def test_output_to_a_file_is_written_there_and_not_published(nc, agent, tmp_path):
    n = node(agent)
    events = await app_events(nc, A1)
    await assign(nc, n)
    out = tmp_path / "out.txt"
    pid = await launch(nc, n, ["sh", "-c", "echo hi; echo err >&2"], stdout=str(out))
    outputs, exited = await _until_exit(events)
    assert outputs == [] and (exited.pid, exited.code, exited.killed) == (pid, 0, False)
    assert out.read_text() == "hi\nerr\n"  # stderr with stdout, as sbatch's default
    assert agent.process_count == 0


async def test_stderr_to_its_own_file_or_stdout_alone_published(nc, agent, tmp_path):
    n = node(agent)
    events = await app_events(nc, A1)
    await assign(nc, n)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    await launch(nc, n, ["sh", "-c", "echo hi; echo err >&2; exit 4"], stdout=str(out), stderr=str(err))
    outputs, exited = await _until_exit(events)
    assert outputs == [] and exited.code == 4
    assert (out.read_text(), err.read_text()) == ("hi\n", "err\n")
    # stderr to a file, stdout published as ever
    err2 = tmp_path / "err2.txt"
    pid = await launch(nc, n, ["sh", "-c", "echo hi; echo err >&2"], stderr=str(err2))
    outputs, exited = await _until_exit(events)
    assert [(o.pid, o.stream, o.data) for o in outputs] == [(pid, "stdout", "hi\n")] and exited.code == 0
    assert err2.read_text() == "err\n"


async def test_append_keeps_what_the_file_held_and_truncate_does_not(nc, agent, tmp_path):
    n0, n1 = node(agent, 0), node(agent, 1)
    events = await app_events(nc, A1)
    await assign(nc, n0, nodes=[n0, n1])
    await assign(nc, n1, nodes=[n0, n1])
    out = tmp_path / "job.out"
    out.write_text("earlier\n")
    await launch(nc, n0, ["sh", "-c", 'echo "$COORM_NODE"'], stdout=str(out))  # append: the default
    await _until_exit(events)
    await launch(nc, n1, ["sh", "-c", 'echo "$COORM_NODE"'], stdout=str(out), open_mode="append")
    await _until_exit(events)
    assert out.read_text() == f"earlier\n{n0}\n{n1}\n"
    # one job's processes on two nodes appending to one file at once: whole lines, none lost
    script = 'i=0; while [ $i -lt 200 ]; do echo "$COORM_NODE $i"; i=$((i+1)); done'
    for n in (n0, n1):
        await launch(nc, n, ["sh", "-c", script], stdout=str(out))
    await _until_exit(events)
    await _until_exit(events)
    lines = out.read_text().splitlines()[3:]
    assert sorted(lines) == sorted(f"{n} {i}" for n in (n0, n1) for i in range(200))
    await launch(nc, n0, ["sh", "-c", "echo again"], stdout=str(out), open_mode="truncate")
    await _until_exit(events)
    assert out.read_text() == "again\n"


async def test_an_output_path_that_is_not_absolute_is_refused(nc, agent, tmp_path):
    n = node(agent)
    await assign(nc, n)
    marker = tmp_path / "started"
    for field, path in (("stdout", "out.txt"), ("stderr", "../err.txt"), ("stdout", "/tmp/a\x00b"),
                        ("stdout", "/" + "x" * 4096)):
        raw = {"token": TOKEN, "app": A1, "request": "r1", "argv": ["touch", str(marker)], field: path}
        reply = await _refused(nc, n, json.dumps(raw).encode())
        assert reply.error.code is ErrorCode.BAD_MESSAGE and field in reply.error.message, reply.error.message
        with pytest.raises(ValueError):  # the launcher's own model refuses it before sending
            LaunchMsg(token=TOKEN, app=A1, request="r1", argv=["true"], **{field: path})
    reply = await _refused(nc, n, json.dumps({"token": TOKEN, "app": A1, "request": "r1", "argv": ["true"],
                                              "stdout": "/tmp/x", "open_mode": "overwrite"}).encode())
    assert reply.error.code is ErrorCode.BAD_MESSAGE and "open_mode" in reply.error.message
    assert agent.process_count == 0 and not marker.exists()


OTHER = "nobody"  # a user other than the test's (root): the agent runs its processes as that user


@pytest.fixture(scope="module")
def other_identity(servers):
    """``nobody``'s NATS credentials, added to the servers' store (an agent launches for the subject's user,
    which only that user may publish on)."""
    store = CredentialStore(servers.credentials)
    ident = store.add_user(OTHER)
    assert store.reload_nats(), "nats-server did not write its pid file"
    asyncio.run(_until_admitted(servers.nats_url, ident))  # the reload is asynchronous
    return ident


@pytest.mark.skipif(os.geteuid() != 0, reason="launching as another user needs a root agent")
async def test_an_output_file_the_user_may_not_write_refuses_the_launch(nc, agent, nats_url, other_identity):
    """The agent is root and could write anywhere: the file is opened by the child once it is the user, so a
    user cannot have the agent write (or truncate) what the user may not -- a root-owned directory, a
    root-owned file, another file through a symbolic link."""
    n = node(agent)
    app = subjects.app_id(OTHER, 1)
    other = await connect(nats_url, "test-other-user", other_identity)
    top = Path(tempfile.mkdtemp(dir="/tmp", prefix="coorm-output-"))  # (pytest's tmp_path is closed to others)
    try:
        top.chmod(0o711)
        closed = top / "closed"
        closed.mkdir(mode=0o700)  # root's
        precious = top / "precious"
        precious.write_text("root's\n")
        precious.chmod(0o644)
        home = top / "home"
        home.mkdir(mode=0o755)
        pw = pwd.getpwnam(OTHER)
        uid, gid = pw.pw_uid, pw.pw_gid
        os.chown(home, uid, gid)
        (home / "link").symlink_to(precious)
        os.lchown(home / "link", uid, gid)
        marker = home / "started"
        events = Inbox(BaseModel)
        await events.subscribe(other, subjects.app_output_any(app))
        await events.subscribe(other, subjects.app_exited(app))
        await assign(nc, n, app=app)

        async def launch_as_other(**kw) -> LaunchReply | ErrorReply:
            msg = LaunchMsg(**{"token": TOKEN, "app": app, "request": "r1", "argv": ["touch", str(marker)], **kw})
            raw = await other.request(subjects.node_launch(n, OTHER), encode(msg), timeout=WAIT)
            reply = json.loads(raw.data)
            return ErrorReply.model_validate(reply) if "error" in reply else LaunchReply.model_validate(reply)

        for kw in ({"stdout": str(closed / "out.txt")}, {"stdout": str(precious), "open_mode": "truncate"},
                   {"stdout": str(home / "link")}, {"stdout": str(home / "fine.txt"), "stderr": str(closed / "e")},
                   {"stdout": str(top / "missing" / "out.txt")}):
            reply = await launch_as_other(**kw)
            assert isinstance(reply, ErrorReply), kw
            bad = kw.get("stderr", kw["stdout"])
            reason = "No such file or directory" if "missing" in bad else "Permission denied"
            assert reply.error.code is ErrorCode.BAD_OUTPUT, reply
            assert reply.error.message == f"{OTHER} cannot write the output to {bad}: {reason}", reply.error.message
        assert agent.process_count == 0 and not marker.exists() and events.queue.empty()
        assert precious.read_text() == "root's\n" and not (closed / "out.txt").exists()
        # the user's own directory: the file is the user's
        ok = await launch_as_other(stdout=str(home / "out.txt"), argv=["sh", "-c", f"touch {marker}; id -un"])
        assert isinstance(ok, LaunchReply)
        outputs, exited = await _until_exit(events, app)
        assert outputs == [] and exited.code == 0 and marker.exists()
        assert (home / "out.txt").read_text() == f"{OTHER}\n"
        assert (home / "out.txt").stat().st_uid == uid
    finally:
        await other.drain()
        shutil.rmtree(top)


async def test_a_spawner_killed_while_its_launches_run_loses_no_exit_code(nc, make_agent, tmp_path):
    """SIGKILL the agent's spawner (by pid) while a launch runs: the agent, their subreaper, waits for it
    itself -- its exit code is still the process's own -- and the next launch starts a new spawner."""
    a = await make_agent(agent_spawner=True)
    n = node(a)
    await assign(nc, n)
    events = await app_events(nc, A1)
    gate = tmp_path / "gate"
    await launch(nc, n, ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; exit 7"])
    spawner = a._spawner
    assert spawner is not None and not spawner.dead
    os.kill(spawner.proc.pid, signal.SIGKILL)
    await wait_until(lambda: spawner.dead, what="the agent to see its spawner die")
    gate.touch()
    _, exited = await _until_exit(events)
    assert (exited.code, exited.killed) == (7, False)
    await launch(nc, n, ["sh", "-c", "exit 3"])
    _, exited = await _until_exit(events)
    assert exited.code == 3
    assert a._spawner is not None and a._spawner is not spawner and not a._spawner.dead
