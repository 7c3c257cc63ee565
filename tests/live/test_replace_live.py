"""The atomic replace (issue 17), live: over a real nats-server and valkey, the services and an agent starting
real processes. A request's ``replaces`` cancels the waiting request and submits the new one in one step
(the old one never starts); a replace of a request that has just started -- its start notification not read
yet -- is refused with ``started`` and changes nothing, whether sent by the SDK or as raw JSON; and a
moldable launcher in a :class:`~coorm.launchers.live.LiveRunner` whose replace loses that race keeps the
request that started and runs its command there."""

from __future__ import annotations

import json

import pytest

from coorm.launchers.base import Views
from coorm.launchers.live import LiveRunner
from coorm.launchers.moldable import MoldableLauncher
from coorm.launchers.sdk import ReplaceRefused, Session
from coorm.services.stack import LocalStack
from coorm.shared.events import EndReason, ErrorCode
from coorm.shared.requests import RequestSpec
from coorm.shared.stepfn import StepFunction
from tests.live.test_system import _settings


@pytest.fixture
async def stack(servers, redis_url):
    async with LocalStack(_settings(servers, fair_start=0.0), {"c0": 4, "c1": 4}) as s:
        yield s


def rq(rid: str, cluster: str, nodes: int, duration: float = 60.0) -> RequestSpec:
    return RequestSpec(id=rid, cluster=cluster, nodes=nodes, duration=duration)


async def test_a_replace_cancels_the_waiting_request_and_the_new_one_starts_in_its_place(stack):
    policy = stack.engine.cores.policy
    async with await Session.open(stack.settings, kind="rigid") as a, \
            await Session.open(stack.settings, kind="moldable") as b:
        (a1,) = await a.request(rq(a.rid("all"), "c0", 4, 600))
        await a.wait_start(a1, 10)
        (b1,) = await b.request(rq(b.rid("1"), "c0", 2))
        assert await b.replace(b1, rq(b.rid("2"), "c0", 3)) == [b.rid("2")]
        # the replace's answer comes after the event is applied: the old one is cancelled, the new one waits
        assert policy.ended[b1][1] is EndReason.CANCELLED and b.rid("2") in policy.requests
        await a.done(a1)
        started = await b.wait_start(b.rid("2"), 10)
        assert len(started.nodes) == 3
        assert b1 not in b._started and policy.ended[b1][1] is EndReason.CANCELLED


async def test_a_replace_of_a_request_that_has_just_started_is_refused_and_changes_nothing(stack):
    policy = stack.engine.cores.policy
    async with await Session.open(stack.settings, kind="moldable") as b:
        (s,) = await b.request(rq(b.rid("s"), "c1", 2))
        start = await b.wait_start(s, 10)  # (its startNotify is read here; a launcher may not have yet)
        with pytest.raises(ReplaceRefused) as refused:
            await b.replace(s, rq(b.rid("s2"), "c1", 4))
        assert refused.value.code is ErrorCode.STARTED and refused.value.replaces == (s,)
        assert policy.requests[s].state.value == "started" and policy.requests[s].nodes == 2
        assert b.rid("s2") not in policy.requests and b.rid("s2") not in policy.ended
        # the same, as any language sends it: one JSON message on the session's request subject
        raw = {"token": b.token, "requests": [{"id": b.rid("s3"), "cluster": "c1", "nodes": 1, "duration": 5.0}],
               "replaces": [s]}
        reply = json.loads((await b.nc.request(b.reply.subjects.request, json.dumps(raw).encode(), timeout=10)).data)
        assert reply["ok"] is False and reply["error"]["code"] == "started", reply
        assert b.rid("s3") not in policy.requests and policy.requests[s].state.value == "started"
        # what is refused was not taken: the new batch alone is accepted, the started request runs on
        assert await b.request(rq(b.rid("s2"), "c1", 2)) == [b.rid("s2")]
        assert (await b.wait_start(s, 1)) == start


def views(now: float, steps: list[tuple[float, int]]) -> Views:
    return Views(now=now, non_preemptive={"c0": StepFunction.from_steps(steps)},
                 preemptive={"c0": StepFunction.constant(0, now)})


async def test_a_moldable_whose_replace_loses_the_race_keeps_the_started_request_and_runs_it(stack):
    """The launcher asks 4 nodes of c0 (free); the RMS starts them; before the runner reads that start, a
    view (stale, as a view published apart from the start may be) makes the launcher choose 2 nodes. Its
    replace is refused: it keeps m.1, runs its command on m.1's 4 nodes, and nothing else of it starts."""
    policy = stack.engine.cores.policy
    async with await Session.open(stack.settings, kind="moldable") as b:
        m = MoldableLauncher(b.app, "c0", [(2, 30.0), (4, 12.0)])
        runner = LiveRunner(b, m, command=["sleep", "0.2"], command_ends_work=True, start_lag=0.0)
        now = runner.clock()
        await runner._execute(m.on_views(views(now, [(now, 4)])))  # 4 nodes now: m.1
        first = m.current
        assert first is not None
        await b.wait_start(first, 10)  # started by the RMS; the runner has not read it
        await runner._execute(m.on_views(views(now, [(now, 2), (now + 100, 4)])))  # a stale view: 2 nodes
        assert runner.result.replace_refused == ["started"] and m.replace_refused == 1
        assert m.current == first and m.resubmissions == 1 and m.choice.config[1] == 4
        result = await runner.run()  # it reads its events now: the start of m.1, its processes' exits
        nodes = b._started[first].nodes
    assert (result.exit_code, result.refused, result.processes) == (0, [], 4), result
    assert set(result.replace_refused) == {"started"}
    assert sorted(node for node, _ in result.launched) == sorted(nodes) and len(set(nodes)) == 4
    # the RMS's own record (the session has closed: a request's story outlives it): m.1 ran and ended done;
    # the replacement was never accepted, and nothing else of the application was ever submitted
    assert [what for _, what, _ in policy.story(first)][-1] == "ended"
    assert policy.story(first)[-1][2] == "done"
    mine = [rid for rid in policy.stories if rid.startswith(b.app + ".")]
    assert mine == [first], mine
