"""The moldable launcher: OAR's earliest-completion choice made from the view, re-selected on new views."""

from __future__ import annotations

import random

import pytest

from coorm.launchers.base import Close, ClusterProps, Done, Submit, Timer, Views
from coorm.launchers.moldable import (
    MIN_NODES,
    MoldableLauncher,
    amdahl_configs,
    amdahl_seq_time,
    amdahl_time,
    oar_configs,
)
from coorm.shared.stepfn import StepFunction
from tests.core.driver import rq
from tests.launchers.harness import Harness


def views(now: float, **clusters: list[tuple[float, int]]) -> Views:
    np = {c: StepFunction.from_steps(steps) for c, steps in clusters.items()}
    return Views(now=now, non_preemptive=np, preemptive={c: StepFunction.constant(0, now) for c in np})


CONFIGS = [(2, 1000.0), (4, 600.0), (8, 400.0)]


def submitted(cmds) -> list:
    return [r for c in cmds if isinstance(c, Submit) for r in c.requests]


# -- the application model ------------------------------------------------------------------------------
def test_amdahl_configs_follow_amdahls_law():
    cfg = amdahl_configs(8, 1000.0, 0.1, speed=2.0, choices=[1, 2, 8, 16, 0])
    assert [n for n, _ in cfg] == [1, 2, 8]  # out-of-range counts dropped
    assert cfg[0][1] == pytest.approx(500.0)
    assert cfg[1][1] == pytest.approx(500.0 * (0.1 + 0.9 / 2))
    assert cfg[2][1] == pytest.approx(500.0 * (0.1 + 0.9 / 8))
    durations = [d for _, d in amdahl_configs(128, 1e5, 0.05)]
    assert durations == sorted(durations, reverse=True)  # more hosts, never slower
    assert [n for n, _ in amdahl_configs(128, 1e5, 0.05)] == list(range(MIN_NODES, 129))
    assert amdahl_configs(1, 10.0, 0.05) == [(1, 10.0)]


def test_amdahl_seq_time_inverts_the_model():
    seq = amdahl_seq_time(64, 3600.0, 0.05)
    assert amdahl_time(64, seq, 0.05) == pytest.approx(3600.0)


def test_oar_enumeration_has_nc_times_nh_minus_one_configurations():
    clusters = {f"c{i}": 128 for i in range(4)}
    speeds = {f"c{i}": 1 + 0.1 * i for i in range(4)}
    cfg = oar_configs(clusters, 1e5, speeds=speeds)
    assert len(cfg) == 4 * (128 - 1)
    assert {c for c, _, _ in cfg} == set(clusters)
    fast = dict(((c, n), d) for c, n, d in cfg)
    assert fast[("c3", 64)] == pytest.approx(fast[("c0", 64)] / 1.3)


# -- selection -------------------------------------------------------------------------------------------
def test_picks_the_earliest_completion_not_the_earliest_start():
    m = MoldableLauncher("m", "c0", CONFIGS)
    # 2 nodes free now, 8 from t=100: 2 nodes end at 1000, 4 at 700, 8 at 500
    out = m.on_views(views(0.0, c0=[(0, 2), (100, 8)]))
    (r,) = submitted(out)
    assert (r.cluster, r.nodes, r.duration) == ("c0", 8, 400.0)
    assert r.id == "m.1" and m.choice.start == 100.0 and m.choice.end == 500.0
    # with 8 free only from t=900, the 2-node configuration now (ends 1000) wins over 8 nodes (1300)
    m2 = MoldableLauncher("m2", "c0", CONFIGS)
    (r2,) = submitted(m2.on_views(views(0.0, c0=[(0, 2), (900, 8)])))
    assert (r2.nodes, r2.duration) == (2, 1000.0)


def test_the_choice_is_the_exhaustive_earliest_completion_on_random_views():
    rng = random.Random(11)
    for _ in range(200):
        clusters = {}
        for c in ("a", "b"):
            t, steps = 0.0, [(0.0, rng.randint(0, 16))]
            for _ in range(rng.randint(0, 6)):
                t += rng.choice([50.0, 200.0, 1000.0])
                steps.append((t, rng.randint(0, 16)))
            clusters[c] = StepFunction.from_steps(steps)
        cfg = oar_configs({"a": 16, "b": 16}, rng.uniform(1000, 20_000), rng.choice([0.01, 0.2]),
                          speeds={"a": 1.0, "b": 1.5})
        m = MoldableLauncher("m", None, cfg)
        choice = m.select(clusters, 0.0)
        best = min((clusters[c].earliest_fit(n, d, 0.0) + d, n, c) for c, n, d in cfg)
        assert (choice.end, choice.config[1], choice.config[0]) == best


def test_ties_go_to_fewer_nodes():
    m = MoldableLauncher("m", "c0", [(4, 500.0), (2, 600.0), (8, 300.0)])
    # 4 nodes end at 600 starting at 100; 2 nodes end at 600 starting now; 8 never fit
    (r,) = submitted(m.on_views(views(0.0, c0=[(0, 2), (100, 4)])))
    assert r.nodes == 2


