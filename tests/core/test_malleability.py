"""KOALA's malleability management in the policy core (services/policy_engine/shares.py, preemption.py):
FPSMA and EGS as splits of the preemptible capacity, precedence to running (PRA) or waiting (PWA)
applications, the threshold of nodes kept for local users; and the settings that choose them.

The splits' invariants are properties of :func:`shares.koala` over random holdings; each policy's defining
behaviour is a scenario through the coupled cores; the core's own invariants (the threshold, PRA never
shrinking a running malleable application for a waiting one) are checked over random runs of the property
tests' driver.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coorm.services.policy_engine.core import PolicySettings
from coorm.services.policy_engine.service import SettingError, main, policy_settings
from coorm.services.policy_engine.shares import EGS, FPSMA, koala, preemptive_share
from coorm.shared.events import PreemptionDeadline, StartRequest, Submit
from coorm.shared.requests import RequestType
from coorm.shared.settings import Settings
from tests.core.driver import Driver as Scenario
from tests.core.driver import rq
from tests.core.test_properties import NP, PA, PRE, Driver, explain, sizes_st, steps_st

KOALA = (FPSMA, EGS)


# ==================================================================================================
# the splits
# ==================================================================================================
holdings_st = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=6)


@given(policy=st.sampled_from(KOALA), capacity=st.integers(0, 60), apps=holdings_st, threshold=st.integers(0, 5))
def test_a_grow_gives_only_free_nodes_above_the_threshold_and_no_more_than_asked(policy, capacity, apps, threshold):
    held = [h for h, _ in apps]
    asked = [h + x for h, x in apps]
    out = koala(capacity, held, asked, policy, threshold)
    if capacity < sum(held):
        return
    assert all(h <= o <= a for h, o, a in zip(held, out, asked, strict=True)), (held, out, asked)
    free = max(capacity - threshold - sum(held), 0)
    # every free node above the threshold is handed out unless every application has what it asked
    assert sum(out) - sum(held) == min(free, sum(a - h for h, a in zip(held, asked, strict=True)))


@given(policy=st.sampled_from(KOALA), apps=holdings_st, lacking=st.integers(1, 40), threshold=st.integers(0, 5))
def test_a_shrink_takes_exactly_what_the_capacity_lacks_and_grows_no_one(policy, apps, lacking, threshold):
    held = [h for h, _ in apps]
    capacity = max(sum(held) - lacking, 0)
    if capacity >= sum(held):
        return
    out = koala(capacity, held, [h + x for h, x in apps], policy, threshold)
    assert all(0 <= o <= h for h, o in zip(held, out, strict=True))
    assert sum(out) == capacity  # (the threshold does not make a shrink deeper: local work shrinks no one)


@given(capacity=st.integers(0, 60), apps=holdings_st)
def test_fpsma_grows_the_earliest_started_first_and_shrinks_the_latest_started_first(capacity, apps):
    held = [h for h, _ in apps]
    asked = [h + x for h, x in apps]
    out = koala(capacity, held, asked, FPSMA)
    for i in range(len(out)):
        for j in range(i + 1, len(out)):
            if capacity >= sum(held) and out[j] > held[j]:
                assert out[i] == asked[i], f"{j} grew while {i}, started before it, still lacked: {out}"
            if capacity < sum(held) and out[i] < held[i]:
                assert out[j] == 0, f"{i} shrank while {j}, started after it, kept {out[j]}: {out}"


@given(capacity=st.integers(0, 60), apps=holdings_st)
def test_egs_spreads_a_grow_or_a_shrink_evenly_within_one_node_the_remainder_to_the_oldest(capacity, apps):
    held = [h for h, _ in apps]
    asked = [h + x for h, x in apps]
    out = koala(capacity, held, asked, EGS)
    if capacity >= sum(held):
        grown = [o - h for h, o in zip(held, out, strict=True)]
        short = [i for i in range(len(out)) if out[i] < asked[i]]  # not capped by what they asked
        for i in short:
            assert all(grown[j] <= grown[i] + 1 for j in range(len(out))), f"uneven grow {grown} of {held}"
            assert all(grown[i] >= grown[j] for j in short if j > i), f"a younger one got the bonus: {grown}"
    else:
        taken = [h - o for h, o in zip(held, out, strict=True)]
        left = [i for i in range(len(out)) if out[i] > 0]  # not emptied
        for i in left:
            assert all(taken[j] <= taken[i] + 1 for j in range(len(out))), f"uneven shrink {taken} of {held}"
            assert all(taken[i] <= taken[j] for j in left if j > i), f"an older one paid the malus: {taken}"


def test_a_view_is_what_the_application_would_hold_if_it_asked_for_everything():
    # three applications hold 2 each of 12; the first asks for 3 more, the others for 6
    held, asked = [2, 2, 2], [5, 8, 8]
    assert [preemptive_share(12, asked, i, FPSMA, held) for i in range(3)] == [8, 5, 2]
    assert [preemptive_share(12, asked, i, EGS, held) for i in range(3)] == [4, 4, 4]
    assert koala(12, held, asked, FPSMA) == [5, 5, 2] and koala(12, held, asked, EGS) == [4, 4, 4]
    assert koala(13, held, asked, EGS) == [5, 4, 4]  # the remainder to the earliest started (KOALA's bonus)
    assert koala(4, [2, 3, 3], asked, EGS) == [1, 2, 1]  # the malus from the latest started


# ==================================================================================================
# scenarios: each policy's defining behaviour through the coupled cores
# ==================================================================================================
def _three_holding_two(policy: str, up: int = 12, **settings) -> Scenario:
    """A, B, C open and start one after another, each holding 2 preemptible nodes of c0."""
    d = Scenario({"c0": up}, preemptible=policy, preempt_grace=5.0, **settings)
    for i, app in enumerate("ABC"):
        d.open(float(i), app)
        d.submit(float(i), app, rq(app + "1", "c0", 2, None, type="preemptible"))
    d.run_until(3.0)
    assert all(d.started(a + "1") for a in "ABC")
    return d


def _ask_together(d: Scenario, at: float, nodes: dict[str, int]) -> None:
    """Each application asks for more in the same pass (the last event runs it)."""
    last = list(nodes)[-1]
    for app, n in nodes.items():
        spec = rq(app + "2", "c0", n, None, type="preemptible")
        d._record(d.cores.handle(Submit(at=at, app=app, requests=[spec]), pass_now=app == last))


def _views(d: Scenario, apps: str = "ABC") -> dict[str, int]:
    return {a: d.p_view(a, "c0").value_at(d.now) for a in apps}


def _deadlines(d: Scenario) -> dict[str, tuple[int, int]]:
    return {x.app: (x.held, x.allowed) for x in d.decisions if isinstance(x, PreemptionDeadline)}


@pytest.mark.parametrize("policy, views, grown", [
    ("fpsma", {"A": 8, "B": 2, "C": 2}, ["A2"]),  # all the free nodes to the earliest started
    ("egs", {"A": 4, "B": 4, "C": 4}, []),  # spread evenly: 6 asked each does not fit
    ("filling", {"A": 4, "B": 4, "C": 4}, []),  # CooRMv2's equi-partition of the whole capacity
])
def test_six_free_nodes_that_three_applications_ask_for_at_once(policy, views, grown):
    d = _three_holding_two(policy)
    _ask_together(d, 3.0, {"A": 6, "B": 6, "C": 6})
    assert _views(d) == views
    assert [r for r in ("A2", "B2", "C2") if d.started(r)] == grown


def test_egs_grows_every_application_when_each_asks_its_even_share():
    d = _three_holding_two("egs", up=13)
    assert _views(d) == {"A": 9, "B": 9, "C": 9}  # no one asks for more: each could have all 7 free
    _ask_together(d, 3.0, {"A": 9, "B": 9, "C": 9})
    assert _views(d) == {"A": 5, "B": 4, "C": 4}  # 7 free: 3, 2, 2 -- the bonus to the earliest started
    for app, n in (("A", 3), ("B", 2), ("C", 2)):
        d.done(3.0, app, app + "2")
        d.submit(3.0, app, rq(app + "3", "c0", n, None, type="preemptible"))
    assert all(d.started(a + "3") for a in "ABC")
    assert d.policy.held_preemptibly("A", "c0") == 5 and d.policy.held_preemptibly("C", "c0") == 4


def test_fpsma_ranks_applications_by_when_they_started_not_when_they_opened():
    """B's session opens first but its work starts later: A is the previously started one."""
    d = Scenario({"c0": 10}, preemptible="fpsma")
    d.open(0.0, "B")
    d.open(1.0, "A")
    d.submit(1.0, "A", rq("A1", "c0", 2, None, type="preemptible"))
    d.submit(2.0, "B", rq("B1", "c0", 2, None, type="preemptible"))
    _ask_together(d, 3.0, {"B": 6, "A": 6})
    assert _views(d, "AB") == {"A": 8, "B": 2}
    assert d.started("A2") and not d.started("B2")


