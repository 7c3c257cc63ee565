"""The RMS chooses a request's cluster (KOALA's worst-fit) end to end, over a real nats-server and valkey:
the services, agents starting real processes, launchers through the SDK -- a request with no cluster and a
placement rule starts on the cluster the rule picks and its start says which; the application's growth
goes there; the shipped malleable launcher (`coorm launch malleable --placement worst-fit`) grows on the
cluster it was given; hostile placements on the wire get a code and change nothing; a change of leader
keeps the cluster chosen."""

from __future__ import annotations

import asyncio
import json

import pytest

from coorm.launchers.live import LiveRunner
from coorm.launchers.malleable import MalleableLauncher
from coorm.launchers.sdk import Session
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import subjects
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import ErrorReply
from coorm.shared.requests import RequestSpec, RequestType
from tests.live.leaders import leader_and_standby
from tests.live.test_system import _settings

CLUSTERS = {"c0": 8, "c1": 16, "c2": 12}


@pytest.fixture
async def stack(servers, redis_url):
    async with LocalStack(_settings(servers, fair_start=0.0), CLUSTERS) as s:
        yield s


def rq(rid, cluster, nodes, duration, type=RequestType.NON_PREEMPTIBLE) -> RequestSpec:
    return RequestSpec(id=rid, type=type, cluster=cluster, nodes=nodes, duration=duration)


async def test_worst_fit_starts_the_request_on_the_cluster_with_the_most_idle_nodes_and_it_grows_there(stack):
    async with await Session.open(stack.settings, kind="rigid", views=False) as busy, \
            await Session.open(stack.settings, kind="malleable") as app:
        (b,) = await busy.request(rq(busy.rid("b"), "c1", 10, 600))  # idle: c0 8, c1 6, c2 12
        await busy.wait_start(b, 10)
        (base,) = await app.request(RequestSpec(id=app.rid("min"), placement="worst-fit", nodes=2, duration=600))
        st = await app.wait_start(base, 10)
        assert st.cluster == "c2" and len(st.nodes) == 2
        for node in st.nodes:
            await app.launch(base, node, ["true"])
        exits = await app.wait_exits(base, 2, 10)
        assert sorted(e.node for e in exits) == sorted(st.nodes) and all(e.code == 0 for e in exits)
        # its growth goes where its start said
        (grow,) = await app.request(rq(app.rid("grow"), st.cluster, 6, None, RequestType.PREEMPTIBLE))
        assert len((await app.wait_start(grow, 10)).nodes) == 6
        # first-fit among the clusters it allows: the first by name where it starts first
        (ff,) = await app.request(RequestSpec(id=app.rid("ff"), placement="first-fit", clusters=["c2", "c1"],
                                              nodes=2, duration=600))
        assert (await app.wait_start(ff, 10)).cluster == "c1"
    # no clusters named: those of its session's filter
    async with await Session.open(stack.settings, kind="malleable", clusters=["c0", "c1"]) as app:
        (rid,) = await app.request(RequestSpec(id=app.rid("min"), placement="worst-fit", nodes=2, duration=600))
        assert (await app.wait_start(rid, 10)).cluster == "c1"  # (c2 has more idle nodes, not in its filter)


async def test_the_shipped_malleable_launcher_leaves_its_cluster_to_the_rms_and_grows_there(stack):
    async with await Session.open(stack.settings, kind="rigid", views=False) as busy:
        (b,) = await busy.request(rq(busy.rid("b"), "c2", 10, 600))  # idle: c0 8, c1 16, c2 2
        await busy.wait_start(b, 10)
        s = await Session.open(stack.settings, kind="malleable")
        mal = MalleableLauncher(s.app, "", 2, 16, sizes="pow2", duration=60.0, placement="worst-fit")
        run = asyncio.create_task(LiveRunner(s, mal, command=["sleep", "600"]).run())
        try:
            await wait_until(lambda: mal.held() == 16, 20, "the malleable application grown to 16")
            assert mal.cluster == "c1" and mal.grows >= 1
            policy = stack.engine.cores.policy
            assert {policy.requests[r].cluster for r in mal.running} == {"c1"}
        finally:
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run


async def test_hostile_placements_on_the_wire_get_a_code_and_change_nothing(stack):
    async with await Session.open(stack.settings, kind="malleable") as app:
        before = len(stack.engine.cores.policy.requests)
        good = {"id": "x1", "nodes": 1, "duration": 60}
        cases = [
            ({**good, "placement": "best-fit"}, ErrorCode.BAD_MESSAGE),  # an unknown rule
            ({**good, "placement": "worst-fit", "clusters": []}, ErrorCode.BAD_MESSAGE),  # an empty set
            ({**good, "placement": "worst-fit", "cluster": "c0"}, ErrorCode.BAD_MESSAGE),
            ({**good}, ErrorCode.BAD_MESSAGE),  # no cluster, no rule
            ({**good, "placement": "worst-fit", "clusters": ["c0", "nowhere"]}, ErrorCode.UNKNOWN_CLUSTER),
        ]
        for spec, code in cases:
            raw = await app.nc.request(subjects.app_request(app.app),
                                       json.dumps({"token": app.token, "requests": [spec]}).encode(), timeout=5.0)
            reply = ErrorReply.model_validate_json(raw.data)
            assert reply.error.code is code, (spec, reply)
        assert len(stack.engine.cores.policy.requests) == before
        # and the session still works: the same id, well formed, is accepted
        (rid,) = await app.request(RequestSpec(id="x1", placement="worst-fit", nodes=1, duration=60))
        assert (await app.wait_start(rid, 10)).cluster == "c1"


