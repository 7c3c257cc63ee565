"""Server outages under a running system: valkey restarts under the policy engine, which must neither die nor
wedge, and must lose nothing it accepted. Servers of its own (it restarts them), real processes throughout."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess

import pytest

from coorm.launchers.sdk import Killed, Session
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import bus, keys
from coorm.shared.events import ErrorCode
from coorm.shared.requests import RequestSpec
from coorm.shared.servers import start_servers
from coorm.shared.settings import Settings
from tests.live.test_system import next_of


@pytest.fixture
def own_servers(tmp_path, monkeypatch):
    s = start_servers(tmp_path / "servers")
    monkeypatch.setenv("COORM_CREDENTIALS_DIR", str(s.credentials))  # each Settings finds its identity there
    yield s
    s.stop()


def stop_server(servers, index: int) -> list[str]:
    """Stop one server (0: nats-server, 1: valkey; each writes its files as it goes); how to start it again."""
    old = servers.procs[index]
    old.send_signal(signal.SIGTERM)
    old.wait(timeout=10)
    return list(old.args)


def start_server(servers, index: int, args: list[str]) -> None:
    """Start it again on the same port and directory, as a supervisor would."""
    servers.procs[index] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True)


VALKEY, NATS = 1, 0


async def _request_until_accepted(app: Session, spec: RequestSpec, timeout: float = 30.0) -> str:
    """Ask until the RMS takes it: while valkey is away, the engine refuses (``unavailable``: retry)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            (rid,) = await app.request(spec)
            return rid
        except bus.WireError as e:
            if e.code is not ErrorCode.UNAVAILABLE or asyncio.get_running_loop().time() > deadline:
                raise
        except TimeoutError:
            if asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.2)  # back-off between attempts, as a launcher would


async def test_a_valkey_restart_neither_kills_nor_wedges_the_policy_engine(own_servers):
    """A one-second valkey restart used to wedge the leader (silent after ``could not apply events``) and kill
    the standby (``ConnectionError``): 89 applications hung, 27 accepted requests lost. Now the leader steps
    down on a failed write and leads again (rebuilding its state from the log) once valkey is back: what it
    had accepted is still there, and new requests are served."""
    settings = Settings(nats_url=own_servers.nats_url, redis_url=own_servers.redis_url, reschedule_interval=0.05,
                        fair_start=0.0, kill_grace=0.3, launcher_heartbeat=0.2, session_timeout=10.0,
                        agent_heartbeat=0.2, agent_timeout=5.0, leader_lease=1.0)
    async with LocalStack(settings, {"c0": 4}) as stack:
        engine = stack.parts["policy-engine"]
        async with await Session.open(settings, kind="rigid") as app:
            (before,) = await app.request(RequestSpec(id="before", type="non-preemptible", cluster="c0", nodes=2,
                                                      duration=600))
            await app.wait_start(before, 10)
            args = await asyncio.to_thread(stop_server, own_servers, VALKEY)
            # the leader finds out at its next write (the lease's renewal, a third of the lease from now)
            await wait_until(lambda: not stack.engine.leader.is_set(), 10, "the leader to step down")
            start_server(own_servers, VALKEY, args)
            after = await _request_until_accepted(app, RequestSpec(id="after", type="non-preemptible",
                                                                   cluster="c0", nodes=2, duration=600))
            start = await app.wait_start(after, 20)
            assert len(start.nodes) == 2
            assert not engine.task.done(), engine.task
            await wait_until(lambda: stack.engine.leader.is_set(), 20, "the engine to lead again")
            reqs = stack.engine.cores.policy.requests
            assert {before, after} <= set(reqs)  # nothing it had accepted is lost
            # the node allocator's records were written despite the outage (its writes wait for Redis)
            # (written just after the start is told: polled, there is nothing to wait on)
            for _ in range(100):
                records = await stack.allocator.redis.hmget(keys.NODES, list(start.nodes))
                if all(json.loads(r)["request"] == after for r in records):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(records)


def restart(servers, index: int) -> None:
    start_server(servers, index, stop_server(servers, index))