@pytest.mark.parametrize("policy, allowed", [
    ("fpsma", {"C": (2, 0), "B": (5, 3)}),  # from the latest started first; A keeps all it holds
    ("egs", {"A": (4, 3), "B": (4, 3), "C": (4, 2)}),  # evenly; the malus from the latest started
])
def test_pwa_a_waiting_rigid_job_shrinks_running_malleable_ones(policy, allowed):
    d = _three_holding_two(policy)
    grow = {"A": 3, "B": 3, "C": 0} if policy == "fpsma" else {"A": 2, "B": 2, "C": 2}
    for app, n in grow.items():
        if n:
            d.submit(3.0, app, rq(app + "2", "c0", n, None, type="preemptible"))
    assert sum(d.policy.held_preemptibly(a, "c0") for a in "ABC") == 12
    d.open(4.0, "R")
    d.submit(4.0, "R", rq("R1", "c0", 4, 100))
    assert _deadlines(d) == allowed  # mandatory: within the grace, or the session is ended
    assert d.policy.requests["R1"].start == 4.0 and not d.started("R1")  # blocked until they release


@pytest.mark.parametrize("policy", ["fpsma", "egs", "filling", "strict"])
def test_pra_a_waiting_rigid_job_waits_for_running_malleable_ones(policy):
    d = _three_holding_two(policy, precedence="running")
    for app in "ABC":
        d.submit(3.0, app, rq(app + "2", "c0", 2, None, type="preemptible"))
    assert sum(d.policy.held_preemptibly(a, "c0") for a in "ABC") == 12
    d.open(4.0, "R")
    d.submit(4.0, "R", rq("R1", "c0", 4, 100))
    d.run_until(30.0)
    assert _deadlines(d) == {} and not d.started("R1")  # no one shrinks; the rigid job waits
    d.done(30.0, "C", "C2")  # what is given back, voluntarily, goes to the waiting job
    d.done(30.0, "B", "B2")
    assert d.started("R1").at == 30.0


