"""The RMS chooses a request's cluster (KOALA's worst-fit, in the policy core: services/policy_engine/core.py,
``_choose_cluster``): a request with no cluster and a ``placement`` rule is placed, at its first pass, on the
cluster the rule picks from its application's non-preemptive views -- the cluster with the most idle nodes
at the earliest start (worst-fit) or the first by name (first-fit), among the ``clusters`` it allows -- and
stays there; its start says where; what cannot be checked is refused with a code and changes nothing.
The property: the chosen cluster is an allowed one, and it is what coorm.shared.cluster_choice.choose picks
on the views the application is shown by the pass that placed it."""

from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from coorm.shared.cluster_choice import FIRST_FIT, RULES, WORST_FIT, choose
from coorm.shared.events import ErrorCode
from coorm.shared.requests import Placement, RequestSpec
from tests.core.driver import Driver, rq


def placed(rid: str, nodes: int, duration: float = 600.0, rule: str = WORST_FIT, clusters: list[str] | None = None,
           type: str = "non-preemptible") -> RequestSpec:
    return RequestSpec(id=rid, type=type, nodes=nodes, duration=duration, placement=rule, clusters=clusters)


def busy(d: Driver, **load: int) -> None:
    """Rigid jobs of a background application occupy ``load[cluster]`` nodes of each cluster for an hour."""
    d.open(0.0, "bg")
    d.submit(0.0, "bg", *(rq(f"bg-{c}", c, n, 3600.0) for c, n in load.items()))


def test_worst_fit_places_a_request_on_the_cluster_with_the_most_idle_nodes_and_its_start_says_so():
    d = Driver({"delft": 68, "leiden": 32, "vu": 85})
    busy(d, delft=20, leiden=2, vu=70)  # idle: delft 48, leiden 30, vu 15
    d.open(1.0, "m")
    d.submit(1.0, "m", placed("m1", 2))
    start = d.started("m1")
    assert start is not None and start.cluster == "delft" and start.nodes == 2
    assert len(d.nodes_of("m1")) == 2 and all(n.startswith("delft") for n in d.nodes_of("m1"))
    assert any(what == "placed" and "delft" in detail for _, what, detail in d.policy.story("m1"))
    # its growth goes to the cluster it learnt: a preemptible request there starts within its preemptive view
    d.submit(2.0, "m", rq("m2", "delft", 10, None, type="preemptible"))
    assert d.started("m2").cluster == "delft"


def test_first_fit_takes_the_first_cluster_by_name_where_it_starts_first():
    d = Driver({"delft": 68, "leiden": 32, "vu": 85})
    busy(d, delft=66, leiden=2, vu=70)
    d.open(1.0, "m")
    d.submit(1.0, "m", placed("m1", 4, rule=FIRST_FIT))
    assert d.started("m1").cluster == "leiden"  # delft has 2 idle nodes: it would start later there


def test_only_the_allowed_clusters_are_chosen_from():
    d = Driver({"delft": 68, "leiden": 32, "vu": 85})
    d.open(0.0, "m")
    d.submit(0.0, "m", placed("m1", 2, clusters=["leiden", "delft"]))
    assert d.started("m1").cluster == "delft"  # vu, the largest, is not allowed


def test_where_nothing_fits_now_it_goes_where_it_starts_first_and_stays_there():
    d = Driver({"a": 16, "b": 16})
    d.open(0.0, "bg")
    d.submit(0.0, "bg", rq("bg-a", "a", 16, 1000.0), rq("bg-b", "b", 16, 500.0))
    d.open(1.0, "m")
    d.submit(1.0, "m", placed("m1", 8))
    r = d.policy.requests["m1"]
    assert (r.cluster, r.start) == ("b", 500.0)
    d.done(2.0, "bg", "bg-a")  # a frees first now: the request keeps the cluster it was placed on
    d.run_until(600.0)
    assert d.started("m1").cluster == "b" and d.started("m1").at == 500.0
    assert [w for _, w, _ in d.policy.story("m1")].count("placed") == 1


def test_the_local_threshold_is_left_idle_if_it_can_be():
    d = Driver({"a": 16, "b": 12}, local_threshold=4)
    d.open(0.0, "m")
    # b has 12 idle nodes, 10 + 4 do not fit there: a, where they do
    d.submit(0.0, "m", placed("m1", 10, clusters=["b", "a"]))
    assert d.started("m1").cluster == "a"
    # 14 + 4 fit nowhere, ever: the threshold keeps nodes from malleable growth, not from this request
    d.open(1.0, "n")
    d.submit(1.0, "n", placed("n1", 14))
    assert d.policy.requests["n1"].cluster == "a"


def test_a_request_that_fits_nowhere_waits_unplaced_until_a_cluster_can_take_it():
    d = Driver({"a": 4, "b": 4})
    d.open(0.0, "m")
    d.submit(0.0, "m", placed("m1", 6))
    r = d.policy.requests["m1"]
    assert r.unplaced and d.started("m1") is None
    st = d.cores.status({}, "x")
    assert [(q.cluster, q.placement) for q in st.requests] == [(None, WORST_FIT)]
    d.register(5.0, "b", [f"bn{i}" for i in range(4, 8)])  # b grows to 8
    assert d.started("m1").cluster == "b"


