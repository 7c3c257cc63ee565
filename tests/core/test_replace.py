"""The atomic replace (issue 17): a submission that names waiting requests it ``replaces`` cancels them and
adds its batch in one event, so no pass runs between -- the old request cannot start after it (a ``request``
then a ``done``, CooRM Fig. 5's order, let a pass start it in between). If one of them started first, the
whole submission is refused (``started``) and nothing changes; so does every other refusal (another
application's request, an unknown one, one replaced already...)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine import snapshot
from coorm.services.policy_engine.core import PolicySettings
from coorm.services.policy_engine.service import _EVENTS
from coorm.shared.events import (
    Accepted,
    EndReason,
    EndRequest,
    ErrorCode,
    OpenSession,
    Rejected,
    StartRequest,
    Submit,
    Tick,
)
from coorm.shared.requests import RequestSpec
from tests.core.driver import Driver, rq
from tests.core.test_properties import STARTED, WAITING, explain, settings_st, sizes_st, steps_st
from tests.core.test_properties import Driver as RandomDriver


def replace(d: Driver, at: float, app: str, old: tuple[str, ...], *requests: RequestSpec,
            pass_now: bool = True) -> list:
    d._advance(at)
    return d._record(d.cores.handle(Submit(at=at, app=app, requests=list(requests), replaces=old),
                                     pass_now=pass_now))


def starts(d: Driver, request: str) -> list[StartRequest]:
    return [x for x in d.decisions if isinstance(x, StartRequest) and x.request == request]


def _everything(cores: CoupledCores) -> tuple:
    """All the cores keep: the snapshot's state, and the stories and holds' bookkeeping it may not carry."""
    p = cores.policy
    return (snapshot.encode(cores), copy.deepcopy(p.stories), p.dirty, p._seq, copy.deepcopy(p.holds))


# ==================================================================================================
# accepted
# ==================================================================================================
def test_a_replace_cancels_the_waiting_request_and_accepts_the_new_one_in_the_same_step():
    d = Driver({"c0": 4}, fair_start=0.0)
    d.open(0.0, "a")
    d.open(0.0, "b")
    d.submit(0.0, "a", rq("a1", "c0", 4, 100))
    d.submit(1.0, "b", rq("b1", "c0", 4, 50))
    out = replace(d, 2.0, "b", ("b1",), rq("b2", "c0", 2, 80))
    assert out[0] == Accepted(stimulus_id=out[0].stimulus_id, app="b", requests=("b2",))
    (end,) = [x for x in out if isinstance(x, EndRequest)]
    assert (end.request, end.started, end.reason) == ("b1", False, EndReason.CANCELLED)
    assert d.policy.ended["b1"][1] is EndReason.CANCELLED and d.policy.requests["b2"].state is WAITING
    assert any(what == "replaced" and "b2" in detail for _, what, detail in d.policy.story("b1"))
    d.done(10.0, "a", "a1")
    d.run_until(200.0)
    assert starts(d, "b1") == [] and len(starts(d, "b2")) == 1


def _race(atomic: bool) -> Driver:
    """b waits with b1 (2 nodes) behind a1, whose walltime ends at 10; at 10 -- before the shell's tick for
    that end -- b chooses b2 instead. The pass due at 10 runs right after b's first message."""
    d = Driver({"c0": 4})
    d.open(0.0, "a")
    d.open(0.0, "b")
    d.submit(0.0, "a", rq("a1", "c0", 4, 10))
    d.submit(1.0, "b", rq("b1", "c0", 2, 50))
    if atomic:
        replace(d, 10.0, "b", ("b1",), rq("b2", "c0", 3, 40))
    else:  # CooRM Fig. 5's order: the new request, then the done of the old one
        d.submit(10.0, "b", rq("b2", "c0", 3, 40))
        d.done(10.0, "b", "b1")
    d.run_until(100.0)
    return d