@pytest.mark.parametrize("policy", ["fpsma", "egs"])
def test_the_threshold_is_never_handed_to_malleable_work_and_local_work_on_it_shrinks_no_one(policy):
    d = Scenario({"c0": 10}, preemptible=policy, local_threshold=2)
    d.open(0.0, "M")
    assert d.p_view("M", "c0").value_at(0.0) == 8
    d.submit(0.0, "M", rq("M1", "c0", 9, None, type="preemptible"))
    assert not d.started("M1")
    d.done(0.0, "M", "M1")
    d.submit(0.0, "M", rq("M2", "c0", 8, None, type="preemptible"))
    assert d.started("M2")
    d.open(1.0, "L")  # a rigid job lands on the two nodes kept free: it shrinks no one
    d.submit(1.0, "L", rq("L1", "c0", 2, 100))
    assert d.started("L1") and _deadlines(d) == {}
    assert d.p_view("M", "c0").value_at(1.0) == 8


def test_under_the_whole_set_policies_the_threshold_is_taken_off_the_capacity():
    d = Scenario({"c0": 10}, preemptible="filling", local_threshold=2, preempt_grace=5.0)
    d.open(0.0, "M")
    d.submit(0.0, "M", rq("M1", "c0", 8, None, type="preemptible"))
    d.open(1.0, "L")
    d.submit(1.0, "L", rq("L1", "c0", 2, 100))
    assert d.started("L1") and _deadlines(d) == {"M": (8, 6)}


