"""Negotiation in the policy core (the adaptive-RMS paper): offers, accept / counter / reject, deadlines,
standing negotiations -- the paper's cases, what an offer sets aside, hostile answers, and properties."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coorm.services.policy_engine import snapshot_schema as schema
from coorm.services.policy_engine.negotiation import idle_now
from coorm.shared.events import ErrorCode, Negotiate, Offered, OfferLapsed, Rejected, Respond, StartRequest
from coorm.shared.negotiation import NegotiationTerms, pow2_sizes
from tests.core.driver import Driver, rq


def terms(nid: str, nodes: int, **kw) -> NegotiationTerms:
    kw.setdefault("duration", 100.0)
    return NegotiationTerms(negotiation=nid, cluster=kw.pop("cluster", "c0"), max_nodes=nodes, **kw)


def negotiate(d: Driver, at: float, app: str, t: NegotiationTerms) -> list:
    d._advance(at)
    return d._record(d.cores.handle(Negotiate(at=at, app=app, terms=t)))


def respond(d: Driver, at: float, app: str, offer: str, answer: str, nodes: int | None = None) -> list:
    d._advance(at)
    return d._record(d.cores.handle(Respond(at=at, app=app, offer=offer, answer=answer, nodes=nodes)))


def offer_of(out: list) -> Offered:
    (o,) = [d for d in out if isinstance(d, Offered)]
    return o


def refused(out: list) -> ErrorCode:
    assert isinstance(out[0], Rejected), out
    return out[0].code


def started(out: list, request: str) -> StartRequest | None:
    return next((d for d in out if isinstance(d, StartRequest) and d.request == request), None)


# ==================================================================================================
# the paper's cases
# ==================================================================================================
def test_asks_14_more_while_6_are_free_is_offered_6_and_runs_on_8():
    """§6: the evolving application on 2 processors asks for 14 more; the scheduler offers 6, the
    application accepts and expands to 8 (here 16 nodes, 8 busy with another job)."""
    d = Driver({"c0": 16})
    d.open(0, "evo")
    d.open(0, "other")
    d.submit(1, "evo", rq("evo.1", "c0", 2, 1000))
    d.submit(1, "other", rq("other.1", "c0", 8, 1000))
    o = offer_of(negotiate(d, 2, "evo", terms("evo.grow", 14)))
    assert (o.nodes, o.start, o.round) == (6, 2.0, 1)
    out = respond(d, 3, "evo", o.offer, "accept")
    assert out[0].requests == ("evo.grow",)
    s = started(out, "evo.grow")
    assert s is not None and s.nodes == 6
    assert sum(r.nodes for r in d.policy.running() if r.app == "evo") == 8


def test_power_of_two_application_is_offered_only_what_it_can_use():
    """§3, first scenario: on 8, it asks for 24 more while 15 are free; with its sizes (powers of two in
    all) the RMS offers 8, not 15."""
    d = Driver({"c0": 32})
    d.open(0, "p2")
    d.open(0, "busy")
    d.submit(1, "p2", rq("p2.1", "c0", 8, 1000))
    d.submit(1, "busy", rq("busy.1", "c0", 9, 1000))
    assert idle_now(d.policy, "c0") == 15
    sizes = pow2_sizes(8, 32)
    assert sizes == (8, 24)
    o = offer_of(negotiate(d, 2, "p2", terms("p2.grow", 24, min_nodes=8, sizes=sizes)))
    assert o.nodes == 8


def test_without_sizes_the_application_counters_15_with_8():
    """The same scenario when the application does not tell its sizes: offered 15, it counters 8, the
    RMS offers 8 (round 2), it accepts."""
    d = Driver({"c0": 32})
    d.open(0, "p2")
    d.open(0, "busy")
    d.submit(1, "p2", rq("p2.1", "c0", 8, 1000))
    d.submit(1, "busy", rq("busy.1", "c0", 9, 1000))
    o1 = offer_of(negotiate(d, 2, "p2", terms("p2.grow", 24)))
    assert o1.nodes == 15
    o2 = offer_of(respond(d, 2.5, "p2", o1.offer, "counter", 8))
    assert (o2.nodes, o2.round) == (8, 2) and o2.offer != o1.offer
    assert refused(respond(d, 2.6, "p2", o1.offer, "accept")) is ErrorCode.UNKNOWN_OFFER  # withdrawn
    out = respond(d, 2.7, "p2", o2.offer, "accept")
    assert started(out, "p2.grow").nodes == 8


def test_the_rms_offers_the_freed_nodes_to_a_standing_malleable_application():
    """§6, the malleable application: on 4 processors, a short rigid job on the other 4; when the rigid job
    ends the scheduler offers the 4 idle processors, the application accepts and expands to 8."""
    d = Driver({"c0": 8}, fair_start=0.0)
    d.open(0, "mal")
    d.open(0, "rig")
    d.submit(0, "mal", rq("mal.1", "c0", 4, 1000))
    d.submit(0, "rig", rq("rig.1", "c0", 4, 50))
    t = terms("mal.grow", 4, type="preemptible", duration=None, sizes=pow2_sizes(4, 8), standing=True)
    out = negotiate(d, 1, "mal", t)
    assert out[0].kind == "accepted" and not [x for x in out if isinstance(x, Offered)]  # it waits
    out = d.done(20, "rig", "rig.1")
    o = offer_of(out)
    assert o.unsolicited and o.nodes == 4 and o.app == "mal"
    out = respond(d, 21, "mal", o.offer, "accept")
    s = started(out, "mal.grow")
    assert s is not None and s.nodes == 4 and s.type.value == "preemptible"


# ==================================================================================================
# what an offer sets aside, and for how long
# ==================================================================================================
def test_an_offer_sets_its_nodes_aside_until_its_deadline_then_they_are_free_again():
    d = Driver({"c0": 10})
    d.open(0, "a")
    d.open(0, "b")
    o = offer_of(negotiate(d, 1, "a", terms("a.g", 10, respond_within=5.0)))
    assert o.nodes == 10 and o.deadline == 6.0
    out = d.submit(2, "b", rq("b.1", "c0", 4, 10))
    assert started(out, "b.1") is None  # the offer's nodes are not another's
    assert d.policy.requests["b.1"].start >= 6.0
    d.run_until(6.0)
    assert [x for x in d.decisions if isinstance(x, OfferLapsed) and x.offer == o.offer]
    assert d.started("b.1") is not None and d.start_time("b.1") == 6.0
    assert refused(respond(d, 7, "a", o.offer, "accept")) is ErrorCode.OFFER_LAPSED


def test_an_accepted_offer_starts_before_higher_priority_requests_that_arrived_meanwhile():
    """The RMS gave its word: a request of a higher-priority application sent while the offer was open
    waits; the accepted request starts on the nodes the offer set aside."""
    d = Driver({"c0": 10})
    d.open(0, "high")
    d.open(1, "low")
    o = offer_of(negotiate(d, 2, "low", terms("low.g", 6, duration=100.0)))
    assert o.nodes == 6
    d.submit(2.5, "high", rq("high.1", "c0", 8, 10))
    out = respond(d, 3, "low", o.offer, "accept")
    assert started(out, "low.g") is not None
    assert d.started("high.1") is None


def test_an_offer_for_later_when_nothing_is_free_now():
    d = Driver({"c0": 8})
    d.open(0, "busy")
    d.open(0, "a")
    d.submit(0, "busy", rq("busy.1", "c0", 8, 100))
    o = offer_of(negotiate(d, 1, "a", terms("a.g", 6, min_nodes=2)))
    assert (o.nodes, o.start) == (6, 100.0)
    assert d.policy.negotiations.reserved_now("c0", d.now) == 0  # a later offer sets nothing aside
    out = respond(d, 2, "a", o.offer, "accept")
    assert out[0].requests == ("a.g",) and d.policy.requests["a.g"].start == 100.0


def test_nothing_ever_fits_is_an_offer_of_nothing_that_cannot_be_accepted():
    d = Driver({"c0": 4})
    d.open(0, "a")
    o = offer_of(negotiate(d, 1, "a", terms("a.g", 8, min_nodes=6)))
    assert (o.nodes, o.start) == (0, None)
    assert refused(respond(d, 2, "a", o.offer, "accept")) is ErrorCode.BAD_REQUEST
    assert respond(d, 2, "a", o.offer, "reject")[0].kind == "accepted" and not d.policy.negotiations.open


def test_a_reject_ends_the_negotiation_and_frees_its_nodes():
    d = Driver({"c0": 8})
    d.open(0, "a")
    o = offer_of(negotiate(d, 1, "a", terms("a.g", 8)))
    assert idle_now(d.policy, "c0") == 0
    respond(d, 2, "a", o.offer, "reject")
    assert idle_now(d.policy, "c0") == 8 and not d.policy.negotiations.open


def test_asking_again_revises_the_negotiation():
    d = Driver({"c0": 8})
    d.open(0, "a")
    o1 = offer_of(negotiate(d, 1, "a", terms("a.g", 8)))
    o2 = offer_of(negotiate(d, 2, "a", terms("a.g", 4)))
    assert (o1.nodes, o2.nodes, o2.round) == (8, 4, 2)
    assert d.policy.negotiations.reserved_now("c0", d.now) == 4


def test_a_session_that_ends_takes_its_negotiations_with_it():
    d = Driver({"c0": 8})
    d.open(0, "a")
    offer_of(negotiate(d, 1, "a", terms("a.g", 8)))
    d.close(2, "a")
    assert not d.policy.negotiations.open and idle_now(d.policy, "c0") == 8


def test_nodes_going_down_under_an_offer_make_it_lapse():
    d = Driver({"c0": 4})
    d.open(0, "a")
    o = offer_of(negotiate(d, 1, "a", terms("a.g", 4)))
    d.node_down(2, "c0n0")
    d.run_until(3)
    assert [x for x in d.decisions if isinstance(x, OfferLapsed) and x.offer == o.offer]
    assert refused(respond(d, 3, "a", o.offer, "accept")) is ErrorCode.OFFER_LAPSED


# ==================================================================================================
# hostile answers: an error with a code, and nothing changes
# ==================================================================================================
def _state(d: Driver) -> dict:
    doc = schema.dump(d.cores)
    doc["policy"].pop("now")
    doc["allocator"].pop("now")
    return doc


@pytest.fixture
def offered() -> tuple[Driver, Offered]:
    d = Driver({"c0": 16})
    d.open(0, "a")
    d.open(0, "b")
    o = offer_of(negotiate(d, 1, "a", terms("a.g", 8, min_nodes=2, sizes=(2, 4, 8))))
    return d, o


@pytest.mark.parametrize("answer, nodes, code", [
    ("counter", 16, ErrorCode.BAD_COUNTER),  # above the maximum
    ("counter", 1, ErrorCode.BAD_COUNTER),  # below the minimum
    ("counter", 3, ErrorCode.BAD_COUNTER),  # not one of its sizes
    ("counter", None, ErrorCode.BAD_COUNTER),  # a counter without a size
    ("accept", 4, ErrorCode.BAD_REQUEST),  # an accept that changes the offer
])
def test_a_bad_answer_is_refused_with_a_code_and_changes_nothing(offered, answer, nodes, code):
    d, o = offered
    before = _state(d)
    assert refused(respond(d, 1, "a", o.offer, answer, nodes)) is code
    assert _state(d) == before


@pytest.mark.parametrize("who, offer, code", [
    ("a", "a.g.o9", ErrorCode.UNKNOWN_OFFER),  # never made
    ("b", "a.g.o1", ErrorCode.NOT_YOURS),  # another application's
    ("nobody", "a.g.o1", ErrorCode.UNKNOWN_APP),
])
def test_an_answer_to_an_offer_that_is_not_there_or_not_its_own_changes_nothing(offered, who, offer, code):
    d, _ = offered
    before = _state(d)
    assert refused(respond(d, 1, who, offer, "accept")) is code
    assert _state(d) == before


def test_an_offer_answered_twice_and_one_of_another_after_it_closed(offered):
    d, o = offered
    respond(d, 2, "a", o.offer, "accept")
    before = _state(d)
    assert refused(respond(d, 2, "a", o.offer, "accept")) is ErrorCode.UNKNOWN_OFFER
    assert refused(respond(d, 2, "b", o.offer, "reject")) is ErrorCode.NOT_YOURS
    assert _state(d) == before


@pytest.mark.parametrize("t, code", [
    (dict(negotiation="b.1", cluster="nowhere", max_nodes=2, duration=10.0), ErrorCode.UNKNOWN_CLUSTER),
    (dict(negotiation="a.g", cluster="c0", max_nodes=2, duration=10.0), ErrorCode.DUPLICATE),  # a's
    (dict(negotiation="b.run", cluster="c0", max_nodes=2, duration=10.0), ErrorCode.DUPLICATE),  # a request's
])
def test_a_bad_negotiation_is_refused_and_changes_nothing(offered, t, code):
    d, _ = offered
    d.submit(1, "b", rq("b.run", "c0", 1, 100))
    before = _state(d)
    assert refused(negotiate(d, 1, "b", NegotiationTerms(**t))) is code
    assert _state(d) == before


def test_an_application_may_not_pile_up_negotiations():
    from coorm.services.policy_engine.negotiation import MAX_OPEN

    d = Driver({"c0": 4})
    d.open(0, "a")
    for i in range(MAX_OPEN):
        negotiate(d, 1, "a", terms(f"a.s{i}", 64, type="preemptible", duration=None, min_nodes=8, standing=True))
    before = _state(d)
    assert refused(negotiate(d, 1, "a", terms("a.one-more", 1))) is ErrorCode.BAD_REQUEST
    assert _state(d) == before
    negotiate(d, 1, "a", terms("a.s0", 64, type="preemptible", duration=None, min_nodes=8, standing=True))  # a revision
    d.close(2, "a")
    assert not d.policy.negotiations.open


@pytest.mark.parametrize("bad", [
    dict(min_nodes=5, max_nodes=4),
    dict(max_nodes=8, sizes=(4, 2)),
    dict(max_nodes=8, sizes=(2, 16)),
    dict(max_nodes=8, sizes=(4, 4)),
    dict(max_nodes=0),
    dict(max_nodes=8, type="pre-allocation"),
    dict(max_nodes=8, duration=None),  # non-preemptible and unbounded
    dict(max_nodes=8, respond_within=0),
    dict(max_nodes=8, respond_within=float("inf")),
    dict(max_nodes=8, sizes=tuple(range(1, 2000))),
])
def test_terms_that_do_not_hang_together_are_not_a_negotiation(bad):
    bad.setdefault("duration", 10.0)
    with pytest.raises(ValidationError):
        NegotiationTerms(negotiation="x", cluster="c0", **bad)


# ==================================================================================================
# properties
# ==================================================================================================
def _idle_before(d: Driver) -> dict[str, int]:
    return {c: idle_now(d.policy, c) for c in d.policy.clusters}


step = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 12), st.floats(1, 60)),
    st.tuples(st.just("negotiate"), st.integers(1, 12), st.integers(1, 12), st.booleans(), st.booleans(),
              st.booleans()),
    st.tuples(st.just("respond"), st.sampled_from(["accept", "counter", "reject"]), st.integers(1, 12)),
    st.tuples(st.just("done"),),
    st.tuples(st.just("wait"), st.floats(0.1, 20)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), step), min_size=1, max_size=40))
def test_offers_never_exceed_what_is_idle_or_allowed_and_lapsed_offers_free_their_nodes(steps):
    """Whatever the applications do: an offer made now is within the terms and within the nodes idle when
    it was made (the cores' invariants check, after every event, that offers never set aside nodes that
    run or are held: no double booking); an offer past its deadline is gone after the next pass, and its
    nodes with it."""
    d = Driver({"c0": 12}, fair_start=0.0)
    for app in "abc":
        d.open(0, app)
    now, n = 0.0, 0
    for app, s in steps:
        n += 1
        kind = s[0]
        if kind == "wait":
            now += s[1]
            d.run_until(now)
            for neg in d.policy.negotiations.open.values():
                assert neg.offer is None or neg.offer.deadline > d.now
            continue
        idle = _idle_before(d)
        # a counter or a revision withdraws the negotiation's own offer first: its nodes count as idle
        own = {nid: (neg.offer.nodes if neg.offer is not None and neg.offer.reserved else 0)
               for nid, neg in d.policy.negotiations.open.items()}
        if kind == "submit":
            out = d.submit(now, app, rq(f"{app}.r{n}", "c0", s[1], s[2]))
        elif kind == "negotiate":
            hi, lo = max(s[1], s[2]), min(s[1], s[2])
            sizes = pow2_sizes(0, hi) if s[3] else ()
            sizes = tuple(x for x in sizes if x >= lo)
            if s[3] and not sizes:
                continue
            t = NegotiationTerms(negotiation=f"{app}.n{n % 3}", cluster="c0", min_nodes=lo, max_nodes=hi,
                                 sizes=sizes, duration=None if s[4] else 30.0,
                                 type="preemptible" if s[4] else "non-preemptible", standing=s[5],
                                 respond_within=3.0)
            out = negotiate(d, now, app, t)
        elif kind == "respond":
            # mostly its open offer; else the last it was made (lapsed, withdrawn or answered: refused)
            mine = [n.offer.id for n in d.policy.negotiations.open.values() if n.app == app and n.offer]
            mine = mine or [x.offer for x in d.decisions if isinstance(x, Offered) and x.app == app]
            if not mine:
                continue
            out = respond(d, now, app, mine[-1], s[1], s[2] if s[1] == "counter" else None)
        else:
            running = [r.id for r in d.policy.running() if r.app == app]
            if not running:
                continue
            out = d.done(now, app, running[0])
        for o in out:
            if isinstance(o, Offered) and o.start == now and o.nodes and not o.unsolicited:
                neg_terms = d.policy.negotiations.open[o.negotiation].terms
                assert neg_terms.allows(o.nodes)
                assert o.nodes <= idle["c0"] + own.get(o.negotiation, 0)
