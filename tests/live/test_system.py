"""The paper's interactions end to end on the live system: a real nats-server and valkey-server, the
services (in this process, talking only over NATS and Redis), agents running real processes, launchers
through the SDK."""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager

import pytest

from coorm.launchers.live import LiveRunner
from coorm.launchers.psa import PSALauncher
from coorm.launchers.sdk import Closed, Exited, Killed, Session, Started, ViewsChanged
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import bus, subjects, tasks
from coorm.shared.protocol import StatusQuery, StatusReply
from coorm.shared.requests import RequestSpec
from coorm.shared.settings import Settings
from tests.live.leaders import leader_and_standby
from tests.live.test_agent import group_gone


def _settings(servers, **kw) -> Settings:
    base = dict(nats_url=servers.nats_url, redis_url=servers.redis_url, reschedule_interval=0.05, fair_start=0.5,
                preempt_grace=1.0, kill_grace=0.3, launcher_heartbeat=0.2, session_timeout=5.0,
                agent_heartbeat=0.2, agent_timeout=2.0)
    base.update(kw)
    return Settings(**base)


@pytest.fixture
async def stack(servers, redis_url, request):
    kw = getattr(request, "param", {})
    clusters = kw.pop("clusters", {"c0": 16, "c1": 8})
    settings = _settings(servers, **kw)
    async with LocalStack(settings, clusters) as s:
        yield s


def rq(rid, cluster, nodes, duration=None, type="non-preemptible", to=None, how="FREE") -> RequestSpec:
    return RequestSpec(id=rid, type=type, cluster=cluster, nodes=nodes, duration=duration, related_to=to,
                       related_how=how)


async def next_of(session: Session, kind, timeout: float = 10.0, pred=lambda e: True):
    while True:
        ev = await session.next_event(timeout)
        if isinstance(ev, kind) and pred(ev):
            return ev


# ==================================================================================================
# CooRM Fig. 4: one application, from subscribe to done
# ==================================================================================================
async def test_coorm_fig4_single_application_interaction(stack):
    settings = stack.settings
    async with await Session.open(settings, kind="rigid", name="fig4") as app:
        # (2) the views of every cluster: everything free
        views = await app.wait_views()
        assert views.non_preemptive["c0"].value_at(app.now) == 16
        assert views.non_preemptive["c1"].value_at(app.now) == 8
        info = await app.clusters_info()
        assert {c.id: c.nodes for c in info.clusters} == {"c0": 16, "c1": 8}
        # (5) the launcher selects from its view and requests; (8) startNotify with 12 node IDs of c0
        assert views.non_preemptive["c0"].earliest_fit(12, 600, app.now) == app.now
        (rid,) = await app.request(rq("r", "c0", 12, 600))
        start = await app.wait_start(rid, 10)
        assert len(start.nodes) == 12 and all(n.startswith("c0n") for n in start.nodes)
        assert start.end is not None and start.end > app.now
        # the application deploys its processes on the granted nodes, through their agents
        pids = {}
        for node in start.nodes:
            (pids[node],) = await app.launch(rid, node, ["sleep", "1000"])
        # (10) done: the RMS has the agents kill what still runs there; the nodes come back after fair-start
        await app.done(rid)
        exits = await app.wait_exits(rid, 12, 10)
        assert {e.node for e in exits} == set(start.nodes) and all(e.killed for e in exits)
        assert all(group_gone(p) for p in pids.values())
        async with await Session.open(settings, kind="rigid", name="late") as late:
            v = (await late.wait_views()).non_preemptive["c0"]
            # held for fair-start now (the hold may also have ended already if the machine is slow)
            assert v.value_at(late.now) in (4, 16) and v.value_at(late.now + settings.fair_start + 0.01) == 16


async def test_a_filter_limits_the_views_to_its_clusters(stack):
    """``subscribe`` with a filter: the application hears only of the clusters it asked for, in its first
    views and in later changes."""
    settings = stack.settings
    async with await Session.open(settings, clusters=["c1"], name="only-c1") as app, \
            await Session.open(settings, name="all") as other:
        assert set((await app.wait_views()).non_preemptive) == {"c1"}
        await other.wait_views()
        (r0,) = await other.request(rq(other.rid("r0"), "c0", 4, 600))
        (r1,) = await other.request(rq(other.rid("r1"), "c1", 3, 600))
        await other.wait_start(r0, 10)
        await other.wait_start(r1, 10)
        ev = await next_of(app, ViewsChanged, pred=lambda e: e.views.non_preemptive["c1"].value_at(app.now) == 5)
        assert set(ev.views.non_preemptive) == {"c1"}
        assert set(app.np) == {"c1"}


