"""The policy engine's lease is kept from the moment it is acquired, through the restore. On a loaded machine
the restore (replaying the event log, publishing the last decisions again) and the first views took longer
than a lease: it lapsed before its first renewal, the standby took it and restored in turn, and after a
Valkey failover the two engines took turns for a minute (``bench_ha.py``: "the lease is another's", a
session never opened). Real nats-server and Valkey; the engine is the real one, its restore held back by
the test for longer than a lease."""

from __future__ import annotations

import asyncio
import time

import nats.errors
import redis

from coorm.services.policy_engine.lease import LOOP_STALL
from coorm.services.policy_engine.service import PolicyEngine
from coorm.shared import keys
from coorm.shared.settings import Settings

LEASE = 0.6


class HeldRestore(PolicyEngine):
    """The real engine, whose restore waits for the test's word first (a restore as slow as the test likes)."""

    def __init__(self, settings: Settings, instance: str) -> None:
        super().__init__(settings, instance)
        self.restoring = asyncio.Event()
        self.go_on = asyncio.Event()

    async def _restore(self, lease=None) -> None:
        self.restoring.set()
        await self.go_on.wait()
        await super()._restore(lease)


async def test_a_restore_longer_than_the_lease_keeps_it(servers, redis_url):
    settings = Settings(nats_url=servers.nats_url, redis_url=redis_url, leader_lease=LEASE)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    first, second = HeldRestore(settings, "first"), PolicyEngine(settings, "second")
    stop = asyncio.Event()
    running = [asyncio.create_task(first.run(stop))]
    try:
        await asyncio.wait_for(first.restoring.wait(), 10)
        running.append(asyncio.create_task(second.run(stop)))  # a standby, trying for the lease meanwhile
        # the restore lasts four leases (the time that passes is what is tested: no event to wait on)
        await asyncio.sleep(4 * LEASE)
        assert r.get(keys.POLICY_LEASE) == "first"
        assert not second.leader.is_set()
        first.go_on.set()
        await asyncio.wait_for(first.leader.wait(), 10)
        # and the term it began goes on: four leases later it still leads, alone
        await asyncio.sleep(4 * LEASE)
        assert first.leader.is_set() and not second.leader.is_set()
        assert r.get(keys.POLICY_LEASE) == "first"
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 20)
        r.close()


class FailingTask(PolicyEngine):
    """The real engine, one of whose term's tasks fails at once (as a loop that met Valkey's failover did)."""

    async def _gauges_loop(self) -> None:
        raise RuntimeError("a task of the term failed")


async def test_a_term_whose_task_failed_still_takes_nothing_more_once_over(servers, redis_url):
    """Its lease taken by another, the leader steps down: its subscriptions go, whatever its tasks ended with
    (a term whose clean-up stopped at a failed task kept answering session opens it could not log)."""
    from coorm.shared import bus, subjects
    from coorm.shared.endpoints import Role
    from coorm.shared.protocol import SessionOpen, SessionOpenReply
    from tests.live.roles import ME

    settings = Settings(nats_url=servers.nats_url, redis_url=redis_url, leader_lease=LEASE)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    engine = FailingTask(settings, "failing")
    stop = asyncio.Event()
    running = asyncio.create_task(engine.run(stop))
    nc = await bus.connect(servers.nats_url, "app", settings.identity(Role.LAUNCHER))
    try:
        await asyncio.wait_for(engine.leader.wait(), 10)
        r.set(keys.POLICY_LEASE, "another", px=60_000)  # another instance took over
        while engine.leader.is_set():
            await asyncio.sleep(0.05)  # polling the engine's state: nothing to wait on
        # nobody serves opens now (the other instance is not running): no responders, not this term's handler
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                await bus.call(nc, subjects.session_open(ME), SessionOpen(), SessionOpenReply, timeout=2)
                raise AssertionError("a session was opened by a leader that stepped down")
            except bus.WireError as e:  # ("changing leader": the term's handler is still subscribed)
                assert asyncio.get_running_loop().time() < deadline, f"the old term still answers: {e}"
                await asyncio.sleep(0.1)  # its clean-up may still be under way
            except nats.errors.NoRespondersError:
                break
    finally:
        stop.set()
        r.delete(keys.POLICY_LEASE)
        await asyncio.wait_for(running, 20)
        await bus.shutdown(nc)
        r.close()


