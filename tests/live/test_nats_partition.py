"""A NATS server partitioned away from its cluster. Three nats-servers in one cluster (JetStream on each, CooRM's
streams at 3 replicas): two on the machine's side of a bridge, the third on a host of its own (a network
namespace: :mod:`tests.hosts`) with an agent that knows only that server; the services and another agent
use the first two. The third host's link is cut: its server is alive but alone, so its agent's heartbeats
reach no one -- its nodes go down and their owner is told -- while the majority carries on (a stream at 3
replicas still has 2). Healed, the server rejoins the cluster, the agent is heard of again, kills what ran
under the allocation that ended meanwhile, and its nodes take new work. The third host has a second link
(:class:`tests.hosts.Hosts` ``links=2``) that the cut leaves up: a client on the machine still reaches the
cut server -- the partial partition where an application stays with a live server that reaches nothing --
and an agent on the third host, whose list names a majority server too, reaches that one over it.
Skipped where network namespaces cannot be made (not root, no ``ip``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import nats
import pytest

from coorm.launchers.sdk import Closed, Exited, Killed, Session, SessionReaped
from coorm.services.batch.service import BatchService
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import bus, subjects
from coorm.shared.bus import decode
from coorm.shared.credentials import CredentialStore, write_secret
from coorm.shared.endpoints import Role
from coorm.shared.protocol import AgentHeartbeat, AgentRegister, NodesEvent
from coorm.shared.servers import free_port, nats_binary
from tests.hosts import Hosts, stop, unavailable
from tests.live.test_agent import Inbox, group_gone
from tests.live.test_batch import ended, submit, until_state
from tests.live.test_hosts import NODES, _nodes_up
from tests.live.test_system import _settings, next_of, rq

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"no hosts here: {unavailable()}")

FAR, NEAR = "far", "near"  # far: the third NATS server and the agent that knows only it


def _wait_listening(addr: str, port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection((addr, port), timeout=0.2).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, f"nats-server did not listen on {addr}"
            time.sleep(0.05)  # polling a server that is starting


@pytest.fixture
def cluster(servers, tmp_path):
    """The three servers: ``(urls, hosts, far)``, ``urls[i]`` the i-th server's (the third's on host ``far``,
    its routes on the first link), ``far`` the third's URL on the second link (the cut leaves it up). The first
    two are reached on the second link's gateway too (``hosts.gateways[1]``, their ports)."""
    with Hosts([FAR, NEAR], links=2) as hosts:
        store = CredentialStore(servers.credentials)
        secret = os.urandom(12).hex()
        addrs = [hosts.gateway, hosts.gateway, hosts.addr[FAR]]
        ports, routes = [free_port() for _ in addrs], [free_port() for _ in addrs]
        procs = []
        try:
            for i, addr in enumerate(addrs):
                work = tmp_path / f"nats-{i}"
                work.mkdir()
                urls = ", ".join(f'"nats-route://route:{secret}@{a}:{r}"' for a, r in zip(addrs, routes, strict=True))
                conf = write_secret(work / "nats.conf", (
                    f'include "{os.path.relpath(store.nats_auth_path, work)}"\n'
                    f"server_name: part-{i}\n"
                    f"cluster {{\n  name: part\n  listen: {addr}:{routes[i]}\n"
                    f'  authorization {{ user: route, password: "{secret}" }}\n  routes: [{urls}]\n}}\n'))
                # (each listens for clients on every address: the third on both its links, the first two on
                # the second link's gateway too, which the far host still reaches once its first link is cut;
                # the routes on the first link only)
                argv = [nats_binary(), "-c", str(conf), "-a", "0.0.0.0", "-p", str(ports[i]),
                        "-js", "-sd", str(work / "js")]
                if i == 2:
                    argv = hosts.command(FAR, argv)
                procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True))
            for proc, addr, port in zip(procs, addrs, ports, strict=True):
                _wait_listening(addr, port, proc)
            yield ([f"nats://{a}:{p}" for a, p in zip(addrs, ports, strict=True)], hosts,
                   f"nats://{hosts.addrs[FAR][1]}:{ports[2]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def _reaches(hosts: Hosts, host: str, url: str) -> None:
    """Until ``host`` reaches ``url``'s server. (The first connection over a link healed after a connection
    through it failed may fail too, *no route to host*, seen here; the next goes through.)"""
    there = urlsplit(url)
    code = ("import socket, sys, time\n"
            "deadline = time.monotonic() + 15\n"
            "while True:\n"
            "    try:\n"
            f"        socket.create_connection(({there.hostname!r}, {there.port}), timeout=1).close()\n"
            "        sys.exit(0)\n"
            "    except OSError:\n"
            "        if time.monotonic() > deadline:\n"
            "            sys.exit(1)\n"
            "        time.sleep(0.05)  # polling a link coming up\n")
    assert subprocess.run(hosts.command(host, [sys.executable, "-c", code]), timeout=30).returncode == 0, \
        f"{host} does not reach {url}"


async def _jetstream_ready(urls: list[str], settings) -> None:
    """Until the cluster's JetStream has a meta leader (a stream of 3 replicas can be made)."""
    me = settings.identity(Role.SERVICE)
    nc = await nats.connect(urls, nkeys_seed_str=me.seed, inbox_prefix=me.inbox_prefix, connect_timeout=2)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                await nc.jetstream().account_info()
                return
            except Exception:  # noqa: BLE001 - no meta leader yet
                assert time.monotonic() < deadline, "the cluster's JetStream did not come up"
                await asyncio.sleep(0.1)  # the election runs in the servers: nothing to wait on here
    finally:
        await nc.close()


async def _agents_beside_the_majority(servers, urls: list[str], hosts: Hosts):
    """The services' settings on the first two servers (JetStream up there), agents beating every 0.5 s;
    and the first server's URL over the far host's second link, which a cut of the first leaves up."""
    settings = _settings(servers, nats_url=",".join(urls[:2]), agent_heartbeat=0.5, agent_timeout=4.0,
                         kill_grace=0.3, stream_replicas=3)
    await _jetstream_ready(urls[:2], settings)
    return settings, f"nats://{hosts.gateways[1]}:{urlsplit(urls[0]).port}"


def _agent(hosts: Hosts, host: str, nats_url: str, settings, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "COORM_NATS_URL": nats_url, "COORM_KILL_GRACE": str(settings.kill_grace),
           "COORM_AGENT_HEARTBEAT": str(settings.agent_heartbeat), "COORM_CONNECTION_FILE": str(tmp_path / "none"),
           "COORM_AGENT_STATE_DIR": str(tmp_path / f"state-{host}")}
    code = (f"from coorm.node_agent.agent import main; main('c0', '{host}n0..{host}n{NODES - 1}', "
            f"agent_id='agent-{host}', cores=1, memory_mb=64)")
    log = open(tmp_path / f"agent-{host}.log", "wb")  # noqa: SIM115 - the process's, closed with it
    with log:
        return subprocess.Popen(hosts.command(host, [sys.executable, "-c", code]), env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


async def test_a_nats_server_cut_from_its_cluster(servers, redis_url, cluster, tmp_path):
    urls, hosts, _ = cluster
    majority = ",".join(urls[:2])
    settings = _settings(servers, nats_url=majority, agent_timeout=1.5, kill_grace=0.3, stream_replicas=3)
    await _jetstream_ready(urls[:2], settings)
    async with LocalStack(settings, {}) as stack:
        # (the decision stream led from the majority: the engine's kills are not held up by its election --
        # the tests below cut its leader)
        await _decisions_led_by(stack.engine.nc, "part-0")
        agents = [_agent(hosts, FAR, urls[2], settings, tmp_path), _agent(hosts, NEAR, majority, settings, tmp_path)]
        try:
            await _nodes_up(stack, "c0", 2 * NODES)
            async with await Session.open(settings, kind="rigid") as app:
                (rid,) = await app.request(rq("cut", "c0", 2 * NODES, 60))
                start = await app.wait_start(rid, 20)
                pids = {n: await app.launch(rid, n, ["sleep", "1000"]) for n in start.nodes}
                far = [p for n, ps in pids.items() if n.startswith(FAR) for p in ps]
                assert len(far) == NODES
                cut_at = time.monotonic()
                hosts.cut(FAR)  # the third server is alive, but alone with its agent
                killed = await next_of(app, Killed, 20, lambda e: e.request == rid)
                assert killed.reason == "node_failure"
                # (told within the agent timeout and the path of a kill: 6.6 s once, with other live tests
                # beside it on 2 cores, where the slack was 5 s)
                assert time.monotonic() - cut_at < settings.agent_timeout + 10.0
                await _nodes_up(stack, "c0", NODES)  # near's only
                # the majority carries on: a job runs on near's nodes
                (near_job,) = await app.request(rq("near", "c0", NODES, 60))
                st = await app.wait_start(near_job, 20)
                assert all(n.startswith(NEAR) for n in st.nodes)
                ran = [p for n in st.nodes for p in await app.launch(near_job, n, ["sh", "-c", "exit 0"])]
                assert not any(group_gone(p) for p in far)  # nobody reached the far host yet
                hosts.heal(FAR)
                # the server rejoins, its agent is heard of again: what ran under the ended allocation is
                # killed and told, and its nodes come back
                await _nodes_up(stack, "c0", 2 * NODES, timeout=60)
                told = {}
                while len(told) < NODES:
                    ev = await next_of(app, Exited, 30, lambda e: e.pid in far)
                    told[ev.pid] = ev
                assert all(e.killed for e in told.values())
                assert all(group_gone(p) for p in far)
                await app.done(near_job)
                (again,) = await app.request(rq("again", "c0", 2 * NODES, 60))
                st = await app.wait_start(again, 30)
                assert sorted(st.nodes) == sorted(start.nodes)
                ran = [p for n in st.nodes for p in await app.launch(again, n, ["sh", "-c", "exit 0"])]
                assert len(ran) == 2 * NODES
        finally:
            for a in agents:
                stop(a)


async def test_an_agent_on_a_server_cut_from_its_cluster_moves_to_another(servers, redis_url, cluster, tmp_path):
    """An agent on the far host whose URL list names the third server, and the first one as the far host
    reaches it over its second link, connected to the third, a job running on its nodes. The far host's first
    link is cut (the third server is alone; the agent still reaches it, and the first over the second link):
    its heartbeats go unanswered while its connection lives, it finds the allocator through the first server
    and moves there before the agent timeout. Its nodes never go down (the allocator tells the engine nothing
    of the kind), the job is not killed and its processes run on; the agent, registered again from the first
    server, launches under the job's assignment there."""
    urls, hosts, _ = cluster
    settings, second = await _agents_beside_the_majority(servers, urls, hosts)
    me = settings.identity(Role.SERVICE)
    tap = await nats.connect(urls[:2], nkeys_seed_str=me.seed, inbox_prefix=me.inbox_prefix, connect_timeout=2)
    async with contextlib.AsyncExitStack() as closing:
        closing.push_async_callback(tap.close)
        stack = await closing.enter_async_context(LocalStack(settings, {}))
        # nats-py takes the servers of a list in random order: with the second link down, the agent can
        # only reach the third (its own host's), and starts there
        hosts.cut(FAR, 1)
        agent = _agent(hosts, FAR, f"{urls[2]},{second}", settings, tmp_path)
        try:
            await _nodes_up(stack, "c0", NODES)
            hosts.heal(FAR, 1)
            _reaches(hosts, FAR, second)
            downs = await Inbox(NodesEvent).subscribe(tap, subjects.NODES_EVENT)
            registered = await Inbox(AgentRegister).subscribe(tap, subjects.AGENT_REGISTER)
            beats = await Inbox(AgentHeartbeat).subscribe(tap, subjects.AGENT_HEARTBEAT)
            await bus.settled(tap)
            async with await Session.open(settings, kind="rigid") as app:
                (rid,) = await app.request(rq("stays", "c0", NODES, 60))
                start = await app.wait_start(rid, 20)
                pids = [p for n in start.nodes for p in await app.launch(rid, n, ["sleep", "1000"])]
                cut_at = time.monotonic()
                hosts.cut(FAR)  # the third server is alone; the agent still reaches it, and the first
                await registered.until(lambda m: m.agent == "agent-far", settings.agent_timeout)
                moved = time.monotonic() - cut_at
                # heard through the majority past the time its nodes would have gone down (the allocator
                # scans every second at most)
                await beats.until(lambda m: m.agent == "agent-far"
                                  and time.monotonic() > cut_at + settings.agent_timeout + 1.5, 20)
                seen = []
                while not downs.queue.empty():
                    seen.append(decode(downs.queue.get_nowait()[1], NodesEvent))
                assert not [e for e in seen if e.kind == "down"], seen
                await _nodes_up(stack, "c0", NODES, timeout=0)
                assert not any(group_gone(p) for p in pids)
                (pid,) = await app.launch(rid, start.nodes[0], ["sh", "-c", "exit 3"])
                told = []
                while True:
                    ev = await app.next_event(20)
                    told.append(ev)
                    if isinstance(ev, Exited) and ev.pid == pid:
                        break
                assert ev.code == 3 and not ev.killed
                assert not any(isinstance(e, Killed) for e in told), told
                await app.done(rid)  # still running: not ended meanwhile
            log = (tmp_path / "agent-far.log").read_text()
            assert log.count("moving there") == 1, log
            print(f"the agent moved (registered through the first server) {moved:.2f} s after the cut")
        finally:
            stop(agent)


async def _logged(path: Path, line: str, proc: subprocess.Popen) -> None:
    """Until ``line`` is in the log at ``path`` of the running ``proc``."""
    deadline = time.monotonic() + 30
    while line not in path.read_text():
        assert proc.poll() is None, path.read_text()
        assert time.monotonic() < deadline, f"not logged: {line}\n{path.read_text()}"
        await asyncio.sleep(0.05)  # polling a log file: nothing to wait on


async def test_an_agent_that_starts_on_a_server_already_cut_off_moves_to_another(servers, redis_url, cluster,
                                                                                 tmp_path):
    """The third server is cut from its cluster before the far host's agent starts, and the agent can reach
    that server only, so it connects there: no heartbeat of its was ever answered, and its registration goes
    unanswered. Once the far host reaches the first server again (over its second link), the agent finds the
    allocator through it, moves there and registers: its nodes come up."""
    urls, hosts, _ = cluster
    settings, second = await _agents_beside_the_majority(servers, urls, hosts)
    async with LocalStack(settings, {}) as stack:
        hosts.cut(FAR)  # the third server is alone
        hosts.cut(FAR, 1)  # and the far host reaches nothing else
        agent = _agent(hosts, FAR, f"{urls[2]},{second}", settings, tmp_path)
        log = tmp_path / "agent-far.log"
        try:
            await _logged(log, "agent started", agent)
            hosts.heal(FAR, 1)
            _reaches(hosts, FAR, second)
            healed = time.monotonic()
            await _nodes_up(stack, "c0", NODES)
            assert log.read_text().count("moving there") == 1, log.read_text()
            print(f"registered through the first server {time.monotonic() - healed:.2f} s after it was reachable")
        finally:
            stop(agent)


def _on(session: Session, url: str) -> bool:
    return _connected_to(session.nc, url)


def _connected_to(nc, url: str) -> bool:
    here, there = nc.connected_url, urlsplit(url)
    return nc.is_connected and here is not None and (here.hostname, here.port) == (there.hostname, there.port)


async def _decisions_led_by(nc, server: str) -> None:
    """Until the decision stream's leader is ``server`` (asked to step down until the election lands there)."""
    js, deadline = nc.jetstream(timeout=2), time.monotonic() + 60
    while (info := await js.stream_info(subjects.DECISIONS_STREAM)).cluster.leader != server:
        assert time.monotonic() < deadline, f"{server} never led the decision stream: {info.cluster}"
        with contextlib.suppress(Exception):  # (answered by the leader that steps down; lost in an election)
            await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{subjects.DECISIONS_STREAM}", b"", timeout=2)
        await _led_again(js)


async def _led_again(js) -> None:
    """Until the decision stream has a leader again (the election runs in the servers: nothing to wait on)."""
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(Exception):
            if (await js.stream_info(subjects.DECISIONS_STREAM)).cluster.leader is not None:
                return
        assert time.monotonic() < deadline, "the decision stream elected no leader"
        await asyncio.sleep(0.1)


async def test_a_session_on_a_server_cut_from_its_cluster_moves_to_another(servers, redis_url, cluster):
    """An application connected to the third server, which its link to the other two is cut from (the
    application still reaches it): its heartbeats go unanswered while its connection lives. It looks for the
    RMS through the other servers of its list, finds it, moves there before its session could be reaped,
    and asks what it missed: the exit of a process that ended while it was cut is told; a request sent while
    it was cut is accepted and starts; its session and requests are intact (a ``done`` is answered). The cut
    server led the decision stream: a request sent once moved is started at once, and its decision published
    before the other two can have elected a leader (4 s at least) is dropped by them unanswered -- the engine
    takes it as refused, and a new term publishes it again."""
    urls, hosts, far = cluster
    majority = ",".join(urls[:2])
    settings = _settings(servers, nats_url=majority, stream_replicas=3)
    await _jetstream_ready(urls[:2], settings)
    async with LocalStack(settings, {"c0": 5}) as stack:
        await _decisions_led_by(stack.engine.nc, "part-2")
        app_settings = _settings(servers, nats_url=f"{far},{majority}", stream_replicas=3)
        async with await Session.open(app_settings, kind="rigid") as app:
            if not _on(app, far):  # (nats-py picks a server of the list at random: put it on the third)
                await bus.move_to(app.nc, urlsplit(far).hostname, urlsplit(far).port)
                await wait_until(lambda: _on(app, far), 10, "the session on the third server")
            (rid,) = await app.request(rq("cut", "c0", 2, 60))
            start = await app.wait_start(rid, 20)
            (pid,) = await app.launch(rid, start.nodes[0], ["sh", "-c", "sleep 1; exit 3"])
            hosts.cut(FAR)  # the routes' link: the third server is alone, the application still reaches it
            cut_at = time.monotonic()
            sent = asyncio.create_task(app.request(rq("while-cut", "c0", 2, 60)))
            seen = []
            while True:  # (the exit, told while cut, comes with the recovery after the move)
                ev = await app.next_event(30)
                seen.append(ev)
                if isinstance(ev, Exited) and ev.pid == pid:
                    break
            assert ev.code == 3 and not ev.killed
            assert app.stats.moves == 1 and any(_on(app, u) for u in urls[:2])
            assert not any(isinstance(e, Killed) for e in seen)
            assert await app.request(rq("once-moved", "c0", 1, 60)) == ["once-moved"]
            print(f"a request accepted {time.monotonic() - cut_at:.2f} s after the cut, once moved")
            assert await asyncio.wait_for(sent, 30) == ["while-cut"]
            assert len((await app.wait_start("while-cut", 40)).nodes) == 2
            assert len((await app.wait_start("once-moved", 40)).nodes) == 1
            await app.done(rid)  # the session was not reaped: its commands are answered


async def test_a_session_reaped_while_cut_off_is_told_when_heard_again(servers, redis_url, cluster):
    """An application that reaches only the third server (its URL list names no other: nowhere to move), cut
    from the cluster for longer than the session timeout: the RMS reaps its session and its agent kills its
    process. Healed, its next heartbeat is answered ``unknown_app``: the application is told -- the exit of
    its killed process, then the session's end -- rather than waiting for a start, an exit or a kill that was
    told while it could not hear."""
    urls, hosts, far = cluster
    majority = ",".join(urls[:2])
    settings = _settings(servers, nats_url=majority, stream_replicas=3, session_timeout=2.0)
    await _jetstream_ready(urls[:2], settings)
    async with LocalStack(settings, {"c0": 4}):
        app_settings = _settings(servers, nats_url=far, stream_replicas=3, session_timeout=2.0)
        app = await Session.open(app_settings, kind="rigid")
        try:
            (rid,) = await app.request(rq("cut", "c0", 2, 60))
            start = await app.wait_start(rid, 20)
            (pid,) = await app.launch(rid, start.nodes[0], ["sleep", "1000"])
            hosts.cut(FAR)
            await wait_until(lambda: group_gone(pid), 30, "the unheard session reaped and its process killed")
            waiting = asyncio.create_task(app.wait_exits(rid, 2, timeout=60))  # (one process: a second never comes)
            hosts.heal(FAR)
            seen = []
            while True:
                ev = await app.next_event(30)
                seen.append(ev)
                if isinstance(ev, Closed):
                    break
            assert isinstance(ev.error, SessionReaped), seen
            assert "reaped: no heartbeat for" in str(ev.error), ev.error  # (the RMS says why)
            exits = [e for e in seen if isinstance(e, Exited)]
            assert [(e.pid, e.killed) for e in exits] == [(pid, True)], seen
            with pytest.raises(SessionReaped):
                await asyncio.wait_for(waiting, 10)
            with pytest.raises(SessionReaped):
                await app.request(rq("after", "c0", 1, 60))
        finally:
            await app.close()


async def _ended_once_heard(nc, job: str):
    """``ended``, asked again when a query goes unanswered: one sent as the service moves may still be routed
    to the cut server (the others drop the subscriptions it had only once they see the route dead)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await ended(nc, job)
        except nats.errors.TimeoutError:
            assert time.monotonic() < deadline, "the batch service never answered once moved"


async def test_a_batch_service_on_a_server_cut_from_its_cluster_moves_to_another(servers, redis_url, cluster,
                                                                                 tmp_path):
    """The batch service connected to the third server, which leads the decision stream and is then cut from the
    other two (the service still reaches it; the rest of the RMS is on the first two): its running job's session
    hears no answer to its heartbeat, finds the RMS through the first server and moves the service's connection
    there -- before its probe of JetStream could, which waits for the two to elect another leader. Meanwhile the
    policy engine's decisions meet a stream without a leader: unanswered, it publishes them again in a new term.
    A job that ran across the cut ends with its own exit code, not killed (its session was not reaped); a job
    submitted through the majority once the service moved runs."""
    urls, hosts, far = cluster
    majority = ",".join(urls[:2])
    settings = _settings(servers, nats_url=majority, stream_replicas=3, service_probe=0.5)
    await _jetstream_ready(urls[:2], settings)
    async with contextlib.AsyncExitStack() as closing:
        await closing.enter_async_context(LocalStack(settings, {"c0": 4}))
        svc, stopping = BatchService(settings.model_copy(update={"nats_url": f"{far},{majority}"})), asyncio.Event()
        running = asyncio.create_task(svc.run(stopping))

        async def stop_service() -> None:
            stopping.set()
            await asyncio.wait_for(running, 30)

        closing.push_async_callback(stop_service)
        await asyncio.wait_for(svc.ready.wait(), 30)
        if not _connected_to(svc.nc, far):  # (nats-py picks a server of the list at random: put it on the third)
            await bus.move_to(svc.nc, urlsplit(far).hostname, urlsplit(far).port)
            await wait_until(lambda: _connected_to(svc.nc, far), 10, "the batch service on the third server")
        nc = await bus.connect(majority, "test-user", settings.identity(Role.LAUNCHER))
        closing.push_async_callback(bus.shutdown, nc)
        # (the worst case, seen once in CI: a cut leader answers for 10 to 20 s, then answers without one)
        await _decisions_led_by(svc.nc, "part-2")
        across = await submit(nc, tmp_path, argv=["sh", "-c", "sleep 2; exit 3"], cluster="c0")
        await until_state(nc, across, "running")
        hosts.cut(FAR)  # the routes' link: the third server is alone, the batch service still reaches it
        cut_at = time.monotonic()
        await wait_until(lambda: any(_connected_to(svc.nc, u) for u in urls[:2]), 20, "the batch service moved")
        moved = time.monotonic() - cut_at
        (rec,) = await _ended_once_heard(nc, across)
        assert (rec.state, rec.exit_code) == ("failed", 3), rec
        after = await submit(nc, tmp_path, argv=["sh", "-c", "exit 0"], cluster="c0")
        (rec,) = await ended(nc, after)
        assert (rec.state, rec.exit_code) == ("completed", 0), rec
        print(f"the batch service moved {moved:.2f} s after the cut")


async def test_every_service_on_a_server_cut_from_its_cluster_moves_to_another(servers, redis_url, cluster):
    """The whole RMS -- policy engine, node allocator, view publisher, batch service and an agent -- connected
    to the third server, which leads the decision stream and is then cut from the other two (each still reaches
    it): the leader there goes on answering each one's probe of JetStream, but hears none of its followers; each
    finds JetStream through the first server once the two have elected another leader, and moves there. An
    application that knows only the first two servers then opens a session, gets nodes, and hears its process's
    exit code."""
    urls, hosts, far = cluster
    majority = ",".join(urls[:2])
    settings = _settings(servers, nats_url=f"{far},{majority}", stream_replicas=3, service_probe=0.5,
                         agent_heartbeat=0.5, agent_timeout=4.0)
    await _jetstream_ready(urls[:2], settings)
    async with LocalStack(settings, {"c0": 2}, with_batch=True) as stack:
        parts = {"policy engine": stack.engine, "node allocator": stack.allocator, "view publisher": stack.publisher,
                 "batch service": stack.batch, "agent": stack.agents["c0"]}
        for part in parts.values():  # (nats-py picks a server of the list at random: put them on the third)
            if not _connected_to(part.nc, far):
                await bus.move_to(part.nc, urlsplit(far).hostname, urlsplit(far).port)
        for what, part in parts.items():
            await wait_until(lambda part=part: _connected_to(part.nc, far), 10, f"the {what} on the third server")
        await stack.wait_nodes_up()
        await _decisions_led_by(stack.engine.nc, "part-2")
        hosts.cut(FAR)  # the routes' link: the third server is alone, every part of the RMS still reaches it
        cut_at = time.monotonic()
        for what, part in parts.items():
            await wait_until(lambda part=part: any(_connected_to(part.nc, u) for u in urls[:2]), 20,
                             f"the {what} moved")
        moved = time.monotonic() - cut_at
        app_settings = _settings(servers, nats_url=majority, stream_replicas=3)
        async with await Session.open(app_settings, kind="rigid") as app:
            (rid,) = await app.request(rq("after-the-cut", "c0", 2, 60))
            start = await app.wait_start(rid, 20)
            (pid,) = await app.launch(rid, start.nodes[0], ["sh", "-c", "exit 3"])
            while True:
                ev = await app.next_event(20)
                if isinstance(ev, Exited) and ev.pid == pid:
                    break
            assert ev.code == 3 and not ev.killed
        print(f"every part of the RMS moved within {moved:.2f} s of the cut")

