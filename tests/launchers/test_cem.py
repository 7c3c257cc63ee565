"""The CEM launcher: a complex-moldable, multi-cluster selection from the views, without enumeration."""

from __future__ import annotations

import itertools
import random

import pytest

from coorm.launchers.base import Close, ClusterProps, Done, Submit, Timer, Views
from coorm.launchers.cem import CEMLauncher, CEMModel, Selector, paper_platform
from coorm.shared.requests import Relation
from coorm.shared.stepfn import StepFunction
from tests.core.driver import rq
from tests.launchers.harness import Harness

P3 = paper_platform(3)  # c0 (1.0x), c1 (1.1x), c2 (1.2x); c0-c1 2.5 ms, c2 5 ms from both
MODEL = CEMModel()


def views(now: float, **clusters: list[tuple[float, int]]) -> Views:
    np = {c: StepFunction.from_steps(steps) for c, steps in clusters.items()}
    return Views(now=now, non_preemptive=np, preemptive={c: StepFunction.constant(0, now) for c in np})


def launcher(props: ClusterProps = P3, **kw) -> CEMLauncher:
    cem = CEMLauncher("cem", **kw)
    assert cem.on_open(0.0, props) == []
    return cem


def requests(cmds) -> list:
    return [r for c in cmds if isinstance(c, Submit) for r in c.requests]


# -- the model --------------------------------------------------------------------------------------------
def test_a_second_cluster_pays_off_only_with_enough_hosts():
    p = paper_platform(2)
    alone = MODEL.runtime({"c0": 128}, p)
    assert MODEL.runtime({"c0": 128, "c1": 128}, p) < 0.8 * alone
    assert MODEL.runtime({"c0": 128, "c1": 16}, p) > alone
    # more hosts on one cluster always help up to its size (the optimum, ~447, is beyond it)
    assert MODEL.runtime({"c0": 128}, p) < MODEL.runtime({"c0": 64}, p)


def test_farther_clusters_cost_more():
    props = ClusterProps(nodes={"a": 64, "b": 64, "c": 64}, latency_ms={("a", "b"): 2.5, ("a", "c"): 20.0})
    near = MODEL.iteration_time({"a": 64, "b": 64}, props)
    far = MODEL.iteration_time({"a": 64, "c": 64}, props)
    assert far - near == pytest.approx(MODEL.wan_messages * 17.5 / 1000)


# -- the selection ----------------------------------------------------------------------------------------
def test_uses_several_clusters_when_they_are_free_and_fast():
    cem = launcher()
    out = cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 128)], c2=[(0, 128)]))
    reqs = requests(out)
    assert len(reqs) == 2 and {r.cluster for r in reqs} == {"c1", "c2"}
    assert all(r.nodes == 128 for r in reqs)
    first, second = reqs
    assert first.related_how is Relation.FREE and first.related_to is None
    assert second.related_how is Relation.COALLOC and second.related_to == first.id
    assert first.duration == second.duration == MODEL.runtime({"c1": 128, "c2": 128}, P3)
    assert cem.waiting == {first.id, second.id}


def test_a_single_cluster_when_the_others_are_busy():
    cem = launcher()
    # c1 and c2 offer only a handful of hosts for a long time: not worth the WAN
    out = cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 10), (50_000, 128)], c2=[(0, 20), (50_000, 128)]))
    (r,) = requests(out)
    assert (r.cluster, r.nodes, r.related_how) == ("c0", 128, Relation.FREE)
    assert cem.selection.start == 0.0


def test_waits_for_a_later_start_when_it_ends_earlier():
    cem = launcher()
    cem.on_views(views(0.0, c0=[(0, 16), (100, 128)], c1=[(0, 16), (100, 128)], c2=[(0, 0)]))
    assert cem.selection.start == 100.0 and cem.selection.config == (("c0", 128), ("c1", 128))


def test_never_asks_more_hosts_than_the_view_offers_over_the_run():
    cem = launcher()
    # c2 (fastest) is free now but half of it goes away at t=300, during any run
    v = views(0.0, c0=[(0, 0)], c1=[(0, 0)], c2=[(0, 128), (300, 64), (100_000, 128)])
    (r,) = requests(cem.on_views(v))
    assert r.cluster == "c2" and r.nodes <= 64
    assert v.non_preemptive["c2"].earliest_fit(r.nodes, r.duration, 0.0) == cem.selection.start == 0.0