def test_reselects_on_a_new_view_replacing_the_old_request_in_one_step():
    m = MoldableLauncher("m", "c0", CONFIGS)
    m.on_views(views(0.0, c0=[(0, 2), (900, 8)]))  # 2 nodes
    out = m.on_views(views(50.0, c0=[(50, 8)]))  # the others finished early
    assert out == [Submit((out[0].requests[0],), ("m.1",))]  # one atomic replace: no done
    assert out[0].requests[0].nodes == 8 and out[0].requests[0].id == "m.2"
    assert m.waiting == {"m.2"} and m.resubmissions == 1


def test_a_new_start_for_the_same_configuration_is_no_reason_to_resubmit():
    m = MoldableLauncher("m", "c0", CONFIGS)
    m.on_views(views(0.0, c0=[(0, 2), (100, 8)]))
    assert m.on_views(views(0.0, c0=[(0, 2), (150, 8)])) == []  # still 8 nodes, later
    assert m.choice.start == 150.0 and m.waiting == {"m.1"}


def test_memoisation_counts_distinct_views_only():
    m = MoldableLauncher("m", "c0", CONFIGS)
    runs = []
    select = m.select
    m.select = lambda *a: runs.append(a) or select(*a)  # the selection itself runs once per input
    a = views(0.0, c0=[(0, 2), (900, 8)])
    b = views(0.0, c0=[(0, 8)])
    m.on_views(a)
    m.on_views(a)
    assert m.computed_configurations == 1
    (replace,) = m.on_views(b)
    assert m.computed_configurations == 2
    m.on_replace_answered(0.0, replace, None)
    out = m.on_views(a)  # seen before: answered from the memo, not recomputed -- but still acted on
    assert m.computed_configurations == 2
    assert submitted(out)[0].nodes == 2
    m.on_replace_answered(0.0, out[0], None)
    # clusters it has no configuration on are not part of its input
    m.on_views(views(0.0, c0=[(0, 2), (900, 8)], c9=[(0, 5)]))
    assert m.computed_configurations == 2 and len(runs) == 2


def test_chooses_across_clusters_with_an_oar_enumeration():
    cfg = oar_configs({"a": 8, "b": 8}, 4000.0, 0.05, speeds={"a": 1.0, "b": 2.0})
    m = MoldableLauncher("m", None, cfg)
    (r,) = submitted(m.on_views(views(0.0, a=[(0, 8)], b=[(0, 4), (10_000, 8)])))
    # the fast cluster's 4 free hosts beat the slow cluster's 8: 2000*(0.05+0.95/4) < 4000*(0.05+0.95/8)
    assert (r.cluster, r.nodes) == ("b", 4)


def test_a_configuration_larger_than_the_platform_is_never_chosen_over_one_that_fits():
    m = MoldableLauncher("m", "c0", [(2, 5000.0), (64, 10.0)])
    (r,) = submitted(m.on_views(views(0.0, c0=[(0, 8)])))
    assert r.nodes == 2


def test_adaptation_delay_defers_the_selection_to_the_latest_view():
    m = MoldableLauncher("m", "c0", CONFIGS, adaptation_delay=3.0)
    assert m.on_views(views(0.0, c0=[(0, 2), (900, 8)])) == [Timer(3.0, "select")]
    assert m.on_views(views(1.0, c0=[(1, 8)])) == [Timer(4.0, "select")]
    assert m.computed_configurations == 0 and not m.waiting
    (r,) = submitted(m.on_timer(3.0, "select"))
    assert r.nodes == 8  # the latest view
    assert m.on_timer(4.0, "select") == []  # same view again, same choice: nothing to do


def test_started_run_ends_with_done_and_close_after_its_actual_runtime():
    m = MoldableLauncher("m", "c0", CONFIGS, runtime_fraction=0.5)
    m.on_views(views(0.0, c0=[(0, 8)]))
    assert m.on_start(10.0, "m.1", ("n0",) * 8) == [Timer(210.0, "end")]
    assert m.on_views(views(20.0, c0=[(20, 0)])) == []  # started: views no longer matter
    assert m.on_timer(210.0, "end") == [Done("m.1"), Close()]
    assert m.finished and m.stats()["end"] == 210.0 and m.stats()["start"] == 10.0


def _replacing() -> tuple[MoldableLauncher, Submit]:
    """m waits with m.1 (2 nodes) and replaces it by m.2 (8 nodes): the replace is not answered yet."""
    m = MoldableLauncher("m", "c0", CONFIGS)
    m.on_views(views(0.0, c0=[(0, 2), (900, 8)]))
    (replace,) = m.on_views(views(50.0, c0=[(50, 8)]))
    assert replace == Submit(replace.requests, ("m.1",)) and m.current == "m.2"
    return m, replace