async def test_a_process_outlives_its_walltime_and_is_killed(stack):
    async with await Session.open(stack.settings, kind="rigid") as app:
        (rid,) = await app.request(rq("w", "c1", 2, 1.0))
        start = await app.wait_start(rid, 10)
        pids = [(await app.launch(rid, n, ["sh", "-c", "trap '' TERM; sleep 1000"]))[0] for n in start.nodes]
        killed = await next_of(app, Killed, 10)
        assert killed.request == rid and killed.reason == "walltime"
        exits = await app.wait_exits(rid, 2, 10)
        assert all(e.killed for e in exits) and all(group_gone(p) for p in pids)


# ==================================================================================================
# CooRMv2 Fig. 8: an NEA grows inside its pre-allocation, the malleable PSA really gives nodes back
# ==================================================================================================
@pytest.mark.parametrize("stack", [{"clusters": {"c0": 20}, "preempt_grace": 5.0}], indirect=True)
async def test_coormv2_fig8_psa_releases_nodes_and_its_processes_stop(stack):
    settings = stack.settings
    nea = await Session.open(settings, kind="amr", name="nea")
    psa_session = await Session.open(settings, kind="psa", name="psa")
    run = None
    try:
        await nea.wait_views()
        await nea.request(rq("pa", "c0", 12, 10_000, type="pre-allocation"), rq("n1", "c0", 4, 5_000))
        n1 = await nea.wait_start("n1", 10)
        assert len(n1.nodes) == 4
        # the malleable application follows its preemptive view: the pre-allocated but unused nodes and the
        # free ones; it runs a process on every node it gets
        psa = PSALauncher(psa_session.app, "c0", task_duration=60.0)
        runner = LiveRunner(psa_session, psa, command=["sleep", "1000"])
        run = asyncio.create_task(runner.run())
        await wait_until(lambda: psa._held() == 16 and runner.result.processes == 16, what="the PSA on 16 nodes")
        psa_nodes = {n for nodes in psa.running.values() for n in nodes}
        # the NEA grows to 10 inside its pre-allocation (spontaneous update): 6 of the PSA's nodes must go
        await nea.update("n1", rq("n2", "c0", 10, 4_000))
        n2 = await nea.wait_start("n2", 10)
        taken = set(n2.nodes) - set(n1.nodes)
        assert len(taken) == 6 and taken <= psa_nodes  # exactly nodes the PSA held
        await wait_until(lambda: psa._held() == 10, what="the PSA down to 10 nodes")
        assert psa.killed == 6 and not taken & {n for nodes in psa.running.values() for n in nodes}
        # the PSA's processes on those nodes really stopped, and only those
        await wait_until(lambda: {e.node for es in psa_session._exits.values() for e in es} >= taken,
                         what="the PSA's processes on the released nodes to exit")
        killed = [e for es in psa_session._exits.values() for e in es]
        assert all(e.killed for e in killed) and {e.node for e in killed} == taken
    finally:
        await psa_session.close()
        if run is not None:
            await asyncio.wait_for(run, 10)
        await nea.close()


async def test_status_partitions_the_nodes_while_applications_run(stack):

    settings = stack.settings
    a = await Session.open(settings, kind="amr", name="nea")
    p = await Session.open(settings, kind="psa", name="psa")
    w = await Session.open(settings, kind="moldable", name="waits", preemptive_views=False)  # may re-select
    try:
        await a.request(rq("pa", "c0", 10, 600, type="pre-allocation"), rq("in", "c0", 3, 300),
                        rq("x", "c1", 2, 300))
        await a.wait_start("in", 10)
        await a.wait_start("x", 10)
        await w.request(rq("all", "c1", 8, 600))  # waits behind x
        await p.wait_views()
        while p.views.preemptive["c0"].value_at(p.now) != 13:  # (a view from before a's requests started)
            await next_of(p, ViewsChanged)
        await p.request(rq("m", "c0", p.views.preemptive["c0"].value_at(p.now), type="preemptible"))
        m = await p.wait_start("m", 10)
        await a.done("x")
        st = await bus.call(stack.allocator.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply)
        by = {c.cluster: c for c in st.clusters}
        for c in st.clusters:
            assert c.non_preemptible + c.pre_allocated_unused + c.preemptible + c.held + c.idle == c.up
        assert by["c0"].non_preemptible == 3 and by["c0"].preemptible == len(m.nodes) == 13
        assert by["c1"].held == 2  # x's nodes, for fair-start: an application waits that may re-select
    finally:
        await a.close()
        await p.close()
        await w.close()