def test_request_then_done_lets_the_pass_between_start_the_old_request_a_replace_does_not():
    old = _race(atomic=False)
    (started,) = starts(old, "b1")  # the defect: started, then ended at once by the done
    assert started.at == 10.0
    (ended,) = [x for x in old.decisions if isinstance(x, EndRequest) and x.request == "b1"]
    assert ended.started and ended.reason is EndReason.DONE
    new = _race(atomic=True)
    assert starts(new, "b1") == [] and [s.at for s in starts(new, "b2")] == [10.0]
    (ended,) = [x for x in new.decisions if isinstance(x, EndRequest) and x.request == "b1"]
    assert not ended.started and ended.reason is EndReason.CANCELLED


def test_a_group_is_replaced_as_a_whole():
    """A CEM's co-allocated group (one request per cluster) replaced by another group."""
    d = Driver({"c0": 4, "c1": 4}, fair_start=0.0)
    d.open(0.0, "a")
    d.open(0.0, "b")
    d.submit(0.0, "a", rq("a1", "c0", 4, 100), rq("a2", "c1", 4, 100, to="a1", how="COALLOC"))
    d.submit(1.0, "b", rq("g1", "c0", 3, 50), rq("g2", "c1", 3, 50, to="g1", how="COALLOC"))
    out = replace(d, 2.0, "b", ("g1", "g2"), rq("h1", "c0", 2, 70), rq("h2", "c1", 1, 70, to="h1", how="COALLOC"))
    assert out[0].requests == ("h1", "h2")
    assert {r: d.policy.ended[r][1] for r in ("g1", "g2")} == {"g1": EndReason.CANCELLED, "g2": EndReason.CANCELLED}
    d.done(5.0, "a", "a1")
    d.done(5.0, "a", "a2")
    d.run_until(100.0)
    assert starts(d, "g1") == starts(d, "g2") == []
    assert [s.at for s in starts(d, "h1") + starts(d, "h2")] == [5.0, 5.0]


def test_a_replaced_next_successor_frees_its_predecessor_for_the_new_one():
    """An evolving application revising the growth it asked for: ``s1 NEXT r`` replaced by ``s2 NEXT r``."""
    d = Driver({"c0": 8})
    d.open(0.0, "a")
    d.submit(0.0, "a", rq("r", "c0", 2, 20))
    d.submit(1.0, "a", rq("s1", "c0", 6, 20, to="r", how="NEXT"))
    out = replace(d, 2.0, "a", ("s1",), rq("s2", "c0", 4, 20, to="r", how="NEXT"))
    assert isinstance(out[0], Accepted)
    assert d.policy.requests["r"].successor == "s2"
    d.run_until(100.0)
    (s2,) = starts(d, "s2")
    assert (s2.at, s2.carry_from, s2.carried) == (20.0, "r", 2) and starts(d, "s1") == []


# ==================================================================================================
# refused: nothing changes
# ==================================================================================================
@pytest.fixture
def d() -> Driver:
    """a runs a1 (c0, all of it) and pre-allocation p (c1) with x inside; b waits with b1 and has ended b0;
    a has replaced a-w1 by a-w2 (waiting)."""
    d = Driver({"c0": 4, "c1": 4})
    d.open(0.0, "a")
    d.open(0.0, "b")
    d.submit(0.0, "a", rq("a1", "c0", 4, 100), rq("p", "c1", 4, 100, type="pre-allocation"))
    d.submit(0.5, "a", rq("x", "c1", 2, 50, to="p", how="COALLOC"))
    d.submit(0.5, "b", rq("b0", "c0", 1, 100), rq("b1", "c0", 2, 100))
    d.done(0.6, "b", "b0")
    d.submit(0.7, "a", rq("a-w1", "c0", 2, 100))
    replace(d, 0.8, "a", ("a-w1",), rq("a-w2", "c0", 2, 100))
    d.run_until(1.0)
    p = d.policy
    assert p.requests["a1"].state is STARTED and p.requests["p"].state is STARTED
    assert p.requests["x"].state is STARTED and p.requests["x"].container == "p"
    return d