async def test_the_cluster_chosen_survives_a_change_of_leader_and_is_kept_when_another_frees_first(stack):
    """Every cluster is full; the request goes where it starts first (c1, whose job ends first) and waits. The
    leader stops; the next one, rebuilt from the event log, has it on c1; c0 then frees first, and the
    request still starts on c1 when c1 frees (chosen once, kept: its start said where)."""
    from coorm.services.policy_engine.service import PolicyEngine

    async with await Session.open(stack.settings, kind="rigid", views=False) as busy, \
            await Session.open(stack.settings, kind="malleable") as app:
        jobs = {}
        for c, n, walltime in (("c0", 8, 600), ("c1", 16, 30), ("c2", 12, 600)):
            (jobs[c],) = await busy.request(rq(busy.rid(c), c, n, walltime))
            await busy.wait_start(jobs[c], 10)
        (rid,) = await app.request(RequestSpec(id=app.rid("min"), placement="worst-fit", nodes=4, duration=60))
        await wait_until(lambda: stack.engine.cores.policy.requests[rid].cluster == "c1", 10, "its cluster chosen")
        await stack.stop_part("policy-engine")
        stack._spawn("policy-engine", PolicyEngine(stack.settings))
        await wait_until(lambda: stack.engine.leader.is_set(), 30, "the new leader")
        r = stack.engine.cores.policy.requests[rid]
        assert r.cluster == "c1" and r.state.value == "waiting"
        policy = stack.engine.cores.policy
        epoch = policy.epoch
        await busy.done(jobs["c0"])
        await wait_until(lambda: policy.epoch > epoch and jobs["c0"] not in policy.requests, 10, "c0 free")
        assert policy.requests[rid].state.value == "waiting"  # not moved to c0, which is free now
        await busy.done(jobs["c1"])
        st = await app.wait_start(rid, 15)
        assert st.cluster == "c1" and len(st.nodes) == 4


async def test_the_cluster_chosen_survives_the_leaders_sigkill(servers, redis_url, tmp_path):
    """The leader is a real process, SIGKILLed once it placed the request (every cluster full: on c1, whose
    job ends first): the standby, rebuilt from the event log, has it on c1, and it starts there -- not on c0,
    freed first."""
    import time

    from coorm.shared import bus
    from coorm.shared.protocol import StatusQuery, StatusReply

    settings = _settings(servers, leader_lease=1.0, fair_start=0.0)
    env = dict(COORM_LEADER_LEASE="1.0", COORM_RESCHEDULE_INTERVAL="0.05", COORM_FAIR_START="0",
               COORM_CONNECTION_FILE=str(tmp_path / "none.json"))
    async with leader_and_standby(servers, settings, env) as pair:
        standby = pair.standby
        async with LocalStack(settings, CLUSTERS, with_engine=False):
            busy = await Session.open(settings, kind="rigid", views=False)
            app = await Session.open(settings, kind="malleable")
            jobs = {}
            for c, n in CLUSTERS.items():
                (jobs[c],) = await busy.request(rq(busy.rid(c), c, n, 30 if c == "c1" else 600))
                await busy.wait_start(jobs[c], 10)
            (rid,) = await app.request(RequestSpec(id=app.rid("min"), placement="worst-fit", nodes=4, duration=60))

            async def cluster_of_rid() -> str | None:
                st = await bus.call(busy.nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply, timeout=5)
                return next((q.cluster for q in st.requests if q.request == rid), None)

            deadline = time.monotonic() + 10  # (polled, as wait_until does: the leader is another process)
            while await cluster_of_rid() != "c1":
                assert time.monotonic() < deadline, "the leader did not place the request on c1"
                await asyncio.sleep(0.01)
            pair.kill_leader()
            await asyncio.wait_for(standby.leader.wait(), 15)
            policy = standby.cores.policy
            assert policy.requests[rid].cluster == "c1" and policy.requests[rid].state.value == "waiting"
            epoch = policy.epoch
            await busy.done(jobs["c0"])
            await wait_until(lambda: policy.epoch > epoch and jobs["c0"] not in policy.requests, 10, "c0 free")
            assert policy.requests[rid].state.value == "waiting"
            await busy.done(jobs["c1"])
            st = await app.wait_start(rid, 15)
            assert st.cluster == "c1" and len(st.nodes) == 4
            await app.close()
            await busy.close()