@pytest.mark.parametrize("stack", [{"reschedule_interval": 0.0, "fair_start": 0.0}], indirect=True)
async def test_the_node_records_follow_the_allocations(stack, redis_url):
    """What ``coorm nodes`` shows: a node's record names the request that holds it, also when one pass frees
    it from a request and gives it to the next; an ended request's allocation record goes."""
    import json

    import redis

    from coorm.shared import keys

    r = redis.Redis.from_url(redis_url, decode_responses=True)

    def owners(cluster: str) -> dict[str, str | None]:
        return {n: rec.get("request") for n, rec in ((n, json.loads(v)) for n, v in r.hgetall(keys.NODES).items())
                if rec["cluster"] == cluster}

    try:
        async with await Session.open(stack.settings, kind="rigid") as app:
            (first,) = await app.request(rq("first", "c1", 8, 600))
            (second,) = await app.request(rq("second", "c1", 8, 600))
            start = await app.wait_start(first, 10)
            await wait_until(lambda: set(owners("c1").values()) == {first}, timeout=10, what="first's nodes")
            assert json.loads(r.hget(keys.allocation(first), "nodes")) == list(start.nodes)
            await app.done(first)  # the same pass frees the nodes and gives them to "second"
            start2 = await app.wait_start(second, 10)
            assert sorted(start2.nodes) == sorted(start.nodes)
            await wait_until(lambda: set(owners("c1").values()) == {second} and not r.exists(keys.allocation(first)),
                             timeout=10, what="second's nodes")
            await app.done(second)
            await wait_until(lambda: set(owners("c1").values()) == {None} and not r.exists(keys.allocation(second)),
                             timeout=10, what="free nodes")
    finally:
        r.close()


# ==================================================================================================
# preemption: a violator that ignores its shrink is killed after the grace
# ==================================================================================================
@pytest.mark.parametrize("stack", [{"clusters": {"c0": 8}, "preempt_grace": 0.5}], indirect=True)
async def test_a_violator_that_ignores_its_shrink_is_killed_after_the_grace(stack):
    settings = stack.settings
    first = await Session.open(settings, kind="rigid", name="first")  # opened first: higher priority
    mal = await Session.open(settings, kind="malleable", name="ignores")
    await mal.wait_views()
    await mal.request(rq("m", "c0", 8, type="preemptible"))
    m = await mal.wait_start("m", 10)
    pids = [(await mal.launch("m", n, ["sleep", "1000"]))[0] for n in m.nodes]
    (rid,) = await first.request(rq("r", "c0", 6, 60))
    # mal's preemptive view drops to 2; it does nothing
    drop = await next_of(mal, ViewsChanged, 10, lambda e: e.views.preemptive["c0"].value_at(e.views.now) == 2)
    assert drop is not None
    killed = await next_of(mal, Killed, 10)
    assert killed.request == "m" and killed.reason == "violation"
    start = await first.wait_start(rid, 10)
    assert len(set(start.nodes) & set(m.nodes)) == 6
    exits = await mal.wait_exits("m", 8, 10)
    assert all(e.killed for e in exits) and all(group_gone(p) for p in pids)
    assert mal.app not in stack.engine.cores.policy.apps  # its session was ended
    await first.close()
    await mal.close()


# ==================================================================================================
# liveness: a launcher that vanished is reaped
# ==================================================================================================
@pytest.mark.parametrize("stack", [{"clusters": {"c0": 4}, "session_timeout": 1.0}], indirect=True)
async def test_a_launcher_that_vanished_is_reaped_and_its_processes_killed(stack):
    settings = stack.settings
    gone = await Session.open(settings, kind="rigid", name="vanishes")
    (rid,) = await gone.request(rq("g", "c0", 4, 3600))
    start = await gone.wait_start(rid, 10)
    pids = [(await gone.launch(rid, n, ["sleep", "1000"]))[0] for n in start.nodes]
    watcher = await Session.open(settings, kind="rigid", name="watcher")
    await tasks.cancelled(gone._heartbeat)  # the launcher stops talking (as if its host died)
    await wait_until(lambda: gone.app not in stack.engine.cores.policy.apps, timeout=10, what="the reaping")
    await wait_until(lambda: all(group_gone(p) for p in pids), timeout=10, what="its processes to die")
    v = await next_of(watcher, ViewsChanged, 10, lambda e: e.views.non_preemptive["c0"].value_at(e.views.now) > 0)
    assert v is not None
    await watcher.close()
    await gone.close()


