"""Negotiation end to end (the adaptive-RMS paper) over a real nats-server and valkey: the services, agents
starting real processes, launchers through the SDK -- offers, counters, lapses, unsolicited offers, the
shipped malleable launcher, hostile answers on the wire, and a leader's death between offer and accept."""

from __future__ import annotations

import asyncio

import pytest

from coorm.launchers.live import LiveRunner
from coorm.launchers.malleable import MalleableLauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.launchers.sdk import OfferReceived, Session
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import bus, subjects
from coorm.shared.events import ErrorCode
from coorm.shared.negotiation import NegotiationTerms, pow2_sizes
from coorm.shared.protocol import ErrorReply, RespondMsg
from coorm.shared.requests import RequestSpec
from tests.live.leaders import leader_and_standby
from tests.live.test_system import _settings


@pytest.fixture
async def stack(servers, redis_url):
    async with LocalStack(_settings(servers, fair_start=0.0), {"c0": 8, "c1": 32}) as s:
        yield s


def rq(rid, cluster, nodes, duration) -> RequestSpec:
    return RequestSpec(id=rid, cluster=cluster, nodes=nodes, duration=duration)


async def offer_event(s: Session, timeout: float = 10.0) -> OfferReceived:
    while True:
        ev = await s.next_event(timeout)
        if isinstance(ev, OfferReceived):
            return ev


async def test_asks_14_more_while_6_are_free_is_offered_6_and_its_processes_run_on_8(stack):
    """The paper's evolving application: on 2 nodes of 8, asks 14 more; offered the 6 free, accepts, its
    processes run on all 8."""
    async with await Session.open(stack.settings, kind="evolving") as app:
        (base,) = await app.request(rq(app.rid("base"), "c0", 2, 600))
        st = await app.wait_start(base, 10)
        offer = await app.negotiate(NegotiationTerms(negotiation=app.rid("grow"), cluster="c0", max_nodes=14,
                                                     duration=600.0))
        assert offer.nodes == 6 and offer.offer is not None and offer.deadline is not None
        grown = await app.accept(offer)
        st2 = await app.wait_start(grown, 10)
        assert len(st2.nodes) == 6 and not set(st2.nodes) & set(st.nodes)
        for r, s in ((base, st), (grown, st2)):
            for node in s.nodes:
                await app.launch(r, node, ["true"])
        exits = await app.wait_exits(base, 2, 10) + await app.wait_exits(grown, 6, 10)
        assert sorted(e.node for e in exits) == sorted(st.nodes + st2.nodes) and all(e.code == 0 for e in exits)


async def test_counter_offers_over_several_rounds_then_accept(stack):
    """§3's first scenario: on 8, asks 24 more while 15 are free: offered 15, counters 8, offered 8,
    accepts: a power of two again."""
    async with await Session.open(stack.settings, kind="evolving") as app, \
            await Session.open(stack.settings, kind="rigid") as busy:
        (b,) = await busy.request(rq(busy.rid("b"), "c1", 9, 600))
        (base,) = await app.request(rq(app.rid("base"), "c1", 8, 600))
        await busy.wait_start(b, 10)
        await app.wait_start(base, 10)
        o1 = await app.negotiate(NegotiationTerms(negotiation=app.rid("grow"), cluster="c1", max_nodes=24,
                                                  duration=600.0))
        assert o1.nodes == 15
        r = await app.respond(o1.offer, "counter", 8)
        assert r.offer is not None and r.offer.nodes == 8 and r.offer.round == 2
        grown = await app.accept(r.offer)
        assert len((await app.wait_start(grown, 10)).nodes) == 8
        # with its sizes told, the RMS offers 8 at once
        o = await busy.negotiate(NegotiationTerms(negotiation=busy.rid("g"), cluster="c1", min_nodes=7,
                                                  max_nodes=23, sizes=pow2_sizes(9, 32), duration=60.0))
        assert o.nodes == 7  # 9 + 7 = 16: the 7 left


async def test_an_unanswered_offer_lapses_its_application_is_told_and_the_nodes_go_to_others(stack):
    async with await Session.open(stack.settings, kind="evolving") as app, \
            await Session.open(stack.settings, kind="rigid") as other:
        o = await app.negotiate(NegotiationTerms(negotiation=app.rid("g"), cluster="c0", max_nodes=8,
                                                 duration=60.0, respond_within=0.5))
        assert o.nodes == 8
        (r,) = await other.request(rq(other.rid("r"), "c0", 4, 60))
        lapsed = await offer_event(app)
        assert lapsed.offer.lapsed and lapsed.offer.offer == o.offer
        await other.wait_start(r, 10)
        with pytest.raises(bus.WireError) as e:
            await app.accept(o)
        assert e.value.code is ErrorCode.OFFER_LAPSED


async def test_the_rms_offers_freed_nodes_to_the_shipped_malleable_launcher(stack):
    """§6's malleable application through `coorm launch malleable`'s launcher: on 4 nodes with a rigid job
    on the other 4; the rigid job ends, the RMS offers the 4, the launcher accepts and runs on 8."""
    settings = stack.settings
    rig_s = await Session.open(settings, kind="rigid", preemptive_views=False, views=False)
    rigid = RigidLauncher(rig_s.app, "c0", 4, 60.0)
    rig_run = asyncio.create_task(LiveRunner(rig_s, rigid, command=["sleep", "1.5"], command_ends_work=True).run())
    await wait_until(lambda: bool(rigid.running), 10, "the rigid job's start")
    mal_s = await Session.open(settings, kind="malleable")
    mal = MalleableLauncher(mal_s.app, "c0", 4, 8, sizes="pow2", duration=60.0)
    mal_run = asyncio.create_task(LiveRunner(mal_s, mal, command=["sleep", "600"]).run())
    await wait_until(lambda: mal.held() == 4, 10, "the malleable minimum")
    assert (await rig_run).exit_code == 0
    await wait_until(lambda: mal.held() == 8, 15, "the malleable application at 8")
    assert mal.offers >= 1 and mal.accepted == 1 and mal.grows == 1
    mal_run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await mal_run