def test_a_request_too_large_for_every_allowed_cluster_is_refused_when_oversize_does_not_wait():
    d = Driver({"a": 4, "b": 8}, oversize_waits=False)
    d.open(0.0, "m")
    (out,) = d.submit(0.0, "m", placed("m1", 6, clusters=["a"]))
    assert out.kind == "rejected" and out.code is ErrorCode.TOO_LARGE
    assert d.submit(0.0, "m", placed("m2", 6))[0].kind == "accepted"


def test_what_cannot_be_checked_is_refused_with_a_code_and_changes_nothing():
    d = Driver({"a": 4, "b": 8})
    d.open(0.0, "m")
    d.submit(0.0, "m", rq("keep", "a", 1, 600.0))
    before = (dict(d.policy.requests), d.policy.epoch)
    (out,) = d.submit(1.0, "m", placed("m1", 2, clusters=["a", "nowhere"]))
    assert out.kind == "rejected" and out.code is ErrorCode.UNKNOWN_CLUSTER and "nowhere" in out.reason
    assert (dict(d.policy.requests), d.policy.epoch) == before
    # a relation to a request whose cluster is not chosen yet (it fits nowhere now) is refused
    d.submit(2.0, "m", placed("big", 16))
    (out,) = d.submit(3.0, "m", rq("with", "a", 1, 600.0, to="big", how="COALLOC"))
    assert out.kind == "rejected" and out.code is ErrorCode.BAD_RELATION
    assert "with" not in d.policy.requests
    # no cluster known at all
    empty = Driver({})
    empty.open(0.0, "m")
    (out,) = empty.submit(0.0, "m", placed("m1", 1))
    assert out.kind == "rejected" and out.code is ErrorCode.UNKNOWN_CLUSTER


@pytest.mark.parametrize("fields, why", [
    ({"placement": "best-fit"}, "placement"),  # an unknown rule
    ({"placement": WORST_FIT, "clusters": []}, "clusters"),  # an empty set
    ({"placement": WORST_FIT, "clusters": ["a", "a"]}, "twice"),
    ({"placement": WORST_FIT, "cluster": "a"}, "not both"),
    ({}, "name a cluster"),
    ({"cluster": "a", "clusters": ["a"]}, "go with a placement"),
    ({"placement": WORST_FIT, "type": "preemptible"}, "preemptible"),
    ({"placement": WORST_FIT, "related_to": "x", "related_how": "COALLOC"}, "related"),
])
def test_a_request_that_leaves_its_cluster_to_the_rms_incoherently_is_not_a_request(fields, why):
    with pytest.raises(ValidationError, match=why):
        RequestSpec(id="r", nodes=1, duration=60.0, **fields)


def test_the_wire_rules_are_cluster_choices_rules():
    assert get_args(Placement) == RULES


# ==================================================================================================
# the property: an allowed cluster, the one cluster_choice.choose picks on the application's views
# ==================================================================================================
CLUSTERS = {"a": 16, "b": 24, "c": 8, "d": 32}


@st.composite
def loads(draw) -> list[tuple[str, int, float, float]]:
    """Background jobs: (cluster, nodes, submit time, duration)."""
    return draw(st.lists(st.tuples(st.sampled_from(sorted(CLUSTERS)), st.integers(1, 32), st.integers(0, 50),
                                   st.integers(10, 2000)), max_size=12))


@settings(max_examples=150, deadline=None)
@given(load=loads(), asks=st.lists(st.tuples(st.sampled_from(RULES), st.integers(1, 40), st.integers(10, 3000),
                                             st.none() | st.lists(st.sampled_from(sorted(CLUSTERS)), min_size=1,
                                                                  max_size=4, unique=True)),
                                   min_size=1, max_size=4),
       threshold=st.integers(0, 4))
def test_the_chosen_cluster_is_allowed_and_the_one_cluster_choice_picks_on_the_applications_views(
        load, asks, threshold):
    d = Driver(CLUSTERS, local_threshold=threshold, fair_start=0.0)
    d.open(0.0, "bg")
    for i, (c, n, at, dur) in enumerate(sorted(load, key=lambda j: j[2])):
        d.submit(float(at), "bg", rq(f"bg{i}", c, n, float(dur)))
    for k, (rule, nodes, dur, allowed) in enumerate(asks):
        at = 60.0 + k
        app = f"m{k}"
        d.open(at, app)
        # the views it is shown on opening: what the pass that places its request sees at its turn (the same
        # time, nothing else changed; after that pass its views show the request itself, running or placed)
        views = {c: d.np_view(app, c) for c in (allowed or CLUSTERS)}
        d.submit(at, app, placed(f"{app}.1", nodes, float(dur), rule, allowed))
        r = d.policy.requests.get(f"{app}.1")
        assert r is not None
        want = choose(rule, views, nodes, float(dur), d.now, threshold)
        if want is None and threshold:
            want = choose(rule, views, nodes, float(dur), d.now)  # (fits nowhere with the threshold: without)
        if want is None:
            assert r.unplaced and r.start == float("inf")
            continue
        assert r.cluster == want and r.cluster in (allowed or CLUSTERS)
        # placed where the rule's start is: it starts then, unless a request of higher priority is in the way
        assert r.start == views[want].earliest_fit(nodes, float(dur), d.now)
    d.run_until(5000.0)
    for k, (_, _, _, allowed) in enumerate(asks):
        s = d.started(f"m{k}.1")
        if s is not None:
            assert s.cluster in (allowed or CLUSTERS)