# ==================================================================================================
# an accepted request survives the policy engine's leader being killed
# ==================================================================================================
@pytest.mark.parametrize("snapshot_every", [0, 2])
async def test_a_standby_takes_over_without_losing_an_accepted_request(servers, redis_url, tmp_path, snapshot_every):
    """The leader is a real process, killed with SIGKILL: no goodbye, its lease in Redis lapses. Without
    snapshots the standby replays the whole event log; with a snapshot every 2 events it loads the last
    snapshot and replays the (trimmed) log after it."""
    from coorm.shared import keys

    settings = _settings(servers, leader_lease=1.0, snapshot_every=snapshot_every)
    env = dict(COORM_LEADER_LEASE="1.0", COORM_RESCHEDULE_INTERVAL="0.05", COORM_FAIR_START="0.5",
               COORM_SNAPSHOT_EVERY=str(snapshot_every), COORM_CONNECTION_FILE=str(tmp_path / "none.json"))
    async with leader_and_standby(servers, settings, env) as pair:
        standby, r = pair.standby, pair.redis
        async with LocalStack(settings, {"c1": 8}, with_engine=False) as stack:
            assert stack.parts.keys() == {"node-allocator", "view-publisher"}
            app = await Session.open(settings, kind="rigid")
            (busy,) = await app.request(rq("busy", "c1", 8, 3600))
            await app.wait_start(busy, 10)
            (queued,) = await app.request(rq("queued", "c1", 8, 60))  # accepted, waiting behind "busy"
            assert not standby.leader.is_set()
            if snapshot_every:
                # the reply leaves before the batch's snapshot is written: wait for the leader to catch up,
                # reading the counter, the snapshot and the log in one transaction
                def log_state():
                    with r.pipeline(transaction=True) as pipe:
                        logged, snapped, kept = pipe.get(keys.EVENT_SEQ).hget(keys.SNAPSHOT, "events") \
                            .xlen(keys.EVENT_LOG).execute()
                    return int(logged), int(snapped or 0), kept

                await wait_until(lambda: log_state()[2] < snapshot_every, timeout=10, what="a trimmed event log")
                logged, snapped, kept = log_state()
                assert 0 < snapped <= logged and kept == logged - snapped  # the log holds what follows it
            else:
                logged = int(r.get(keys.EVENT_SEQ))
                assert not r.exists(keys.SNAPSHOT) and r.xlen(keys.EVENT_LOG) == logged
            pair.kill_leader()
            await asyncio.wait_for(standby.leader.wait(), 10)
            assert "queued" in standby.cores.policy.requests  # replayed from the event log
            assert standby.cores.policy.requests["busy"].state.value == "started"
            await app.done(busy)  # the SDK's commands reach the new leader
            start = await app.wait_start(queued, 10)
            assert len(start.nodes) == 8
            await app.close()


# ==================================================================================================
# a leader whose lease renewal hangs stops leading when its lease could lapse
# ==================================================================================================
async def test_a_leader_whose_renewal_hangs_stops_leading_when_its_lease_could_lapse(servers, redis_url):
    """Valkey stopped (SIGSTOP: its connections hang, as a dead primary's do until the socket's 10 s
    timeout): the leader's renewal gets no answer, and the leader ends its term once its lease could have
    lapsed -- another may hold it by then -- not when the socket gives up. (In bench_ha the stale term went on
    answering heartbeats for seconds while the next leader reaped the sessions it did not hear.) Continued,
    Valkey has the lease lapsed, and the engine leads again."""
    import signal

    named = getattr(servers, "named_procs", None)
    if named is None:
        pytest.skip("the servers are containers: no Valkey process of ours to stop")
    valkey = named()["valkey"]
    settings = _settings(servers, leader_lease=1.0)
    async with LocalStack(settings, {"c0": 2}) as stack:
        engine = stack.engine
        await wait_until(lambda: engine.leader.is_set(), 10, "a leader")
        os.kill(valkey.pid, signal.SIGSTOP)
        try:
            # (well before the socket's timeout, 10 s: a lease and its renewal period, with room for load)
            await wait_until(lambda: not engine.leader.is_set(), 3 * settings.leader_lease, "the term's end")
        finally:
            os.kill(valkey.pid, signal.SIGCONT)
        await wait_until(lambda: engine.leader.is_set(), 30, "leading again")
        async with await Session.open(settings, kind="rigid") as app:  # and it answers
            (rid,) = await app.request(rq("after", "c0", 2, 60))
            assert len((await app.wait_start(rid, 10)).nodes) == 2


