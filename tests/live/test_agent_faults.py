"""A node agent's faults under the real services: stopped (SIGSTOP) past the agent timeout, or killed
(SIGKILL) and restarted. The agent is a process of its own (``coorm agent``), the rest a LocalStack."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from coorm.launchers.sdk import Exited, Killed, Session
from coorm.services.stack import LocalStack
from coorm.shared import bus, subjects
from coorm.shared.protocol import StatusQuery, StatusReply
from tests.live.test_agent import group_gone
from tests.live.test_system import _settings, next_of, rq


@pytest.fixture
async def stack(servers, redis_url, request):
    kw = {"agent_timeout": 1.0, **getattr(request, "param", {})}
    async with LocalStack(_settings(servers, **kw), {"c0": 2}) as s:
        yield s


async def _nodes_up(stack, cluster: str, n: int, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        st = await bus.call(stack.allocator.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply, timeout=5)
        if {c.cluster: c.up for c in st.clusters}.get(cluster) == n:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{cluster}: {n} nodes up")
        await asyncio.sleep(0.05)  # polling the engine's status: there is nothing to wait on


async def _agent(stack, tmp_path) -> asyncio.subprocess.Process:
    s = stack.settings
    env = {**os.environ, "COORM_NATS_URL": s.nats_url, "COORM_KILL_GRACE": str(s.kill_grace),
           "COORM_AGENT_HEARTBEAT": str(s.agent_heartbeat), "COORM_AGENT_STATE_DIR": str(tmp_path / "state"),
           "COORM_CONNECTION_FILE": str(tmp_path / "none.json")}
    code = ("from coorm.node_agent.agent import main; "
            "main('c9', 'c9n0..c9n1', agent_id='agent-c9', cores=1, memory_mb=64)")
    return await asyncio.create_subprocess_exec(sys.executable, "-c", code, env=env,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)


async def _exits(app: Session, rid: str, pids: list[int], timeout: float = 20.0) -> dict[int, Exited]:
    got: dict[int, Exited] = {}
    while len(got) < len(pids):
        ev = await next_of(app, Exited, timeout, lambda e: e.request == rid and e.pid in pids)
        got[ev.pid] = ev
    return got


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        await proc.wait()


async def test_an_agent_stopped_past_its_timeout_kills_what_ran_for_the_ended_allocations(stack, tmp_path):
    """SIGSTOP the agent: its nodes go down within the agent timeout and the owner is told; after SIGCONT,
    the processes of the ended allocation are killed (by the allocator's kill that waited in the agent's
    socket, or by the registration's answer: no assignment any more), and each exit is reported."""
    agent = await _agent(stack, tmp_path)
    try:
        await _nodes_up(stack, "c9", 2)
        async with await Session.open(stack.settings, kind="rigid") as app:
            (rid,) = await app.request(rq("cut", "c9", 2, 600))
            start = await app.wait_start(rid, 10)
            pids = [p for n in start.nodes for p in await app.launch(rid, n, ["sleep", "1000"])]
            agent.send_signal(signal.SIGSTOP)
            killed = await next_of(app, Killed, 10)
            assert killed.request == rid and killed.reason == "node_failure"
            assert not any(group_gone(p) for p in pids)  # nobody to kill them while the agent is stopped
            agent.send_signal(signal.SIGCONT)
            exits = await _exits(app, rid, pids)
            assert all(e.killed and e.reason in ("node_failure", "allocation_ended") for e in exits.values())
            assert all(group_gone(p) for p in pids)
            await _nodes_up(stack, "c9", 2)  # it registered again
    finally:
        await _stop(agent)


# the restarted agent must register within the agent timeout: a Python process starting on a loaded
# machine may take seconds
@pytest.mark.parametrize("stack", [{"agent_timeout": 15.0}], indirect=True)
async def test_a_restarted_agent_gets_its_nodes_assignments_from_the_allocator(stack, tmp_path):
    """SIGKILL the agent and start another (same id): within the agent timeout the nodes never went down,
    the request still runs. The new agent kills and reports what its predecessor left, and the allocator's
    answer to its registration lets the owner launch on the same nodes again."""
    first = await _agent(stack, tmp_path)
    second = None
    try:
        await _nodes_up(stack, "c9", 2)
        async with await Session.open(stack.settings, kind="rigid") as app:
            (rid,) = await app.request(rq("restart", "c9", 2, 600))
            start = await app.wait_start(rid, 10)
            pids = [p for n in start.nodes for p in await app.launch(rid, n, ["sleep", "1000"])]
            first.kill()
            await first.wait()
            second = await _agent(stack, tmp_path)
            exits = await _exits(app, rid, pids)
            assert {(e.killed, e.reason, e.code) for e in exits.values()} == {(True, "agent_restarted", -9)}
            deadline = asyncio.get_running_loop().time() + 20
            while True:  # the new agent has the assignment once it registered: nothing to wait on but that
                try:
                    again = await app.launch(rid, start.nodes[0], ["sh", "-c", "exit 7"])
                    break
                except bus.WireError:
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            (ex,) = (await _exits(app, rid, again)).values()
            assert ex.code == 7 and not ex.killed
    finally:
        for p in (first, second):
            if p is not None:
                await _stop(p)


@pytest.mark.parametrize("stack", [{"agent_timeout": 15.0}], indirect=True)
async def test_an_exit_while_no_agent_watched_is_told_with_its_own_code(stack, tmp_path):
    """SIGKILL the agent; one of its processes then exits 5 on its own, the other still runs. The spawner,
    which outlives its agent, reaped the first and wrote its code down: the next agent reports 5 for it
    (not an unknown code, which a job would have to turn into a failure of its own), and kills the other."""
    first = await _agent(stack, tmp_path)
    second = None
    gate = tmp_path / "gate"
    try:
        await _nodes_up(stack, "c9", 2)
        async with await Session.open(stack.settings, kind="rigid") as app:
            (rid,) = await app.request(rq("unwatched", "c9", 2, 600))
            start = await app.wait_start(rid, 10)
            (quits,) = await app.launch(rid, start.nodes[0], ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; "
                                                                          "done; exit 5"])
            (runs,) = await app.launch(rid, start.nodes[1], ["sleep", "1000"])
            first.kill()
            await first.wait()
            gate.touch()
            deadline = asyncio.get_running_loop().time() + 20
            while not group_gone(quits):  # (it ends on its own, unwatched: nothing to wait on but that)
                assert asyncio.get_running_loop().time() < deadline, "the gated process did not end"
                await asyncio.sleep(0.05)
            assert not group_gone(runs)
            second = await _agent(stack, tmp_path)
            exits = await _exits(app, rid, [quits, runs])
            assert (exits[quits].code, exits[quits].killed, exits[quits].reason) == (5, False, None)
            assert (exits[runs].code, exits[runs].killed, exits[runs].reason) == (-9, True, "agent_restarted")
            assert not list((tmp_path / "state").glob("*.exits.*"))  # the ledger read, then removed
    finally:
        for p in (first, second):
            if p is not None:
                await _stop(p)
