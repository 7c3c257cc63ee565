"""The malleable launcher's decisions (launchers/malleable.py), as a pure object: what it negotiates, what
it accepts, counters or rejects, how it shrinks and when its work is done."""

from __future__ import annotations

import pytest

from coorm.launchers.base import ClusterProps, Done, Negotiate, OfferSeen, Respond, Submit, Timer, Views
from coorm.launchers.malleable import MalleableLauncher, totals
from coorm.shared.negotiation import Answer
from coorm.shared.stepfn import StepFunction

PROPS = ClusterProps(nodes={"c0": 32})


def started(sizes="pow2", min_nodes=4, max_nodes=16, work=None) -> tuple[MalleableLauncher, Negotiate]:
    m = MalleableLauncher("a", "c0", min_nodes, max_nodes, sizes=sizes, work=work)
    (sub,) = m.on_open(0.0, PROPS)
    assert isinstance(sub, Submit) and sub.requests[0].nodes == min_nodes
    out = m.on_start(1.0, sub.requests[0].id, tuple(f"n{i}" for i in range(min_nodes)))
    neg = [c for c in out if isinstance(c, Negotiate)]
    assert len(neg) == 1
    return m, neg[0]


def test_totals():
    assert totals("pow2", 20) == (1, 2, 4, 8, 16)
    assert totals([12, 4, 40], 20) == (4, 12)
    assert totals("any", 3) == (1, 2, 3)
    with pytest.raises(ValueError):
        totals("odd", 8)


def test_it_negotiates_growths_that_keep_it_at_a_power_of_two_and_accepts_an_offer_it_can_use():
    m, neg = started()
    t = neg.terms
    assert (t.sizes, t.standing, t.type.value, t.max_nodes) == ((4, 12), True, "preemptible", 12)
    (r,) = m.on_offer(2.0, OfferSeen(t.negotiation, f"{t.negotiation}.o1", 4, 2.0, 7.0))
    assert r == Respond(f"{t.negotiation}.o1", Answer.ACCEPT)
    assert m.on_accepted(2.1, t.negotiation, t.negotiation) == []
    out = m.on_start(2.2, t.negotiation, ("n4", "n5", "n6", "n7"))
    assert m.held() == 8 and m.grows == 1
    (again,) = [c for c in out if isinstance(c, Negotiate)]
    assert again.terms.sizes == (8,) and again.terms.negotiation != t.negotiation


def test_an_offer_it_cannot_use_now_is_countered_or_rejected():
    m, neg = started(sizes="any", min_nodes=2, max_nodes=6)
    t = neg.terms
    assert t.sizes == (1, 2, 3, 4)
    (c,) = m.on_offer(2.0, OfferSeen(t.negotiation, "x.o1", 9, 2.0, 7.0))  # more than it can use: counter
    assert c == Respond("x.o1", Answer.COUNTER, 4)
    out = m.on_offer(2.0, OfferSeen(t.negotiation, "x.o2", 4, 50.0, 7.0))  # for later: rejected, asked again
    assert out[0] == Respond("x.o2", Answer.REJECT) and isinstance(out[1], Negotiate)


def test_a_lapsed_or_refused_negotiation_is_opened_again_and_a_stale_offer_rejected():
    m, neg = started()
    t = neg.terms
    (again,) = m.on_offer(3.0, OfferSeen(t.negotiation, "o", lapsed=True))
    assert isinstance(again, Negotiate) and m.lapsed == 1
    assert m.on_offer(3.0, OfferSeen("elsewhere", "old.o1", 4, 3.0, 8.0)) == [Respond("old.o1", Answer.REJECT)]


def test_a_view_below_its_growth_gives_whole_growths_back_latest_first():
    m, neg = started(max_nodes=32)
    m.on_offer(2.0, OfferSeen(neg.terms.negotiation, "g1.o1", 4, 2.0, 7.0))
    m.on_start(2.0, neg.terms.negotiation, tuple(f"g{i}" for i in range(4)))
    assert m.held() == 8
    views = Views(3.0, {"c0": StepFunction.constant(32, 0)}, {"c0": StepFunction.constant(2, 0)})
    out = m.on_views(views)
    assert Done(neg.terms.negotiation) in out and m.held() == 4 and m.shrinks == 1


def test_its_work_ends_it_at_the_rate_of_the_nodes_it_holds():
    m, _ = started(work=40.0)  # 4 nodes from t=1: done at t=11
    early = m.on_timer(10.0, f"work{m._timer}")  # (a stale timer: 36 node-seconds done, 4 to go)
    assert not m.finished and Timer(11.0, f"work{m._timer}") in early
    out = m.on_timer(11.0, f"work{m._timer}")
    assert m.finished and any(isinstance(c, Done) for c in out)


def test_a_standing_negotiation_that_hears_nothing_is_asked_again():
    """An unsolicited offer and its lapse notice may both be lost with a connection: the launcher that waits
    with nothing offered asks again after REFRESH seconds; a timer of an older ask does nothing."""
    from coorm.launchers.malleable import REFRESH

    m, neg = started()
    (t,) = m.on_offer(1.5, OfferSeen(neg.terms.negotiation, waiting=True))
    assert t == Timer(1.5 + REFRESH, t.key)
    (again,) = m.on_timer(t.at, t.key)
    assert isinstance(again, Negotiate) and again.terms.negotiation == neg.terms.negotiation
    assert m.on_timer(t.at, t.key) == []  # (the older ask's timer, fired again)
    (offer_t,) = m.on_offer(t.at, OfferSeen(neg.terms.negotiation, waiting=True))
    m.on_offer(t.at + 1, OfferSeen(neg.terms.negotiation, "g.o2", 4, t.at + 1, t.at + 6))  # heard: accepted
    assert m.on_timer(offer_t.at, offer_t.key) == []


def test_a_drop_its_view_announces_for_later_is_followed_when_it_comes():
    """A preemptive view that keeps 8 until t=50, then 2: nothing to give back at 3, a timer at 50, and then
    the growth goes back (no new view comes at 50 to say so)."""
    m, neg = started(max_nodes=32)
    m.on_offer(2.0, OfferSeen(neg.terms.negotiation, "g1.o1", 4, 2.0, 7.0))
    m.on_start(2.0, neg.terms.negotiation, tuple(f"g{i}" for i in range(4)))
    view = StepFunction.from_steps([(0, 8), (50, 2)])
    out = m.on_views(Views(3.0, {"c0": StepFunction.constant(32, 0)}, {"c0": view}))
    (t,) = [c for c in out if isinstance(c, Timer)]
    assert t.at == 50.0 and not [c for c in out if isinstance(c, Done)]
    out = m.on_timer(50.0, t.key)
    assert Done(neg.terms.negotiation) in out and m.held() == 4


def test_with_a_placement_it_leaves_its_cluster_to_the_rms_and_grows_on_the_one_its_start_names():
    m = MalleableLauncher("a", "", 4, 16, placement="worst-fit", clusters=["c1", "c0"])
    (sub,) = m.on_open(0.0, PROPS)
    spec = sub.requests[0]
    assert (spec.cluster, spec.placement, spec.clusters, spec.nodes) == (None, "worst-fit", ["c1", "c0"], 4)
    m.placed[spec.id] = "c1"  # (the start notification's cluster, as the runner tells it)
    out = m.on_start(1.0, spec.id, tuple(f"n{i}" for i in range(4)))
    (neg,) = [c for c in out if isinstance(c, Negotiate)]
    assert m.cluster == "c1" and neg.terms.cluster == "c1"