# ==================================================================================================
# a preemption deadline that passes while no leader runs is no violation
# ==================================================================================================
@asynccontextmanager
async def _shrink_asked(servers, tmp_path):
    """A leader and a standby (3 s lease, 2 s ``preempt_grace``); a malleable application holding the 8 nodes
    of c0 preemptibly, asked to give 6 back to a rigid request: (the pair, the rigid session, the malleable
    one, the rigid request's id). Both sessions closed at the end."""
    settings = _settings(servers, leader_lease=3.0, preempt_grace=2.0, fair_start=0.0)
    env = dict(COORM_LEADER_LEASE="3.0", COORM_RESCHEDULE_INTERVAL="0.05", COORM_FAIR_START="0",
               COORM_PREEMPT_GRACE="2.0", COORM_CONNECTION_FILE=str(tmp_path / "none.json"))
    async with leader_and_standby(servers, settings, env) as pair, \
            LocalStack(settings, {"c0": 8}, with_engine=False):
        first = await Session.open(settings, kind="rigid", name="first", views=False)  # opened first: priority
        sweep = await Session.open(settings, kind="psa", name="sweep")
        await sweep.wait_views()
        await sweep.request(rq("m", "c0", 8, type="preemptible"))
        await sweep.wait_start("m", 10)
        (rid,) = await first.request(rq("r", "c0", 6, 60))
        await next_of(sweep, ViewsChanged, 10, lambda e: e.views.preemptive["c0"].value_at(e.views.now) == 2)
        yield pair, first, sweep, rid
        await first.close()
        await sweep.close()


def _told_no_violation(sweep: Session) -> None:
    """What ``sweep`` was told: its own done, no violation, no end."""
    while not sweep._events.empty():
        ev = sweep._events.get_nowait()
        assert not isinstance(ev, Closed) and not (isinstance(ev, Killed) and ev.reason != "done"), ev


async def test_a_shrink_asked_as_the_leader_dies_is_answered_to_the_next_one_without_a_violation(servers, redis_url,
                                                                                                  tmp_path):
    """A malleable application is asked to give nodes back (a preemption deadline, ``preempt_grace`` 2 s)
    and the leader is SIGKILLed at once: its ``done`` waits for the standby, which leads only after the
    leader's 3 s lease -- past the deadline. The time without a leader is not the application's: the new
    leader gives it its grace again, the ``done`` is taken and its session lives on (bench_ha's parameter
    sweeps found their sessions ended after the Valkey failover: "protocol violation", no reaping)."""
    async with _shrink_asked(servers, tmp_path) as (pair, first, sweep, rid):
        pair.kill_leader()
        await sweep.done("m")  # answered by the standby, once it leads
        assert pair.standby.leader.is_set()
        assert len((await first.wait_start(rid, 15)).nodes) == 6
        assert sweep.app in pair.standby.cores.policy.apps  # its session was not ended
        (more,) = await sweep.request(rq("m2", "c0", 2, type="preemptible"))
        assert len((await sweep.wait_start(more, 10)).nodes) == 2
        _told_no_violation(sweep)


async def test_a_done_lost_with_the_leader_is_sent_again_within_the_grace_a_take_over_gives(servers, redis_url,
                                                                                             tmp_path):
    """The shrink's ``done`` reaches the leader as it dies (stopped, then SIGKILLed): nobody answers it, and the
    SDK sends it again only after ``bus.RESEND_AFTER`` (5 s) -- past the 2 s grace a take-over gave before,
    which ended the session as a violation (CI, 28 November). The take-over's grace covers the resend."""
    import signal

    async with _shrink_asked(servers, tmp_path) as (pair, first, sweep, rid):
        os.killpg(pair.leader.pid, signal.SIGSTOP)  # it takes the done off its socket no more
        sent = sweep.stats.messages_sent
        done = asyncio.create_task(sweep.done("m"))
        while sweep.stats.messages_sent == sent:
            await asyncio.sleep(0)  # (the task sends it)
        await sweep.nc.flush()  # the server has it, and has given it to the stopped leader
        pair.kill_leader()
        await asyncio.wait_for(done, 20)  # answered by the standby, after the resend
        assert sweep.app in pair.standby.cores.policy.apps  # its session was not ended
        assert len((await first.wait_start(rid, 15)).nodes) == 6
        _told_no_violation(sweep)