@pytest.mark.parametrize(
    ("app", "old", "new", "code", "words"),
    [
        # the race: what it replaces has started (the launcher has not heard yet)
        ("a", ("a1",), [rq("n", "c0", 2, 10)], ErrorCode.STARTED, "has started"),
        # a pre-allocation with a request running inside it
        ("a", ("p",), [rq("n", "c1", 2, 10)], ErrorCode.STARTED, "has started"),
        ("a", ("x",), [rq("n", "c1", 2, 10)], ErrorCode.STARTED, "has started"),
        # one of two started: the whole submission is refused, the waiting one is not cancelled either
        ("a", ("a-w2", "a1"), [rq("n", "c0", 2, 10)], ErrorCode.STARTED, "a1 has started"),
        # another application's (waiting, ended), one that never was
        ("a", ("b1",), [rq("n", "c0", 2, 10)], ErrorCode.NOT_YOURS, "another application"),
        ("a", ("b0",), [rq("n", "c0", 2, 10)], ErrorCode.NOT_YOURS, "another application"),
        ("a", ("nope",), [rq("n", "c0", 2, 10)], ErrorCode.UNKNOWN_REQUEST, "no request nope"),
        # replaced twice, named twice, cancelled already
        ("a", ("a-w1",), [rq("n", "c0", 2, 10)], ErrorCode.ENDED, "already ended (cancelled)"),
        ("a", ("a-w2", "a-w2"), [rq("n", "c0", 2, 10)], ErrorCode.BAD_REQUEST, "named twice"),
        ("b", ("b0",), [rq("n", "c0", 2, 10)], ErrorCode.ENDED, "already ended (cancelled)"),
        # the new batch relates to what it replaces, reuses its id, or is itself refused
        ("a", ("a-w2",), [rq("n", "c0", 2, 10, to="a-w2", how="COALLOC")], ErrorCode.BAD_RELATION, "replaces"),
        ("a", ("a-w2",), [rq("a-w2", "c0", 1, 10)], ErrorCode.DUPLICATE, "already used"),
        ("a", ("a-w2",), [rq("n", "c9", 1, 10)], ErrorCode.UNKNOWN_CLUSTER, "c9"),
        # a session that is not open
        ("zz", ("a-w2",), [rq("n", "c0", 1, 10)], ErrorCode.UNKNOWN_APP, "no open session"),
    ],
)
def test_a_refused_replace_changes_nothing(d, app, old, new, code, words):
    before = _everything(d.cores)
    out = d.cores.handle(Submit(at=d.now, app=app, requests=new, replaces=old))
    assert len(out) == 1 and isinstance(out[0], Rejected), out
    assert out[0].code is code and words in out[0].reason, out[0]
    assert _everything(d.cores) == before
    # and the id of a refused batch is free: the same batch, without the replace, is accepted
    if code in (ErrorCode.STARTED, ErrorCode.NOT_YOURS, ErrorCode.ENDED):
        assert isinstance(d.cores.handle(Submit(at=d.now, app=app, requests=new))[0], Accepted)


def test_the_checks_can_fail():
    """The fixture's state is what the refusals above are refused on: a replace of a's waiting request goes."""
    d = Driver({"c0": 4})
    d.open(0.0, "a")
    d.submit(0.0, "a", rq("a1", "c0", 4, 100), rq("w", "c0", 2, 100))
    before = _everything(d.cores)
    out = d.cores.handle(Submit(at=d.now, app="a", requests=[rq("n", "c0", 2, 10)], replaces=("w",)))
    assert isinstance(out[0], Accepted) and _everything(d.cores) != before


