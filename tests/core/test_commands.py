"""Bad input gets a clear error and changes nothing; good input is acknowledged."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from coorm.shared.events import Done, OpenSession, Submit
from coorm.shared.requests import RequestBatch, RequestSpec
from tests.core.driver import Driver, rq


def _state(d: Driver):
    p = d.policy
    return copy.deepcopy((
        {a: list(app.requests) for a, app in p.apps.items()},
        {r.id: (r.state, r.start, r.nodes) for r in p.requests.values()},
        dict(p.ended),
        p.dirty,
        dict(d.cores.allocator.allocations),
    ))


@pytest.fixture
def d() -> Driver:
    d = Driver({"c0": 8, "c1": 4})
    d.open(0.0, "a")
    d.open(0.0, "b")
    d.submit(0.0, "a", rq("a1", "c0", 4, 100), rq("a2", "c0", 4, 100, type="preemptible"))
    d.submit(0.0, "b", rq("b1", "c1", 2, 100))
    d.run_until(1.0)
    return d


def _rejected(d: Driver, event, code: str, words: str) -> None:
    before = _state(d)
    out = d.cores.handle(event)
    rejections = [x for x in out if x.kind == "rejected"]
    assert len(rejections) == 1, out
    assert rejections[0].code == code
    assert words in rejections[0].reason
    assert _state(d) == before


@pytest.mark.parametrize(
    ("requests", "code", "words"),
    [
        ([rq("x", "c9", 1, 10)], "unknown_cluster", "unknown cluster c9"),
        ([rq("a1", "c0", 1, 10)], "duplicate", "already used"),
        ([rq("x", "c0", 1, 10, to="b1", how="NEXT")], "not_yours", "another application"),
        ([rq("x", "c0", 1, 10, to="nope", how="COALLOC")], "unknown_request", "no request nope"),
        ([rq("x", "c1", 1, 10, to="a1", how="NEXT")], "bad_relation", "same type and cluster"),
        ([rq("x", "c0", 1, 10, type="pre-allocation", to="a1", how="NEXT")], "bad_relation", "same type"),
        ([rq("x", "c0", 1, 10, to="a2", how="COALLOC")], "bad_relation", "co-allocated with a preemptible"),
        # one bad request in a batch refuses the whole batch
        ([rq("ok", "c0", 1, 10), rq("bad", "c7", 1, 10)], "unknown_cluster", "c7"),
    ],
)
def test_bad_submissions_are_refused_and_change_nothing(d, requests, code, words):
    _rejected(d, Submit(at=2.0, app="a", requests=requests), code, words)


def test_second_next_successor_is_refused(d):
    d.submit(2.0, "a", rq("a1n", "c0", 4, 100, to="a1", how="NEXT"))
    _rejected(d, Submit(at=2.0, app="a", requests=[rq("a1m", "c0", 2, 50, to="a1", how="NEXT")]),
              "bad_relation", "already has a NEXT successor")


def test_unknown_application(d):
    _rejected(d, Submit(at=2.0, app="ghost", requests=[rq("x", "c0", 1, 10)]), "unknown_app", "ghost")
    _rejected(d, Done(at=2.0, app="ghost", request="a1"), "unknown_app", "ghost")


def test_done_on_another_apps_request(d):
    _rejected(d, Done(at=2.0, app="b", request="a1"), "not_yours", "another application")


def test_done_on_unknown_or_ended_request(d):
    _rejected(d, Done(at=2.0, app="a", request="zzz"), "unknown_request", "zzz")
    d.done(3.0, "b", "b1")
    d.run_until(4.0)
    _rejected(d, Done(at=5.0, app="b", request="b1"), "ended", "already ended")


def test_release_of_nodes_the_request_does_not_hold(d):
    _rejected(d, Done(at=2.0, app="a", request="a1", released=("c1n0",)), "bad_release", "does not hold")
    own = d.nodes_of("a1")
    _rejected(d, Done(at=2.0, app="a", request="a1", released=(own[0], own[0])), "bad_release", "twice")


def test_duplicate_session(d):
    _rejected(d, OpenSession(at=2.0, app="a"), "duplicate", "already has an open session")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"id": "x", "cluster": "c0", "nodes": -1, "duration": 10}, "greater than or equal to 1"),
        ({"id": "x", "cluster": "c0", "nodes": 0, "duration": 10}, "greater than or equal to 1"),
        ({"id": "x", "cluster": "c0", "nodes": 1, "duration": -5}, "greater than 0"),
        ({"id": "x", "cluster": "c0", "nodes": 1}, "unbounded"),
        ({"id": "x", "cluster": "c0", "nodes": 1, "duration": 1, "related_how": "NEXT"}, "needs related_to"),
        ({"id": "x", "cluster": "c0", "nodes": 1, "duration": 1, "related_to": "x", "related_how": "NEXT"},
         "itself"),
        ({"id": "x y", "cluster": "c0", "nodes": 1, "duration": 1}, "pattern"),
        ({"id": "x", "cluster": "c0", "nodes": "many", "duration": 1}, "integer"),
        ({"id": "x", "cluster": "c0", "nodes": 1, "duration": 1, "type": "best-effort"}, "pre-allocation"),
        ({"id": "x", "cluster": "c0", "nodes": 1, "duration": 1, "colour": "red"}, "Extra inputs"),
    ],
)
def test_malformed_requests_are_refused_with_a_readable_reason(fields, words):
    with pytest.raises(ValidationError) as err:
        RequestSpec.model_validate(fields)
    assert words in str(err.value)


def test_relation_cycle_in_a_batch_is_refused():
    with pytest.raises(ValidationError, match="relation cycle: p -> q -> p"):
        RequestBatch(requests=[
            RequestSpec(id="p", cluster="c0", nodes=1, duration=1, related_to="q", related_how="NEXT"),
            RequestSpec(id="q", cluster="c0", nodes=1, duration=1, related_to="p", related_how="NEXT"),
        ])


def test_forward_reference_in_a_batch_is_refused():
    with pytest.raises(ValidationError, match="comes later in the batch"):
        RequestBatch(requests=[
            RequestSpec(id="p", cluster="c0", nodes=1, duration=1, related_to="q", related_how="COALLOC"),
            RequestSpec(id="q", cluster="c0", nodes=1, duration=1),
        ])


def test_cycle_inside_a_submit_is_refused_by_the_core(d):
    batch = [
        RequestSpec(id="p", cluster="c0", nodes=1, duration=1, related_to="q", related_how="NEXT"),
        RequestSpec(id="q", cluster="c0", nodes=1, duration=1, related_to="p", related_how="NEXT"),
    ]
    _rejected(d, Submit(at=2.0, app="a", requests=batch), "bad_request", "relation cycle")


def test_good_input_is_acknowledged(d):
    out = d.submit(2.0, "a", rq("a3", "c1", 2, 50))
    assert [x.kind for x in out][0] == "accepted" and out[0].requests == ("a3",)


def test_a_request_larger_than_its_cluster_is_refused_unless_the_operator_lets_it_wait():
    d = Driver({"c0": 8}, oversize_waits=False)
    d.open(0.0, "a")
    d.node_down(0.5, "c0n7")  # down nodes count: a request for all 8 may wait for it to come back
    _rejected(d, Submit(at=1.0, app="a", requests=[rq("ok", "c0", 1, 10), rq("big", "c0", 9, 10)]), "too_large",
              "c0 has 8")
    d.submit(1.0, "a", rq("all", "c0", 8, 10))
    assert d.policy.requests["all"].state.value == "waiting"
    patient = Driver({"c0": 8})  # the papers' default: it waits
    patient.open(0.0, "a")
    patient.submit(0.0, "a", rq("big", "c0", 9, 10))
    assert patient.policy.requests["big"].state.value == "waiting"


def test_a_growth_cancelled_before_it_started_can_be_asked_again(d):
    """An evolving application over-asked: it cancels its waiting NEXT request and asks for less; the
    running request takes the new successor (it was refused with "already has a NEXT successor")."""
    d.submit(2.0, "a", rq("a1g", "c0", 8, 100, to="a1", how="NEXT"))
    assert d.policy.requests["a1g"].state.value == "waiting"  # a2 holds the other nodes preemptibly
    d.done(2.0, "a", "a1g")
    assert d.ended("a1g") is not None and not d.ended("a1g").started
    out = d.submit(2.0, "a", rq("a1h", "c0", 6, 100, to="a1", how="NEXT"))
    assert [x.kind for x in out][:1] == ["accepted"], out
    d.done(3.0, "a", "a2")  # its preemptible nodes go back: the growth to 6 fits
    d.done(3.0, "a", "a1")
    d.run_until(20.0)
    start = d.started("a1h")
    assert start is not None and start.carry_from == "a1" and start.carried == 4