# ==================================================================================================
# a leader that lost its lease: it logs nothing more, and keeps nothing for a later term
# ==================================================================================================
def _lease_taken(settings: Settings):
    """Another instance's lease, as if it had taken over while this leader's renewal was not yet due."""
    import redis

    from coorm.shared import keys

    r = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    r.set(keys.POLICY_LEASE, "another", px=60_000)
    return r


@pytest.mark.parametrize("stack", [{"clusters": {"c0": 4}, "leader_lease": 1.0}], indirect=True)
async def test_a_leader_whose_lease_another_took_appends_nothing_to_the_log(stack):
    from coorm.shared import keys

    engine = stack.engine
    async with await Session.open(stack.settings, kind="rigid") as app:
        r = _lease_taken(stack.settings)
        try:
            logged = r.get(keys.EVENT_SEQ)
            entries = r.xlen(keys.EVENT_LOG)
            # the SDK retries `unavailable` and no responders: its request waits for a leader
            asking = asyncio.create_task(app.request(rq("r", "c0", 1, 60)))
            await wait_until(lambda: not engine.leader.is_set(), timeout=10, what="the leader to step down")
            assert (r.get(keys.EVENT_SEQ), r.xlen(keys.EVENT_LOG)) == (logged, entries)
            assert not asking.done()
            r.delete(keys.POLICY_LEASE)  # the other instance is gone: this one leads again
            (rid,) = await asyncio.wait_for(asking, 30)
            await app.wait_start(rid, 10)
            assert "r" in engine.cores.policy.requests
        finally:
            r.close()


@pytest.mark.parametrize("stack", [{"clusters": {"c0": 4}, "leader_lease": 1.0}], indirect=True)
async def test_an_event_offered_after_the_leader_stepped_down_is_refused_not_kept_for_a_later_term(stack):
    """A handler that was awaiting Redis while its leader stepped down (a session's record being written):
    its event is refused at once, not applied by the next term after the state was rebuilt without it."""
    from coorm.shared import keys
    from coorm.shared.events import ErrorCode, OpenSession

    engine = stack.engine
    r = _lease_taken(stack.settings)
    try:
        await wait_until(lambda: not engine.leader.is_set(), timeout=10, what="the leader to step down")
        late = engine.apply(lambda at, sid: OpenSession(at=at, stimulus_id=sid, app="late.a1", user="late"))
        with pytest.raises(bus.WireError) as e:
            await asyncio.wait_for(late, 5)
        assert e.value.code is ErrorCode.UNAVAILABLE
        r.delete(keys.POLICY_LEASE)
        await asyncio.wait_for(engine.leader.wait(), 10)
        async with await Session.open(stack.settings, kind="rigid") as app:  # the next term works
            (rid,) = await app.request(rq("r", "c0", 1, 60))
            await app.wait_start(rid, 10)
        assert "late.a1" not in engine.cores.policy.apps
    finally:
        r.close()


# ==================================================================================================
# output and exit codes reach the launcher
# ==================================================================================================
async def test_output_and_exit_code_reach_the_application(stack):
    async with await Session.open(stack.settings, kind="rigid") as app:
        (rid,) = await app.request(rq("o", "c0", 2, 60))
        start = await app.wait_start(rid, 10)
        out = app.output(rid)
        for n in start.nodes:
            await app.launch(rid, n, ["sh", "-c", 'echo "$COORM_NODE $COORM_REQUEST $COORM_NODES"; exit 3'])
        lines = set()
        for _ in start.nodes:
            lines.add((await asyncio.wait_for(out.__anext__(), 10)).data.strip())
        nodes = ",".join(start.nodes)
        assert lines == {f"{n} {rid} {nodes}" for n in start.nodes}
        exits = await app.wait_exits(rid, 2, 10)
        assert [e.code for e in exits] == [3, 3] and not any(e.killed for e in exits)
        assert all(isinstance(e, Exited) for e in exits)
        started = [e for e in [start] if isinstance(e, Started)]
        assert started


