"""Agents on hosts of their own (network namespaces on a bridge: :mod:`tests.hosts`), the services on the
machine's, NATS listening on the bridge: a host's link is cut while a job runs on it and the others, then
healed. Skipped where network namespaces cannot be made (not root, no ``ip``)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NoAnswer

from coorm.launchers.sdk import Exited, Killed, Session
from coorm.services.stack import LocalStack
from coorm.shared import bus, subjects
from coorm.shared.credentials import CredentialStore
from coorm.shared.protocol import StatusQuery, StatusReply
from coorm.shared.servers import free_port, nats_binary, nats_config
from tests.hosts import Hosts, stop, unavailable
from tests.live.test_agent import group_gone
from tests.live.test_system import _settings, next_of, rq

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"no hosts here: {unavailable()}")

HOSTS = ["h1", "h2"]
NODES = 2  # per host


@pytest.fixture
def hosts():
    with Hosts(HOSTS) as h:
        yield h


@pytest.fixture
def bridge_nats(servers, hosts, tmp_path):
    """A nats-server of the same credentials, listening on the bridge (the hosts reach it there)."""
    port = free_port()
    store = CredentialStore(servers.credentials)
    work = tmp_path / "nats"
    work.mkdir()
    proc = subprocess.Popen([nats_binary(), "-c", str(nats_config(work, store)), "-a", hosts.gateway, "-p", str(port),
                             "-js", "-sd", str(work / "js")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 15
    while True:
        try:
            import socket

            socket.create_connection((hosts.gateway, port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "nats-server did not listen on the bridge"
            time.sleep(0.05)  # polling a server that is starting
    yield f"nats://{hosts.gateway}:{port}"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
async def stack(servers, redis_url, bridge_nats, hosts, tmp_path):
    settings = _settings(servers, nats_url=bridge_nats, agent_timeout=1.5, kill_grace=0.3)
    async with LocalStack(settings, {}) as s:
        agents = [_agent(hosts, h, settings, tmp_path) for h in HOSTS]
        try:
            await _nodes_up(s, "c0", NODES * len(HOSTS))
            yield s
        finally:
            for a in agents:
                stop(a)


def _agent(hosts: Hosts, host: str, settings, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "COORM_NATS_URL": settings.nats_url, "COORM_KILL_GRACE": str(settings.kill_grace),
           "COORM_AGENT_HEARTBEAT": str(settings.agent_heartbeat), "COORM_CONNECTION_FILE": str(tmp_path / "none"),
           "COORM_AGENT_STATE_DIR": str(tmp_path / f"state-{host}")}
    code = (f"from coorm.node_agent.agent import main; main('c0', '{host}n0..{host}n{NODES - 1}', "
            f"agent_id='agent-{host}', cores=1, memory_mb=64)")
    log = open(tmp_path / f"agent-{host}.log", "wb")  # noqa: SIM115 - the process's, closed with it
    with log:
        return subprocess.Popen(hosts.command(host, [sys.executable, "-c", code]), env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


async def _status(stack) -> StatusReply:
    return await bus.call(stack.allocator.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply, timeout=5)


async def _nodes_up(stack, cluster: str, n: int, timeout: float = 30.0) -> None:
    """Until the engine counts ``n`` nodes of ``cluster`` up. (Nobody answering is a take-over under way: in a
    NATS cluster, a server healed from a partition may make a stream elect its leader again, and the engine
    steps down when JetStream refuses a decision meanwhile -- seen in CI. A query sent as the term ends goes
    unanswered rather than refused: the engine's server had its subscription when the query's server
    forwarded it, or the engine's client had taken it when the term unsubscribed -- seen in CI too.)"""
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = await _status(stack)
        except (NoRespondersError, NoAnswer):
            assert time.monotonic() < deadline, f"{cluster}: no engine answered for {timeout} s"
            await asyncio.sleep(0.05)  # the take-over runs in the engines: nothing to wait on here
            continue
        if {c.cluster: c.up for c in st.clusters}.get(cluster) == n:
            return
        assert time.monotonic() < deadline, f"{cluster}: not {n} nodes up ({st.clusters})"
        await asyncio.sleep(0.05)  # polling the engine's status: there is nothing to wait on


async def test_a_host_cut_off_loses_its_nodes_its_owner_is_told_and_it_kills_its_own_processes(stack, hosts):
    """Cut h1's link while a job runs on all four nodes: h1's nodes go down within the agent timeout, the
    owner hears its request ended (node failure), h2's processes are killed by the RMS at once, and h1's --
    which the RMS cannot reach -- by h1's agent itself when the allocation's end passes. Healed, h1 comes
    back: the owner hears how h1's processes ended, its nodes are up again and a new job runs on all four,
    none of them held twice."""
    walltime = 10.0
    async with await Session.open(stack.settings, kind="rigid") as app:
        (rid,) = await app.request(rq("cut", "c0", NODES * len(HOSTS), walltime))
        start = await app.wait_start(rid, 10)
        pids = {n: await app.launch(rid, n, ["sleep", "1000"]) for n in start.nodes}
        cut_at = time.monotonic()
        hosts.cut("h1")
        killed = await next_of(app, Killed, 10, lambda e: e.request == rid)
        assert killed.reason == "node_failure"
        assert time.monotonic() - cut_at < stack.settings.agent_timeout + 3.0
        await _nodes_up(stack, "c0", NODES)  # h2's only
        on_h1 = [p for n, ps in pids.items() if n.startswith("h1") for p in ps]
        on_h2 = [p for n, ps in pids.items() if n.startswith("h2") for p in ps]
        assert len(on_h1) == len(on_h2) == NODES
        deadline = time.monotonic() + 10
        while not all(group_gone(p) for p in on_h2):
            assert time.monotonic() < deadline, "h2's processes were not killed"
            await asyncio.sleep(0.05)  # polling processes of another host
        assert not any(group_gone(p) for p in on_h1)  # nobody reached h1 yet
        deadline = cut_at + walltime + stack.settings.kill_grace + 5
        while not all(group_gone(p) for p in on_h1):  # the cut agent's own kill, at the allocation's end
            assert time.monotonic() < deadline, "h1's agent, cut off, did not kill its processes"
            await asyncio.sleep(0.05)
        hosts.heal("h1")
        await _nodes_up(stack, "c0", NODES * len(HOSTS))
        told = {}
        while len(told) < NODES:  # what h1's agent did while cut off reaches the owner once healed
            ev = await next_of(app, Exited, 20, lambda e: e.pid in on_h1)
            told[ev.pid] = ev
        assert {(e.killed, e.reason) for e in told.values()} == {(True, "allocation_ended")}
        (again,) = await app.request(rq("again", "c0", NODES * len(HOSTS), 60))
        st = await app.wait_start(again, 20)
        assert sorted(st.nodes) == sorted(start.nodes)
        ran = [p for n in st.nodes for p in await app.launch(again, n, ["sh", "-c", "exit 0"])]
        assert len(ran) == NODES * len(HOSTS)
        status = await _status(stack)
        held: dict[str, str] = {}
        for r in status.requests:
            for n in r.node_ids:
                assert n not in held, f"{n} held by {held[n]} and {r.request}"
                held[n] = r.request