async def test_hostile_answers_on_the_wire_get_a_code_and_change_nothing(stack):
    async with await Session.open(stack.settings, kind="evolving") as app, \
            await Session.open(stack.settings, kind="evolving") as thief:
        o = await app.negotiate(NegotiationTerms(negotiation=app.rid("g"), cluster="c0", min_nodes=2, max_nodes=8,
                                                 sizes=(2, 4, 8), duration=60.0))
        assert o.nodes == 8
        for offer, answer, nodes, code in [(o.offer, "counter", 3, ErrorCode.BAD_COUNTER),
                                           (o.offer, "counter", 16, ErrorCode.BAD_COUNTER),
                                           (o.offer, "accept", 4, ErrorCode.BAD_REQUEST),
                                           (app.rid("g") + ".o7", "accept", None, ErrorCode.UNKNOWN_OFFER)]:
            with pytest.raises(bus.WireError) as e:
                await app.respond(offer, answer, nodes)
            assert e.value.code is code
        # another user's application cannot even name this one's subject; another application of the same
        # user is refused by the token, and with its own token the offer is not its
        with pytest.raises(bus.WireError) as e:
            await thief.respond(o.offer, "accept")
        assert e.value.code is ErrorCode.NOT_YOURS
        with pytest.raises(bus.WireError) as e:
            await bus.call(thief.nc, subjects.app_respond(app.app),
                           RespondMsg(token=thief.token, offer=o.offer, answer="accept"), ErrorReply, timeout=5.0)
        assert e.value.code is ErrorCode.BAD_TOKEN
        # not JSON, or not the message: bad_message
        raw = await thief.nc.request(subjects.app_negotiate(thief.app), b'{"token": "x", "terms": {"max_nodes": -1}}',
                                     timeout=5.0)
        assert ErrorReply.model_validate_json(raw.data).error.code is ErrorCode.BAD_MESSAGE
        # the offer still stands as it was: accepted, it gives the 8 nodes
        grown = await app.accept(o)
        assert len((await app.wait_start(grown, 10)).nodes) == 8


async def test_an_offer_survives_a_change_of_leader_and_is_accepted_from_the_next(stack):
    """The offer is in the event log: the next leader, rebuilt from it, knows the offer and what it sets aside."""
    from coorm.services.policy_engine.service import PolicyEngine

    async with await Session.open(stack.settings, kind="evolving") as app:
        o = await app.negotiate(NegotiationTerms(negotiation=app.rid("g"), cluster="c0", max_nodes=8,
                                                 duration=60.0, respond_within=30.0))
        assert o.nodes == 8
        await stack.stop_part("policy-engine")
        stack._spawn("policy-engine", PolicyEngine(stack.settings))
        await wait_until(lambda: stack.engine.leader.is_set(), 30, "the new leader")
        assert stack.engine.cores.policy.negotiations.reserved_now("c0", stack.engine.cores.now) == 8
        grown = await app.accept(o)
        assert len((await app.wait_start(grown, 15)).nodes) == 8


@pytest.mark.parametrize("snapshot_every", [0, 2])
async def test_an_offer_survives_the_leaders_sigkill(servers, redis_url, tmp_path, snapshot_every):
    """The leader is a real process, killed with SIGKILL while an offer is open: the standby rebuilds the
    offer and what it sets aside from the event log (and the snapshot: ``snapshot_every`` 2), a rigid job
    sent meanwhile does not get the offered nodes, and the offer's acceptance, sent to the new leader, starts
    the request on them."""
    settings = _settings(servers, leader_lease=1.0, snapshot_every=snapshot_every, fair_start=0.0)
    env = dict(COORM_LEADER_LEASE="1.0", COORM_RESCHEDULE_INTERVAL="0.05", COORM_FAIR_START="0",
               COORM_SNAPSHOT_EVERY=str(snapshot_every), COORM_CONNECTION_FILE=str(tmp_path / "none.json"))
    async with leader_and_standby(servers, settings, env) as pair:
        standby = pair.standby
        async with LocalStack(settings, {"c0": 8}, with_engine=False):
            app = await Session.open(settings, kind="evolving")
            other = await Session.open(settings, kind="rigid")
            o = await app.negotiate(NegotiationTerms(negotiation=app.rid("g"), cluster="c0", max_nodes=6,
                                                     duration=60.0, respond_within=60.0))
            assert o.nodes == 6
            pair.kill_leader()
            await asyncio.wait_for(standby.leader.wait(), 15)
            assert standby.cores.policy.negotiations.reserved_now("c0", standby.cores.now) == 6
            (rigid,) = await other.request(rq(other.rid("r"), "c0", 4, 60))  # only 2 are not set aside
            grown = await app.accept(o)
            assert len((await app.wait_start(grown, 15)).nodes) == 6
            assert rigid in standby.cores.policy.requests and standby.cores.policy.requests[rigid].state.value == \
                "waiting"
            await app.close()
            await other.close()
