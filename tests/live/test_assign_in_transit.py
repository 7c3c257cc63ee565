"""A node's assignment on its way to the agent when the owner launches: the allocator publishes the assignment
to the node's agent and the startNotify to the application, and in a NATS cluster the two take different
routes; an agent cut from its nats-server loses what was sent meanwhile. (A fresh clone's CI run of
``tests/e2e/test_ha.py``: a NATS server SIGKILLed, an SDK job told it started, its launches refused
``not_owner: node c1n2 is not allocated to any request now``, the job failed with 1.)

The SDK asks a launch again while the agent answers ``not_owner`` on a node the RMS said the request started
on (bounded; not once the request ended); the agent registers again after a NATS reconnection, the
allocator's answer carrying the assignments it missed. Real nats-server, real agent, real processes; the
allocator is played by the test, which holds the assignment back (or never sends it) for as long as it
needs to."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid

import pytest

from coorm.launchers.sdk import Session
from coorm.node_agent.agent import Agent
from coorm.node_agent.nodes import host_node_info
from coorm.shared import bus, subjects
from coorm.shared.bus import WireError, call, decode, serve
from coorm.shared.endpoints import Role
from coorm.shared.events import EndReason, ErrorCode
from coorm.shared.protocol import (
    Ack,
    AgentRegister,
    KillNotify,
    LaunchMsg,
    NodeAssign,
    ProcessExited,
    SessionOpenReply,
    SessionSubjects,
    StartNotify,
)
from coorm.shared.servers import _wait_port, start_servers
from coorm.shared.settings import Settings
from tests.live.roles import Roles
from tests.live.test_agent import A1, TOKEN, TOKEN_SHA, WAIT, FakeAllocator, Inbox, group_gone

REQUEST = f"{A1}.r1"


class World:
    """The test's parts: its connections (allocator, observer), the fake allocator, one agent of two nodes,
    and a session of A1 that the test tells of starts and ends."""

    def __init__(self, settings: Settings, prefix: str, tmp_path) -> None:
        self.settings = settings
        self.prefix = prefix
        self.tmp_path = tmp_path
        self.nodes = [f"{prefix}n0", f"{prefix}n1"]

    async def start(self) -> World:
        self.nc = await Roles(self.settings).connect()
        self.allocator = FakeAllocator()
        await serve(self.nc.ncs[Role.SERVICE], subjects.AGENT_REGISTER, AgentRegister, self.allocator.handle)
        self.launches = Inbox(LaunchMsg)  # every launch sent to the first node, as the agent gets them
        await self.launches.subscribe(self.nc, subjects.node_launch(self.nodes[0], subjects.owner(A1)))
        self.exits = Inbox(ProcessExited)
        await self.exits.subscribe(self.nc, subjects.app_exited(A1))
        for c in self.nc.ncs.values():
            await bus.settled(c)
        s = self.settings.model_copy(update={"agent_heartbeat": 0.2, "kill_grace": 0.3,
                                             "agent_state_dir": self.tmp_path / "agents"})
        self.agent = Agent(s, f"agent-{self.prefix}", "c0", host_node_info(self.nodes, cores=1, memory_mb=64))
        await asyncio.wait_for(self.agent.start(), WAIT)
        reply = SessionOpenReply(app=A1, token=TOKEN, heartbeat_interval=60.0, subjects=SessionSubjects(
            request=subjects.app_request(A1), done=subjects.app_done(A1), close=subjects.app_close(A1),
            heartbeat=subjects.app_heartbeat(A1), change=subjects.notify_change(A1),
            start=subjects.notify_start(A1), kill=subjects.notify_kill(A1)))
        # the session's own parts (no policy engine here: nothing opened it, no views, no heartbeat)
        self.session = Session(nc=self.nc.ncs[Role.LAUNCHER], reply=reply, settings=self.settings,
                               own_connection=False, with_views=False)
        await self.session._subscribe()
        await bus.settled(self.nc.ncs[Role.LAUNCHER])
        return self

    async def stop(self) -> None:
        self.session.closed = True
        await asyncio.wait_for(self.agent.stop(), WAIT)
        for c in self.nc.ncs.values():
            await c.drain()

    async def started(self, nodes: list[str], request: str = REQUEST) -> None:
        """The allocator's startNotify, as the application hears it (handed to the session: its way over NATS
        is not what is tested here)."""
        self.session._deliver_start(StartNotify(app=A1, request=request, cluster="c0", nodes=nodes))

    def assignment(self, nodes: list[str], request: str = REQUEST) -> NodeAssign:
        return NodeAssign(app=A1, request=request, nodes=nodes, token_sha256=TOKEN_SHA)

    async def assign(self, nodes: list[str], request: str = REQUEST) -> None:
        for n in nodes:
            await call(self.nc, subjects.node_assign(n), self.assignment(nodes, request), Ack, timeout=WAIT)


@pytest.fixture
async def world(nats_url, tmp_path):
    w = await World(Settings(nats_url=nats_url), f"t{uuid.uuid4().hex[:8]}", tmp_path).start()
    yield w
    await w.stop()


async def test_a_launch_told_started_waits_for_an_assignment_on_its_way(world):
    """The assignment is held back until the agent has refused the launch once: the launch is asked again and
    runs once the assignment is there; the process's exit code is its own."""
    n0 = world.nodes[0]
    await world.started([n0])
    launching = asyncio.create_task(world.session.launch(REQUEST, n0, ["sh", "-c", "exit 3"]))
    _, first = await world.launches.get()
    _, second = await world.launches.get()  # the first was refused: no assignment yet
    assert decode(first, LaunchMsg).launch_id == decode(second, LaunchMsg).launch_id and not launching.done()
    await world.assign([n0])
    [pid] = await asyncio.wait_for(launching, WAIT)
    ev = await world.exits.until(lambda m: m.pid == pid)
    assert (ev.request, ev.code, ev.killed) == (REQUEST, 3, False)