# ==================================================================================================
# the event log and the snapshot
# ==================================================================================================
def test_a_replace_is_logged_and_replayed_and_its_result_survives_a_snapshot():
    """The event as the policy engine logs it (JSON) replays to the same state; a snapshot taken after it
    restores cores that decide the same from then on."""
    events = [
        Tick(at=0.0),
        Submit(at=1.0, app="b", requests=[rq("b1", "c0", 4, 50)]),
        Submit(at=2.0, app="b", requests=[rq("b2", "c0", 2, 80)], replaces=("b1",)),
    ]
    logged = [_EVENTS.validate_json(_EVENTS.dump_json(e)) for e in events]
    assert logged[2].replaces == ("b1",) and logged == events

    def cores() -> CoupledCores:
        c = CoupledCores(PolicySettings(reschedule_interval=0.0), validate=True)
        c.register(0.0, "c0", ["c0n0", "c0n1", "c0n2", "c0n3"])
        c.handle(OpenSession(at=0.0, app="a"))
        c.handle(OpenSession(at=0.0, app="b"))
        c.handle(Submit(at=0.0, app="a", requests=[rq("a1", "c0", 4, 10)]))
        return c

    one, two = cores(), cores()
    outs = [one.handle(e) for e in events]
    assert [two.handle(e) for e in logged] == outs
    restored = snapshot.decode(snapshot.encode(one), snapshot.FORMAT, one.policy.settings, validate=True)
    assert snapshot.encode(restored) == snapshot.encode(one)
    ticks = [Tick(at=20.0, stimulus_id="t20"), Tick(at=200.0, stimulus_id="t200")]
    later = [one.handle(t) for t in ticks]
    assert [restored.handle(t) for t in ticks] == later
    assert [x.request for out in later for x in out if isinstance(x, StartRequest)] == ["b2"]


# ==================================================================================================
# the property
# ==================================================================================================
def _op_replace(drv: RandomDriver) -> None:
    """A random replace, hostile or not: an application names some of its requests (waiting, started), of
    another's, ended or unknown ids, and a random batch; fed alone (no pass) so that its own effect is seen."""
    apps = drv.apps()
    if not apps:
        drv.op_open()
        return
    app = drv.pick(apps)
    pool = [r.id for a in apps for r in drv.live(a)] + list(drv.policy.ended) + ["nope"]
    mine_waiting = [r.id for r in drv.live(app, WAITING)]
    if mine_waiting and drv.draw(st.booleans()):
        old = drv.draw(st.lists(st.sampled_from(mine_waiting), min_size=1, max_size=3))  # (maybe twice)
    else:
        old = drv.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    batch = drv.random_batch(app)
    before = _everything(drv.cores)
    states = {r.id: (r.app, r.phase) for r in drv.policy.requests.values()}
    out = drv.feed(Submit(at=drv.t, app=app, requests=batch, replaces=tuple(old)), pass_now=False)
    first = out[0]
    event(f"replace: {first.code.value if isinstance(first, Rejected) else 'accepted'}")
    if isinstance(first, Rejected):
        assert len(out) == 1 and _everything(drv.cores) == before, (first, out)
        if first.code is ErrorCode.STARTED:  # (one of them has: the application's, started)
            assert any(r in drv.policy.requests and drv.policy.requests[r].state is STARTED for r in old)
        return
    assert isinstance(first, Accepted) and out == [first], out
    # exactly the new requests in place of the old: every old one was the app's and waiting, now cancelled;
    # nothing else moved
    p = drv.policy
    assert all(states[r][0] == app for r in old) and len(set(old)) == len(old)
    assert all(r not in p.requests and p.ended[r][1] is EndReason.CANCELLED for r in old)
    assert set(first.requests) == {s.id for s in batch} and all(p.requests[s.id].state is WAITING for s in batch)
    after = {r.id: (r.app, r.phase) for r in p.requests.values()}
    assert {k: v for k, v in states.items() if k not in old} == {k: v for k, v in after.items()
                                                                 if k not in first.requests}
    drv.replaced.update(old)


@given(data=st.data(), settings=settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_a_replace_changes_nothing_or_puts_exactly_the_new_requests_in_place_of_the_old(data, settings, sizes,
                                                                                        steps):
    """Random runs with random replaces among the other operations (the safety invariants checked after every
    event by the driver): a replace is refused and changes nothing, or the new requests wait in place of the
    old ones -- none of which ever starts afterwards."""
    drv = RandomDriver(data, settings, sizes, apps=data.draw(st.integers(1, 3)))
    drv.replaced = set()
    with explain(settings, drv):
        drv.run(steps, extra={"replace": (6, _op_replace)})
        for _ in range(5):
            drv.wake()
    replaced = drv.replaced
    started = {x.request for out in drv.outs for x in out if isinstance(x, StartRequest)}
    assert not replaced & started, replaced & started