def test_never_asks_more_hosts_than_the_view_offers_on_random_views():
    rng = random.Random(7)
    props = paper_platform(4, hosts=32)
    model = CEMModel(iterations=1000)
    for _ in range(100):
        clusters = {}
        for c in props.nodes:
            t, steps = 0.0, [(0.0, rng.randint(0, 32))]
            for _ in range(rng.randint(0, 8)):
                t += rng.choice([10.0, 100.0, 500.0, 2000.0])
                steps.append((t, rng.randint(0, 32)))
            clusters[c] = steps
        v = views(0.0, **clusters)
        cem = CEMLauncher("cem", model=model)
        cem.on_open(0.0, props)
        reqs = requests(cem.on_views(v))
        if not reqs:
            assert all(f.max_value() == 0 for f in v.non_preemptive.values())
            continue
        start = cem.selection.start
        assert len({r.cluster for r in reqs}) == len(reqs)
        assert all(r.duration == reqs[0].duration for r in reqs)
        for r in reqs:
            view = v.non_preemptive[r.cluster]
            assert 1 <= r.nodes <= view.value_at(start)
            assert view.min_over(start, start + r.duration) >= r.nodes


def test_matches_the_exhaustive_optimum_on_small_platforms():
    rng = random.Random(3)
    for _ in range(60):
        props = paper_platform(rng.choice([2, 3]), hosts=8)
        model = CEMModel(work=rng.choice([0.5, 1.0, 4.0]), per_host=rng.choice([1e-3, 5e-3]),
                         per_cluster=rng.choice([0.005, 0.05]))
        caps = {c: rng.randint(0, 8) for c in props.nodes}
        if not any(caps.values()):
            continue
        sel = Selector(model, props).select({c: StepFunction.constant(n, 0.0) for c, n in caps.items()}, 0.0)
        best = min(
            model.runtime({c: n for c, n in zip(props.nodes, hs, strict=True) if n}, props)
            for hs in itertools.product(*(range(caps[c] + 1) for c in props.nodes))
            if any(hs)
        )
        assert sel.duration == best


def test_the_selection_does_not_enumerate_configurations():
    props = paper_platform(8)
    s = Selector(MODEL, props)
    sel = s.select({c: StepFunction.constant(128, 0.0) for c in props.nodes}, 0.0)
    assert sel.config == (("c6", 128), ("c7", 128))  # the two fastest, siblings
    assert s.evaluations < 2_000  # against 129^8 - 1 configurations


def test_reselects_on_a_new_view_replacing_the_old_group_in_one_step():
    cem = launcher()
    first = requests(cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 10), (50_000, 128)], c2=[(0, 0)])))
    out = cem.on_views(views(10.0, c0=[(10, 128)], c1=[(10, 128)], c2=[(10, 0)]))
    # one atomic replace (the new group, and the old one named in it), no done a pass could come before
    assert len(out) == 1 and isinstance(out[0], Submit)
    assert set(out[0].replaces) == {r.id for r in first}
    assert {r.cluster for r in out[0].requests} == {"c0", "c1"}
    assert cem.waiting == {r.id for r in out[0].requests} and cem.resubmissions == 1
    assert cem.on_replace_answered(10.0, out[0], None) == []
    # a view that only moves the start of the same configuration changes nothing
    assert cem.on_views(views(20.0, c0=[(20, 0), (30, 128)], c1=[(20, 0), (30, 128)], c2=[(20, 0)])) == []
    assert cem.selection.start == 30.0