@pytest.mark.parametrize("policy", ["filling", "strict"])
def test_a_start_waits_for_the_shrink_it_causes_rather_than_take_the_threshold(policy):
    """Found by the property below (filling, waiting, threshold 1): B's view counts on A's shrink, but
    the cluster's one idle node is the one kept for local users; B starts once A has given its node back."""
    d = Scenario({"c0": 2}, preemptible=policy, precedence="waiting", local_threshold=1, preempt_grace=5.0)
    d.open(0.0, "B")  # (first in rank: the share of 1 node is B's)
    d.open(0.0, "A")
    d.submit(0.0, "A", rq("A1", "c0", 1, None, type="preemptible"))
    assert d.started("A1")
    d.submit(1.0, "B", rq("B1", "c0", 1, None, type="preemptible"))
    assert _deadlines(d) == {"A": (1, 0)}
    assert not d.started("B1")
    d.done(2.0, "A", "A1")
    assert d.started("B1")


def test_a_drop_announced_for_later_is_a_voluntary_shrink_and_becomes_mandatory_when_it_comes():
    """KOALA's two shrinks: M's view shows R's start at 100 as a drop to come, with no deadline (M may give
    its nodes back early, or not); at 100 the drop is there and M has its grace to give them back."""
    d = Scenario({"c0": 10}, preemptible="egs", precedence="waiting", preempt_grace=5.0)
    for app in "XMR":
        d.open(0.0, app)
    d.submit(0.0, "X", rq("X1", "c0", 4, 100))
    d.submit(1.0, "M", rq("M1", "c0", 6, None, type="preemptible"))
    d.submit(2.0, "R", rq("R1", "c0", 10, 50))
    assert d.started("M1") and not d.started("R1")
    view = d.p_view("M", "c0")
    assert (view.value_at(2.0), view.value_at(100.0)) == (6, 0)  # announced
    assert _deadlines(d) == {}
    d.done(100.0, "X", "X1")
    assert _deadlines(d) == {"M": (6, 0)} and not d.started("R1")  # now mandatory
    d.done(101.0, "M", "M1")
    assert d.started("R1")


# ==================================================================================================
# the core's invariants over random runs
# ==================================================================================================
class _Steady(Driver):
    """Random runs whose nodes never go down and, with ``no_prealloc``, without pre-allocations: nodes lost
    or lent from a pre-allocation its owner then uses shrink malleable work whatever the precedence."""

    no_prealloc = False

    def spec(self, rtype=None, *args, **kwargs):
        if self.no_prealloc:
            rtype = NP if rtype is PA else (rtype or self.pick([NP, PRE, PRE]))
        return super().spec(rtype, *args, **kwargs)

    def op_down(self) -> None:
        self.op_wake()

    def op_up(self) -> None:
        self.op_wake()


koala_settings_st = st.builds(
    PolicySettings,
    fair_start=st.sampled_from([0.0, 2.0]),
    reschedule_interval=st.sampled_from([0.0, 1.0]),
    preempt_grace=st.sampled_from([0.0, 5.0]),
    preemptible=st.sampled_from(["filling", "strict", "fpsma", "egs"]),
    precedence=st.sampled_from(["waiting", "running"]),
    local_threshold=st.sampled_from([0, 1, 3]),
)