def test_a_replace_refused_as_started_keeps_the_old_request():
    m, replace = _replacing()
    assert m.on_replace_answered(50.0, replace, "started") == []
    assert (m.current, m.choice.config, m.replace_refused) == ("m.1", ("c0", 2, 1000.0), 1)
    assert m.waiting == {"m.1"}
    assert m.on_start(50.2, "m.1", ("x", "y")) == [Timer(1050.2, "end")]
    assert m.on_timer(1050.2, "end") == [Done("m.1"), Close()]


def test_the_start_of_the_replaced_request_heard_before_the_answer_keeps_it():
    """The RMS started m.1 before the replace reached it: the replace will be refused; the launcher knows it
    from the start and keeps m.1 at once; the refusal, when it comes, changes nothing more."""
    m, replace = _replacing()
    assert m.on_start(50.1, "m.1", ("x", "y")) == [Timer(1050.1, "end")]
    assert (m.current, m.started_at, m.replace_refused) == ("m.1", 50.1, 1)
    assert m.on_replace_answered(50.2, replace, "started") == [] and m.replace_refused == 1
    assert m.on_views(views(60.0, c0=[(60, 6)])) == []  # started: it chooses no more


def test_after_an_accepted_replace_only_the_new_request_runs():
    m, replace = _replacing()
    assert m.on_replace_answered(50.0, replace, None) == []
    assert m.on_start(50.0, "m.1", ("x", "y")) == []  # (cannot happen: the RMS cancelled it with the replace)
    assert m.started_at is None and m.on_start(51.0, "m.2", tuple("abcdefgh")) == [Timer(451.0, "end")]


def test_a_new_choice_waits_for_the_answer_of_the_replace_then_is_made_on_the_latest_view():
    m, replace = _replacing()
    assert m.on_views(views(60.0, c0=[(60, 4)])) == []  # 4 nodes now: chosen once the replace is answered
    (again,) = m.on_replace_answered(61.0, replace, None)
    assert again == Submit(again.requests, ("m.2",)) and again.requests[0].nodes == 4


def test_a_replace_refused_because_the_old_request_ended_chooses_afresh():
    m, replace = _replacing()
    out = m.on_replace_answered(50.0, replace, "ended")
    assert submitted(out)[0].nodes == 8 and out[0].replaces == () and m.current == out[0].requests[0].id


def test_walltime_end_closes():
    m = MoldableLauncher("m", "c0", CONFIGS)
    m.on_views(views(0.0, c0=[(0, 8)]))
    m.on_start(0.0, "m.1", tuple("abcdefgh"))
    assert m.on_end(400.0, "m.1", "walltime") == [Close()]
    assert m.on_timer(400.0, "end") == []


# -- against the real cores ------------------------------------------------------------------------------
def test_moldable_against_the_cores_with_a_competing_rigid_job():
    h = Harness(ClusterProps(nodes={"c0": 64}), reschedule_interval=1.0, fair_start=5.0)
    h.open(0.0, "rigid")
    h.submit(0.0, "rigid", rq("big", "c0", 48, 4000), rq("small", "c0", 16, 500))
    h.run_until(1.0)
    t0 = h.cores.policy.requests["big"].start  # the rigid jobs start together
    configs = amdahl_configs(64, 64_000.0, 0.05, choices=[8, 16, 32, 64])
    assert configs == [(8, 10800.0), (16, 7000.0), (32, 5100.0), (64, 4150.0)]
    m = MoldableLauncher("mold", "c0", configs, runtime_fraction=0.9)
    h.open(2.0, "mold", m)
    h.run_until(50.0)
    # 16 hosts once the small job ends (t0 + 500) end before 64 or 32 hosts once the big one ends
    assert m.choice.config == ("c0", 16, 7000.0) and m.choice.start == t0 + 500
    assert h.cores.policy.requests["mold.1"].start == t0 + 500
    # the big rigid job ends early: 48 hosts back at 105 (fair-start), 64 at 500: 64 hosts now end first
    h.done(100.0, "rigid", "big")
    h.run_until(200.0)
    assert m.choice.config == ("c0", 64, 4150.0) and m.resubmissions == 1
    assert h.of("end", request="mold.1")[0].reason == "cancelled"
    h.run(limit=50_000)
    assert m.finished and not h.rejected
    assert len(h.of("assigned", request="mold.2")[0].nodes) == 64
    assert m.started_at == t0 + 500 and m.ended_at == pytest.approx(t0 + 500 + 4150.0 * 0.9)
    assert h.of("end", request="mold.2")[0].reason == "done"
    assert h.of("session_ended", app="mold")
    # one selection per distinct view received while waiting
    waiting_views = {tuple((c, f.times, f.values) for c, f in sorted(v.non_preemptive.items()))
                     for v in h.views_sent["mold"] if v.now < m.started_at}
    assert m.computed_configurations == len(waiting_views) >= 2