def test_a_group_replace_refused_as_started_keeps_the_old_group():
    """One member of the old group started before the replace reached the RMS: refused, the launcher keeps
    the whole old group (its members start together) -- told by the refusal or by the start, whichever first."""
    for start_first in (False, True):
        cem = launcher()
        first = requests(cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 128)], c2=[(0, 0)])))
        (replace,) = cem.on_views(views(10.0, c0=[(10, 128)], c1=[(10, 10), (50_000, 128)], c2=[(10, 0)]))
        old = tuple(r.id for r in first)
        assert len(old) == 2 and replace.replaces == old and [r.cluster for r in replace.requests] == ["c0"]
        if start_first:
            assert cem.on_start(10.1, old[0], ("n",)) == []  # kept at once: the other member starts with it
            assert cem.group == old and cem.replace_refused == 1
        assert cem.on_replace_answered(10.2, replace, "started") == []
        assert cem.group == old and cem.replace_refused == 1
        for r in old[1 if start_first else 0:]:
            out = cem.on_start(10.3, r, ("n",))
        assert cem.started_at == 10.3 and out == [Timer(10.3 + cem.runtime, "end")]


def test_memoisation_counts_distinct_views_only(monkeypatch):
    runs = []
    select = Selector.select
    monkeypatch.setattr(Selector, "select", lambda self, *a: runs.append(a) or select(self, *a))
    cem = launcher()
    a = views(0.0, c0=[(0, 128)], c1=[(0, 10), (50_000, 128)], c2=[(0, 0)])
    b = views(0.0, c0=[(0, 128)], c1=[(0, 128)], c2=[(0, 0)])
    cem.on_views(a)
    cem.on_views(a)
    assert cem.computed_configurations == 1
    (replace,) = cem.on_views(b)
    assert cem.computed_configurations == 2
    cem.on_replace_answered(0.0, replace, None)
    out = cem.on_views(a)  # answered from the memo, and acted upon
    assert cem.computed_configurations == 2 and [r.cluster for r in requests(out)] == ["c0"]
    assert len(runs) == 2


def test_responds_after_the_adaptation_delay():
    cem = launcher(adaptation_delay=4.0)
    assert cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 0)], c2=[(0, 0)])) == [Timer(4.0, "select")]
    assert cem.on_views(views(2.0, c0=[(2, 128)], c1=[(2, 128)], c2=[(2, 0)])) == [Timer(6.0, "select")]
    assert cem.computed_configurations == 0 and not cem.waiting
    out = cem.on_timer(4.0, "select")  # the latest view, seen from t=4
    assert {r.cluster for r in requests(out)} == {"c0", "c1"}
    assert cem.selection.start == 4.0 and cem.computed_configurations == 1
    assert cem.on_timer(6.0, "select") == []  # the same view again: same choice


def test_starts_when_every_request_has_started_then_done_all_and_close():
    cem = launcher(runtime_fraction=0.5)
    a, b = requests(cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 128)], c2=[(0, 0)])))
    assert cem.on_start(5.0, a.id, ("x",) * a.nodes) == []
    assert cem.on_views(views(5.0, c0=[(5, 0)], c1=[(5, 0)], c2=[(5, 128)])) == []  # committed
    (timer,) = cem.on_start(5.0, b.id, ("y",) * b.nodes)
    assert timer == Timer(5.0 + a.duration * 0.5, "end")
    out = cem.on_timer(timer.at, "end")
    assert out == [Done(a.id), Done(b.id), Close()]
    assert cem.finished
    st = cem.stats()
    assert st["clusters"] == {"c1": 128, "c0": 128} and st["hosts"] == 256
    assert st["start"] == 5.0 and st["end"] == timer.at and st["computed_configurations"] == 1


def test_walltime_on_every_request_closes_once():
    cem = launcher()
    a, b = requests(cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 128)], c2=[(0, 0)])))
    cem.on_start(0.0, a.id, ())
    cem.on_start(0.0, b.id, ())
    assert cem.on_end(a.duration, a.id, "walltime") == []
    assert cem.on_end(a.duration, b.id, "walltime") == [Close()]
    assert cem.on_timer(a.duration, "end") == []


def test_a_lost_node_ends_the_coupled_run():
    cem = launcher()
    a, b = requests(cem.on_views(views(0.0, c0=[(0, 128)], c1=[(0, 128)], c2=[(0, 0)])))
    cem.on_start(0.0, a.id, ())
    cem.on_start(0.0, b.id, ())
    assert cem.on_end(50.0, a.id, "node_failure") == [Done(b.id), Close()]