@given(data=st.data(), settings=koala_settings_st, sizes=sizes_st, steps=steps_st(5, 35))
def test_a_grow_never_hands_out_the_threshold(data, settings, sizes, steps):
    """After any event in which a preemptible request starts with nodes it did not carry from its
    predecessor, the nodes held preemptibly on its cluster leave the threshold out."""
    drv = _Steady(data, settings, sizes, apps=data.draw(st.integers(1, 3)))
    threshold = settings.local_threshold

    def after(ev, out):
        pol = drv.policy
        for d in out:
            if isinstance(d, StartRequest) and d.type is RequestType.PREEMPTIBLE and d.nodes > d.carried:
                held = sum(r.nodes for r in pol.iter_started(d.cluster) if r.preemptible)
                assert held <= max(pol.clusters[d.cluster] - threshold, 0), (
                    f"{d.request} grew {d.app} to {held} preemptible nodes of {d.cluster}: "
                    f"{pol.clusters[d.cluster]} up, {threshold} kept for local users")

    with explain(settings, drv):
        _watch(drv, after)
        drv.run(steps)


@given(data=st.data(), policy=st.sampled_from(KOALA), sizes=sizes_st, steps=steps_st(5, 35))
def test_pra_never_shrinks_a_running_malleable_application(data, policy, sizes, steps):
    """Under PRA, with KOALA's incremental policies, no holder is ever told to give nodes back: waiting
    requests, rigid or malleable, wait (nodes never go down here, and there are no pre-allocations)."""
    settings = PolicySettings(preemptible=policy, precedence="running", reschedule_interval=0.0,
                              local_threshold=data.draw(st.sampled_from([0, 2])))
    drv = _Steady(data, settings, sizes, apps=data.draw(st.integers(1, 3)))
    drv.no_prealloc = True

    def after(ev, out):
        told = [d for d in out if isinstance(d, PreemptionDeadline)]
        assert not told, f"PRA: {told[0].app} told to shrink from {told[0].held} to {told[0].allowed}"

    with explain(settings, drv):
        _watch(drv, after)
        drv.run(steps)


def _watch(drv: Driver, check) -> None:
    """Call ``check(event, decisions)`` after every event the driver feeds, after its monitor."""
    feed = drv.feed

    def fed(ev, pass_now=None):
        out = feed(ev, pass_now)
        check(ev, out)
        return out

    drv.feed = fed  # type: ignore[method-assign]


# ==================================================================================================
# the settings
# ==================================================================================================
@pytest.mark.parametrize("env, policy", [
    ({"COORM_MALLEABLE_POLICY": "fpsma"}, "fpsma"),
    ({"COORM_PREEMPTIBLE": "egs"}, "egs"),  # its former name
    ({"COORM_MALLEABLE_POLICY": "strict", "COORM_PREEMPTIBLE": "egs"}, "strict"),
    ({}, "filling"),
])
def test_the_malleability_policy_is_read_from_its_variable_or_its_former_name(monkeypatch, env, policy):
    for var in ("COORM_MALLEABLE_POLICY", "COORM_PREEMPTIBLE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("COORM_PRECEDENCE", "running")
    monkeypatch.setenv("COORM_LOCAL_THRESHOLD", "3")
    ps = policy_settings(Settings())
    assert (ps.preemptible, ps.precedence, ps.local_threshold) == (policy, "running", 3)


def test_an_unknown_policy_is_refused_by_name_and_the_engine_does_not_start(monkeypatch):
    with pytest.raises(SettingError, match=r"COORM_MALLEABLE_POLICY \(or COORM_PREEMPTIBLE\)='fpsmaa': one of "
                                           r"filling\|strict\|fpsma\|egs"):
        policy_settings(Settings(malleable_policy="fpsmaa"))
    with pytest.raises(SettingError, match=r"COORM_PRECEDENCE='both': one of running\|waiting"):
        policy_settings(Settings(precedence="both"))
    with pytest.raises(SystemExit) as stopped:  # before it reaches for a server
        asyncio.run(main(Settings(malleable_policy="koala", nats_url="nats://127.0.0.1:1")))
    assert stopped.value.code == 1