# ==================================================================================================
# a silent agent's nodes go down; their requests end with node_failure and their owners are told
# ==================================================================================================
@pytest.mark.parametrize("stack", [{"clusters": {"c0": 4, "c1": 4}, "agent_timeout": 1.0}], indirect=True)
async def test_a_silent_agents_nodes_go_down_and_their_owner_is_told(stack):
    settings = stack.settings
    async with await Session.open(settings, kind="rigid") as app:
        (rid,) = await app.request(rq("x", "c1", 4, 600))
        await app.wait_start(rid, 10)
        await stack.agents["c1"].stop()  # the host dies: no more heartbeats
        killed = await next_of(app, Killed, 10)
        assert killed.request == rid and killed.reason == "node_failure"
        v = await next_of(app, ViewsChanged, 10, lambda e: e.views.non_preemptive["c1"].value_at(e.views.now) == 0)
        assert v is not None
        assert stack.engine.cores.allocator.up("c1") == 0 and stack.engine.cores.allocator.up("c0") == 4


# ==================================================================================================
# the shipped launchers run live through the same decision objects as in the simulator
# ==================================================================================================
@pytest.mark.parametrize("stack", [{"clusters": {"c0": 8, "c1": 8}}], indirect=True)
async def test_the_shipped_launchers_run_live(stack):
    from coorm.launchers.cem import CEMLauncher, CEMModel
    from coorm.launchers.moldable import MoldableLauncher
    from coorm.launchers.next_chain import NextChainLauncher

    settings = stack.settings

    async def run(kind, make, command, ends_work):
        s = await Session.open(settings, kind=kind, preemptive_views=False)
        launcher = make(s.app, await s.cluster_props())
        result = await asyncio.wait_for(LiveRunner(s, launcher, command=command, command_ends_work=ends_work).run(),
                                        30)
        return launcher, result

    chain, r1 = await run("next", lambda app, props: NextChainLauncher(app, "c0", [(2, 0.5), (4, 0.5), (1, 0.5)]),
                          None, False)
    assert r1.exit_code == 0 and chain.finished and chain.ids == [f"{r1.app}.1", f"{r1.app}.2", f"{r1.app}.3"]
    mold, r2 = await run("moldable", lambda app, props: MoldableLauncher(app, "c1", [(4, 30), (8, 20)]),
                         ["sh", "-c", "echo $COORM_NODE"], True)
    assert r2.exit_code == 0 and mold.choice.config == ("c1", 8, 20.0) and r2.processes == 8
    cem, r3 = await run("cem", lambda app, props: CEMLauncher(app, model=CEMModel(iterations=5, work=10.0)),
                        ["true"], True)
    assert r3.exit_code == 0 and cem.selection is not None and r3.processes == cem.selection.total_hosts


async def test_the_synchronous_wrapper_runs_a_job(stack):
    from coorm.launchers.sdk import SyncSession

    def script():
        with SyncSession(stack.settings, kind="rigid") as s:
            (rid,) = s.request(rq(s.rid("job"), "c0", 1, 60))
            start = s.wait_start(rid, 10)
            s.launch(rid, start.nodes[0], ["sh", "-c", "exit 5"])
            (ex,) = s.wait_exits(rid, 1, 10)
            s.done(rid)
            return ex.code

    assert await asyncio.to_thread(script) == 5



@pytest.mark.parametrize("stack", [{"launcher_heartbeat": 0.001}], indirect=True)
async def test_close_returns_even_when_a_heartbeat_reply_races_it(stack):
    """Python 3.11's ``wait_for`` may swallow a cancellation when the awaited reply lands in the same loop
    iteration: a heartbeat loop cancelled by ``close`` then went on beating, and ``close`` waited for it for
    ever (seen with 1,000 launchers). Sessions that heartbeat all the time must all close, and be gone."""
    settings = stack.settings
    for _ in range(3):
        sessions = await asyncio.gather(*(Session.open(settings, name=f"hb{i}") for i in range(30)))
        await asyncio.gather(*(s.wait_views() for s in sessions))
        await asyncio.wait_for(asyncio.gather(*(s.close() for s in sessions)), 20)
        status = await bus.call(stack.allocator.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply)
        assert not {s.app for s in sessions} & {a.app for a in status.apps}