def test_no_host_anywhere_means_no_request():
    cem = launcher()
    assert cem.on_views(views(0.0, c0=[(0, 0)], c1=[(0, 0)], c2=[(0, 0)])) == []
    assert cem.computed_configurations == 1


# -- against the real cores ------------------------------------------------------------------------------
@pytest.mark.parametrize(("delay", "fraction", "reason"), [(0.0, 1.0, "walltime"), (3.0, 0.9, "done")])
def test_cem_against_the_cores_with_a_competing_rigid_job(delay, fraction, reason):
    h = Harness(P3, reschedule_interval=1.0, fair_start=5.0)
    h.open(0.0, "rigid")
    h.submit(0.0, "rigid", rq("r1", "c1", 120, 300), rq("r2", "c2", 100, 300))
    h.run_until(1.0)
    t0 = h.cores.policy.requests["r1"].start
    cem = CEMLauncher("cem", adaptation_delay=delay, runtime_fraction=fraction)
    h.open(2.0, "cem", cem)
    h.run_until(10.0)
    # c0 alone now would end at ~1700; c1 + c2 after the rigid job end earlier
    assert cem.selection.config == (("c1", 128), ("c2", 128))
    assert cem.selection.start == t0 + 300
    # what it asked for fit the view it chose from
    sent = h.submitted["cem"]
    assert sent[1].related_how is Relation.COALLOC and sent[1].related_to == sent[0].id
    h.run(limit=100_000)
    assert cem.finished and not h.rejected
    starts = {h.of("start", request=r.id)[0].at for r in sent}
    assert starts == {t0 + 300} and cem.started_at == t0 + 300
    assert cem.ended_at == pytest.approx(t0 + 300 + MODEL.runtime({"c1": 128, "c2": 128}, P3) * fraction)
    assert [h.of("end", request=r.id)[0].reason for r in sent] == [reason, reason]
    assert {len(h.of("assigned", request=r.id)[0].nodes) for r in sent} == {128}
    assert h.of("session_ended", app="cem")
    assert cem.computed_configurations >= 1 and cem.resubmissions == 0


def test_cem_against_the_cores_reselects_when_the_rigid_job_ends_early():
    h = Harness(P3, reschedule_interval=1.0, fair_start=5.0)
    h.open(0.0, "rigid")
    h.submit(0.0, "rigid", rq("r1", "c1", 120, 20_000), rq("r2", "c2", 100, 20_000))
    h.run_until(1.0)
    cem = CEMLauncher("cem")
    h.open(2.0, "cem", cem)
    h.run_until(3.0)
    # the other clusters are taken for long: c0 alone, at once
    assert cem.selection.config == (("c0", 128),)
    assert cem.started_at is not None
    h.run(limit=100_000)
    assert cem.finished and not h.rejected

    # a second instance, everything taken: it waits for c0 + c1 (c2 is taken longer), then moves to c2
    # alone when the job on c2 ends early
    h = Harness(P3, reschedule_interval=1.0, fair_start=5.0)
    h.open(0.0, "rigid")
    h.submit(0.0, "rigid", rq("r0", "c0", 128, 20_000), rq("r1", "c1", 128, 20_000),
             rq("r2", "c2", 128, 30_000))
    h.run_until(1.0)
    t0 = h.cores.policy.requests["r0"].start
    cem = CEMLauncher("cem", runtime_fraction=0.9)
    h.open(2.0, "cem", cem)
    h.run_until(50.0)
    assert cem.started_at is None and len(cem.waiting) == 2
    assert cem.selection.config == (("c0", 128), ("c1", 128)) and cem.selection.start == t0 + 20_000
    first = set(cem.group)
    h.done(100.0, "rigid", "r2")
    h.run(limit=100_000)
    assert cem.finished and not h.rejected
    assert cem.selection.config == (("c2", 128),) and cem.resubmissions == 1
    assert cem.started_at == 105.0  # after the fair-start hold of the freed nodes
    assert all(h.of("end", request=r)[0].reason == "cancelled" for r in first)
    assert cem.ended_at == pytest.approx(105.0 + MODEL.runtime({"c2": 128}, P3) * 0.9)
