"""The node allocator's decision stream under poison: a message it cannot act on is set aside -- a
``DeadLetter`` on ``deadletter.COORM_DECISIONS``, counted, never delivered again -- and it goes on acting on the
next decisions. (Deep nesting once raised a RecursionError in the consumer's callback: the message was never
acknowledged, and came back for ever.) And agents' heartbeats: answered when they ask, heard either way."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import REGISTRY

from coorm.services.node_allocator.service import NodeAllocatorService
from coorm.services.runtime import ensure_streams
from coorm.services.stack import wait_until
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.events import EndReason, EndRequest
from coorm.shared.protocol import Ack, AgentHeartbeat, AllocatorDecisions, DeadLetter, KillNotify
from coorm.shared.requests import RequestType
from coorm.shared.settings import Settings

DEADLINE = 15.0  # seconds any condition below may take
DURABLE = "node-allocator"  # the allocator's consumer: its name


@pytest.fixture
async def allocator(servers, redis_url):
    """A node allocator alone, on a purged decision stream, and a connection to watch what it publishes."""
    nc = await bus.connect(servers.nats_url, "test-allocator", Settings().identity(Role.SERVICE))
    js = nc.jetstream()
    await ensure_streams(js, 1)
    await js.purge_stream(subjects.DECISIONS_STREAM)
    with contextlib.suppress(Exception):
        await js.delete_consumer(subjects.DECISIONS_STREAM, DURABLE)
    service = NodeAllocatorService(Settings(nats_url=servers.nats_url, redis_url=redis_url), name=DURABLE)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    ready = asyncio.create_task(service.ready.wait())
    await asyncio.wait([task, ready], timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED)
    if not service.ready.is_set():
        ready.cancel()
        stop.set()
        await asyncio.gather(task, ready, return_exceptions=True)
        raise AssertionError("the node allocator did not start")
    try:
        yield js, nc, service
    finally:
        stop.set()
        await asyncio.wait_for(task, DEADLINE)
        await bus.shutdown(nc)


def dead_lettered() -> float:
    return REGISTRY.get_sample_value("coorm_dead_letters_total", {"stream": subjects.DECISIONS_STREAM}) or 0.0


async def test_a_message_that_is_no_decision_is_set_aside_and_the_next_is_acted_on(allocator):
    js, nc, _ = allocator
    letters: asyncio.Queue = asyncio.Queue()
    kills: asyncio.Queue = asyncio.Queue()
    await nc.subscribe(subjects.deadletter(subjects.DECISIONS_STREAM), cb=letters.put)
    me = Settings().identity(Role.LAUNCHER)  # the application's user: the one who may hear of its end
    assert me is not None
    app = subjects.app_id(me.name, 1)
    user_nc = await bus.connect(nc.connected_url.geturl(), "test-user", me)
    await user_nc.subscribe(subjects.notify_kill(app), cb=kills.put)
    await bus.settled(user_nc)
    await bus.settled(nc)
    before = dead_lettered()
    poison = [b"[" * 50_000 + b"]" * 50_000, b'{"decisions": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
              b'{"decisions": []}', b"not JSON", b'{"decisions": [{"kind": "teleport"}]}']
    seqs = [(await js.publish(subjects.DECISIONS, data)).seq for data in poison]
    letters_got = [DeadLetter.model_validate_json((await asyncio.wait_for(letters.get(), DEADLINE)).data)
                   for _ in poison]
    # and the next decision is acted on: the application hears of its request's end
    end = EndRequest(stimulus_id="e1", app=app, request="r1", type=RequestType.NON_PREEMPTIBLE, cluster="c0",
                     nodes=2, started=True, reason=EndReason.DONE, at=1_700_000_000.0)
    last = (await js.publish(subjects.DECISIONS, bus.encode(AllocatorDecisions(decisions=[end])))).seq
    kill = KillNotify.model_validate_json((await asyncio.wait_for(kills.get(), DEADLINE)).data)
    assert (kill.request, kill.reason) == ("r1", EndReason.DONE)
    await bus.shutdown(user_nc)

    assert sorted(x.sequence for x in letters_got) == seqs
    assert {(x.stream, x.consumer, x.subject, x.deliveries) for x in letters_got} == {
        (subjects.DECISIONS_STREAM, DURABLE, subjects.DECISIONS, 1)}
    assert all("not a decision message" in x.error for x in letters_got)
    assert dead_lettered() == before + len(poison)
    # every message acknowledged or terminated: nothing waits to come again
    info = await until(lambda: acked(js, last), "the allocator to go past every message")
    assert (info.num_ack_pending, info.num_redelivered) == (0, 0)


async def test_a_handling_that_never_returns_or_is_cancelled_from_within_stops_no_later_decision(allocator):
    """The stall seen after a Valkey failover: one decision's handling that never returned held every later
    one (delivered, never acknowledged, nothing logged); and a CancelledError raised from inside a client
    library ends the subscription's delivery loop without a word. Both are faults injected here into the real
    allocator's handling of its first two deliveries: the message comes again and is acted on, and so is
    the one behind it."""
    js, nc, service = allocator
    service.act_bound = 1.0
    real = service._act_on
    deliveries: list[str] = []

    async def faulty(decisions):
        deliveries.append(decisions[0].request)
        if len(deliveries) == 1:
            await asyncio.Event().wait()  # a Redis call that never returns
        if len(deliveries) == 2:
            raise asyncio.CancelledError  # not the allocator's own cancellation
        await real(decisions)

    service._act_on = faulty
    me = Settings().identity(Role.LAUNCHER)
    assert me is not None
    app = subjects.app_id(me.name, 2)
    kills: asyncio.Queue = asyncio.Queue()
    user_nc = await bus.connect(nc.connected_url.geturl(), "test-user", me)
    await user_nc.subscribe(subjects.notify_kill(app), cb=kills.put)
    await bus.settled(user_nc)
    ends = [EndRequest(stimulus_id=f"e{i}", app=app, request=f"r{i}", type=RequestType.NON_PREEMPTIBLE,
                       cluster="c0", nodes=1, started=True, reason=EndReason.DONE, at=1_700_000_000.0 + i)
            for i in (1, 2)]
    seqs = [(await js.publish(subjects.DECISIONS, bus.encode(AllocatorDecisions(decisions=[e])))).seq
            for e in ends]
    told = [KillNotify.model_validate_json((await asyncio.wait_for(kills.get(), DEADLINE)).data).request
            for _ in ends]
    await bus.shutdown(user_nc)
    assert told == ["r1", "r2"]  # in order, the first after its two failed deliveries
    assert deliveries == ["r1", "r1", "r1", "r2"]
    await until(lambda: acked(js, seqs[-1]), "the allocator to go past every message")


async def acked(js, seq: int):
    info = await js.consumer_info(subjects.DECISIONS_STREAM, DURABLE)
    return info if info.ack_floor.stream_seq >= seq else None


async def until(condition, what: str):
    """Poll ``condition`` (a coroutine function) until it gives something truthy; fail after DEADLINE."""
    deadline = time.monotonic() + DEADLINE
    while not (value := await condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)  # poll interval of a deadline loop (the server's state has no event)
    return value


async def test_a_heartbeat_is_answered_when_it_asks_and_heard_either_way(allocator, servers):
    """A heartbeat with a reply subject is answered ``Ack`` -- an agent's sign that its NATS server reaches
    the allocator -- whether the allocator knows the agent or not (then it asks it to register); one
    published without, as an agent older than the answer sends it, is heard the same."""
    _, _, service = allocator
    agent = await bus.connect(servers.nats_url, "test-agent", Settings().identity(Role.AGENT))
    try:
        hello = await agent.subscribe(subjects.AGENT_HELLO)
        await bus.settled(agent)
        hb = AgentHeartbeat(agent="agent-t", nodes=["tn0"], processes=3)
        assert await bus.call(agent, subjects.AGENT_HEARTBEAT, hb, Ack, timeout=DEADLINE) == Ack()
        await hello.next_msg(DEADLINE)  # not known: asked to register
        service.agents["agent-t"] = {"cluster": "c0", "nodes": ["tn0"], "last_seen": 0.0, "up": True}
        assert await bus.call(agent, subjects.AGENT_HEARTBEAT, hb, Ack, timeout=DEADLINE) == Ack()
        assert service.agents["agent-t"]["processes"] == 3 and service.agents["agent-t"]["last_seen"] > 0
        await agent.publish(subjects.AGENT_HEARTBEAT, bus.encode(hb.model_copy(update={"processes": 4})))
        await wait_until(lambda: service.agents["agent-t"].get("processes") == 4, DEADLINE,
                         "a heartbeat published without a reply subject heard")
    finally:
        await bus.shutdown(agent)