# ==================================================================================================
# issue 11: no exit code lies
# ==================================================================================================
async def _rigid_job(settings, cluster: str, nodes: int, command: list[str], *, started=None):
    from coorm.launchers.rigid import RigidLauncher

    s = await Session.open(settings, kind="rigid", preemptive_views=False)
    runner = LiveRunner(s, RigidLauncher(s.app, cluster, nodes, 600.0), command=command, command_ends_work=True)
    if started is not None:
        real = runner._handle

        async def spy(item):
            await real(item)
            if isinstance(item, Started) and item.nodes and not started.done():
                started.set_result(item)

        runner._handle = spy  # type: ignore[method-assign]
    return await runner.run()


async def test_a_command_that_cannot_be_executed_fails_the_job_at_once_with_127(stack):
    """Like a shell: 127 for a program that does not exist, 126 for one that cannot be executed -- at once,
    with the nodes freed, not held until the walltime (600 s here)."""
    result = await asyncio.wait_for(_rigid_job(stack.settings, "c0", 4, ["nonexistent_cmd_xyz"]), 30)
    assert result.exit_code == 127 and "command not found" in result.refused[0]
    result = await asyncio.wait_for(_rigid_job(stack.settings, "c0", 2, ["/etc/hostname"]), 30)
    assert result.exit_code == 126
    st = await bus.call(stack.allocator.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply, timeout=5)
    assert not st.requests or all(r.state == "ended" for r in st.requests)


@pytest.mark.parametrize("stack", [{"clusters": {"c0": 4, "c1": 4}, "kill_grace": 5.0}], indirect=True)
async def test_a_job_whose_processes_its_agent_killed_does_not_exit_0(stack):
    """The agent stops (SIGTERM): its processes are killed. The job did not complete, so its exit code says
    so (128 + the signal), even for a process that exits 0 on SIGTERM."""
    started: asyncio.Future = asyncio.get_running_loop().create_future()
    job = asyncio.create_task(_rigid_job(stack.settings, "c1", 2, ["sh", "-c", "trap 'exit 0' TERM; sleep 1000 & wait"],
                                         started=started))
    await asyncio.wait_for(asyncio.shield(started), 20)
    await stack.agents["c1"].stop()
    result = await asyncio.wait_for(job, 30)
    assert result.exit_code == 143 and result.end_reason in ("agent_stopping", "node_failure")


@pytest.mark.parametrize("stack", [{"clusters": {"c0": 2}, "reschedule_interval": 60.0}], indirect=True)
async def test_a_views_query_answers_while_a_new_cluster_waits_for_its_first_pass(stack):
    """A cluster registered after the last pass has no views yet: the views query (what the view publisher
    asks at start) answers without it, instead of failing with an internal error (KeyError) -- at start-up,
    8 of 16 ``coorm up`` runs logged it and the view publisher's sync died."""
    from coorm.shared.protocol import Ack, NodesEvent, ViewsEpoch, ViewsQuery

    nc = stack.allocator.nc
    async with await Session.open(stack.settings, kind="rigid"):
        await bus.call(nc, subjects.NODES_EVENT, NodesEvent(kind="register", cluster="late", nodes=["late0"]), Ack,
                       timeout=5)
        epoch = await bus.call(nc, subjects.VIEWS_QUERY, ViewsQuery(), ViewsEpoch, timeout=5)
        views = epoch.app_views()
        assert views and all("c0" in per for per in views.values())



def test_a_policy_engine_stops_saying_why_when_the_snapshot_cannot_be_loaded(servers, redis_url, tmp_path):
    """A snapshot of a newer CooRM (or damaged): the engine cannot rebuild the state without it (the log
    before it is trimmed), so it stops with 1 and says what to do, rather than lead on an empty state."""
    import subprocess
    import sys

    import redis

    from coorm.shared import keys

    r = redis.Redis.from_url(servers.redis_url, decode_responses=True)
    r.hset(keys.SNAPSHOT, mapping={"state": "{}", "last": "5-0", "format": "999", "events": "5"})
    env = dict(os.environ, COORM_NATS_URL=servers.nats_url, COORM_REDIS_URL=servers.redis_url,
               COORM_LEADER_LEASE="1.0", COORM_CONNECTION_FILE=str(tmp_path / "none.json"))
    try:
        done = subprocess.run([sys.executable, "-m", "coorm.cli.main", "service", "policy-engine"], env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        r.delete(keys.SNAPSHOT)
        r.close()
    said = done.stdout + done.stderr  # (the services log to standard output)
    assert done.returncode == 1, said[-2000:]
    assert "cannot take over" in said and "999" in said and "redis-cli DEL" in said, said[-2000:]
    assert "Traceback" not in said