async def test_a_launcher_learns_after_a_nats_restart_what_it_missed(own_servers):
    """Notifications sent while a launcher's connection is cut are lost (a nats-server restart lost 6
    applications their start or end). On reconnecting, the SDK asks what started and ended and takes what
    it missed as if it had heard it. Here the start and kill notifications are made certain to be missed
    (the session stops listening to them), then nats-server restarts."""
    settings = Settings(nats_url=own_servers.nats_url, redis_url=own_servers.redis_url, reschedule_interval=0.05,
                        fair_start=0.0, kill_grace=0.3, launcher_heartbeat=0.2, session_timeout=20.0,
                        agent_heartbeat=0.2, agent_timeout=20.0)
    async with LocalStack(settings, {"c0": 4}) as stack:
        app = await Session.open(settings, kind="rigid")
        try:
            (gone,) = await app.request(RequestSpec(id="gone", type="non-preemptible", cluster="c0", nodes=1,
                                                    duration=1.0))
            await app.wait_start(gone, 10)
            start_sub, kill_sub = app._subs[1], app._subs[2]  # (the order _subscribe makes them in)
            await start_sub.unsubscribe()
            await kill_sub.unsubscribe()
            (missed,) = await app.request(RequestSpec(id="missed", type="non-preemptible", cluster="c0", nodes=2,
                                                      duration=600))
            # both happen unheard: "missed" starts, "gone" reaches its walltime
            def state(rid: str) -> str:
                r = stack.engine.cores.policy.requests.get(rid)
                return "ended" if r is None else r.state.value  # (the core forgets what ended)

            await wait_until(lambda: state(missed) == "started", 10, "the request to start")
            await wait_until(lambda: state(gone) == "ended", 10, "the other to end")
            assert missed not in app._started
            # and a process's exit, unheard too
            node = sorted(stack.engine.cores.allocator.nodes_of(missed))[0]
            exit_sub = app._subs[3]
            await exit_sub.unsubscribe()
            (pid,) = await app.launch(missed, node, ["sh", "-c", "exit 5"])
            await wait_until(lambda: any(ev.pid == pid for ev, _ in stack.agents["c0"]._recent_exits.get(node, ())),
                             10, "the process to end")
            # the allocator has acted (the agents know, the notifications went out unheard) once it recorded both
            for _ in range(200):
                told = await stack.allocator.redis.hgetall(keys.requests_of(app.app))
                if missed in told and '"ended":"walltime"' in told.get(gone, ""):
                    break
                await asyncio.sleep(0.05)  # polling Redis: nothing to wait on
            else:
                raise AssertionError(f"the allocator did not act: {told}")
            await asyncio.to_thread(restart, own_servers, NATS)
            start = await app.wait_start(missed, 30)
            assert len(start.nodes) == 2 and app.stats.recoveries >= 1
            killed = await next_of(app, Killed, 10, lambda e: e.request == gone)
            assert killed.reason == "walltime"
            (ex,) = await app.wait_exits(missed, 1, 10)
            assert (ex.pid, ex.code, ex.node) == (pid, 5, node)
            pids = await app.launch(missed, start.nodes[0], ["sh", "-c", "exit 0"])  # the agents have it too
            assert pids
        finally:
            await app.close()


async def test_the_node_allocators_records_wait_for_a_restarting_valkey(own_servers):
    """A decision that arrives while valkey is away waits for it (the allocator reads the session's token
    hash and writes its records there): once valkey is back, the agent has the assignment and the records
    (who holds which node, what the application was told) are written -- before, the decision was dropped
    with an error."""
    from coorm.shared import subjects
    from coorm.shared.events import NodesAssigned
    from coorm.shared.protocol import AllocatorDecisions

    settings = Settings(nats_url=own_servers.nats_url, redis_url=own_servers.redis_url, reschedule_interval=0.05,
                        kill_grace=0.3, agent_heartbeat=0.2, agent_timeout=20.0, leader_lease=1.0)
    async with LocalStack(settings, {"c0": 2}) as stack:
        args = await asyncio.to_thread(stop_server, own_servers, VALKEY)
        js = stack.allocator.nc.jetstream()
        decision = NodesAssigned(stimulus_id="outage", app="a999", request="during-outage", cluster="c0",
                                 nodes=("c0n1",))
        await js.publish(subjects.DECISIONS, bus.encode(AllocatorDecisions(decisions=[decision])))
        start_server(own_servers, VALKEY, args)
        await wait_until(lambda: (a := stack.agents["c0"].book.assignment("c0n1")) is not None
                         and a.request == "during-outage", 20, "the agent to hear of it")
        for _ in range(200):
            raw = await stack.allocator.redis.hget(keys.NODES, "c0n1")
            if raw and json.loads(raw)["request"] == "during-outage":
                break
            await asyncio.sleep(0.05)  # polled: the write happens when its retry finds valkey back
        else:
            raise AssertionError(raw)
        told = await stack.allocator.redis.hget(keys.requests_of("a999"), "during-outage")
        assert told is not None and json.loads(told)["nodes"] == ["c0n1"]