def _busy(seconds: float) -> None:
    """Hold the event loop with Python work (the GIL passes to other threads every few ms, as it did under the
    load that made the leases lapse: 5,000 submissions' handling queued in the loop)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


class _TermWatch(asyncio.Event):
    """An engine's ``leader`` event that tells ``ended`` when its term ends (the event is cleared)."""

    def __init__(self, ended: asyncio.Event) -> None:
        super().__init__()
        self._ended = ended

    def clear(self) -> None:
        super().clear()
        self._ended.set()


async def _leader_and_standby(settings: Settings):
    first, second = PolicyEngine(settings, "first"), PolicyEngine(settings, "second")
    stop = asyncio.Event()
    running = [asyncio.create_task(first.run(stop))]
    await asyncio.wait_for(first.leader.wait(), 10)
    running.append(asyncio.create_task(second.run(stop)))
    return first, second, stop, running


async def test_a_leader_whose_loop_is_held_busy_longer_than_its_lease_keeps_it(servers, redis_url):
    """The lease is renewed from a thread: a leader whose event loop is busy for four leases keeps it, and the
    standby, trying all along, never leads (renewed from the loop, it lapsed: under 5,000 sessions' load the two
    engines took turns, docs/scale.md). Real nats-server and Valkey, the real engines."""
    settings = Settings(nats_url=servers.nats_url, redis_url=redis_url, leader_lease=LEASE)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    first, second, stop, running = await _leader_and_standby(settings)
    try:
        for _ in range(3):
            _busy(4 * LEASE)  # the loop held: no task of it runs meanwhile
            assert r.get(keys.POLICY_LEASE) == "first"
            await asyncio.sleep(LEASE)  # the loop runs again (the time that passes is what is tested)
        assert first.leader.is_set() and not second.leader.is_set()
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 20)
        r.close()


async def test_a_leader_whose_loop_is_wedged_lets_its_lease_lapse(servers, redis_url):
    """A loop that does not run for LOOP_STALL leases is wedged: the thread stops renewing and the lease lapses
    (a standby elsewhere takes over). When the loop runs again the term ends, and one engine leads, holding the
    lease (either: the one that lost it tries for it again as a standby does)."""
    settings = Settings(nats_url=servers.nats_url, redis_url=redis_url, leader_lease=LEASE)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    first, second, stop, running = await _leader_and_standby(settings)
    # the first term's end, seen as it happens: polling ``leader`` missed it when the engine, back to standby,
    # took the lapsed lease again within the poll's 10 ms (CI, 28 November)
    ended = asyncio.Event()
    first.leader = _TermWatch(ended)
    first.leader.set()
    try:
        end = time.monotonic() + (LOOP_STALL + 4) * LEASE
        while time.monotonic() < end and r.get(keys.POLICY_LEASE) == "first":
            _busy(LEASE / 10)  # (the loop still held: Valkey is asked from here)
        assert r.get(keys.POLICY_LEASE) is None, "the lease was renewed for a loop that did not run"
        await asyncio.wait_for(ended.wait(), 10)
        deadline = time.monotonic() + 10
        while not (first.leader.is_set() or second.leader.is_set()):
            assert time.monotonic() < deadline, "no engine leads after the lapse"
            await asyncio.sleep(0.05)
        leading = [e for e in (first, second) if e.leader.is_set()]
        assert len(leading) == 1 and r.get(keys.POLICY_LEASE) == leading[0].instance
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True), 20)
        r.close()