async def test_the_refusal_stands_when_no_assignment_comes_or_the_request_ended(world):
    n0, n1 = world.nodes
    # a node the RMS did not say the request has: refused at once, asked once
    await world.started([n1])
    with pytest.raises(WireError) as e:
        await world.session.launch(REQUEST, n0, ["true"])
    assert e.value.code is ErrorCode.NOT_OWNER and world.launches.queue.qsize() == 1
    await world.launches.get()
    # said to have started there, but the assignment never comes: refused once the wait is over
    other = f"{A1}.r2"
    await world.started([n0], other)
    world.session.assign_wait = 1.0
    with pytest.raises(WireError) as e:
        await asyncio.wait_for(world.session.launch(other, n0, ["true"]), WAIT)
    assert e.value.code is ErrorCode.NOT_OWNER and world.launches.queue.qsize() >= 2
    while not world.launches.queue.empty():
        world.launches.queue.get_nowait()
    # the request ends while its launch is asked again: the refusal stands at once (not after the 30 s)
    world.session.assign_wait = 30.0
    third = f"{A1}.r3"
    await world.started([n0], third)
    launching = asyncio.create_task(world.session.launch(third, n0, ["true"]))
    await world.launches.get()
    await world.launches.get()
    world.session._deliver_kill(KillNotify(app=A1, request=third, reason=EndReason.NODE_FAILURE, nodes=[n0]))
    with pytest.raises(WireError) as e:
        await asyncio.wait_for(launching, WAIT)
    assert e.value.code is ErrorCode.NOT_OWNER
    assert world.agent.process_count == 0


def test_an_agent_cut_from_nats_learns_the_assignments_sent_meanwhile(tmp_path):
    """nats-server SIGKILLed and restarted: the assignment the allocator sent while the agent was cut is lost;
    the agent registers again once reconnected, and the allocator's answer gives it the node's owner, whose
    launch then runs. (Without the registration, the owner is refused until the SDK gives up.) A process the
    answer does not name goes on: after a mere reconnection the allocator's records may lag."""
    with start_servers(tmp_path / "servers") as servers:
        settings = Settings(nats_url=servers.nats_url, credentials_dir=servers.credentials)
        nats_proc = servers.procs[0]

        async def scenario() -> None:
            world = await World(settings, f"t{uuid.uuid4().hex[:8]}", tmp_path).start()
            try:
                n0, n1 = world.nodes
                await asyncio.wait_for(world.allocator.registrations.get(), WAIT)
                # a job runs on the other node; the allocator's records will not name it (a bookkeeping write
                # dropped over a Valkey failover): a reconnection must not kill it for that
                other = f"{A1}.r0"
                await world.assign([n1], other)
                await world.started([n1], other)
                [running] = await world.session.launch(other, n1, ["sleep", "1000"])
                os.kill(nats_proc.pid, signal.SIGKILL)
                nats_proc.wait()
                # meanwhile the node was given to A1's request and the application told: the assignment went
                # to no one (the allocator's records have it: its answer to a registration)
                world.allocator.assignments = [world.assignment([n0])]
                restarted = subprocess.Popen(nats_proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=True)
                servers.procs[0] = restarted
                _wait_port(servers.nats_port, restarted, "nats-server")
                await world.started([n0])
                world.session.assign_wait = 15.0
                [pid] = await asyncio.wait_for(world.session.launch(REQUEST, n0, ["sh", "-c", "exit 5"]), 20)
                # (the session's own subscription: the connection that sent the launch is back)
                [ev] = await world.session.wait_exits(REQUEST, 1, timeout=WAIT)
                assert (ev.pid, ev.code) == (pid, 5)
                assert world.agent.registrations >= 2
                assert not group_gone(running) and world.agent.book.assignment(n1).request == other
            finally:
                await world.stop()

        asyncio.run(scenario())
