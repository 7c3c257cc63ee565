"""KOALA's experiments (coorm/experiments/koala.py): the application model, a malleable job's life under
each precedence through the simulator, and the experiments' quick runs."""

from __future__ import annotations

import pytest

from coorm.experiments import koala, koala_pra, koala_pwa
from coorm.experiments.koala import FT, GADGET2, KoalaMalleable
from coorm.launchers.rigid import RigidLauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator.engine import Simulation


@pytest.mark.parametrize("curve", [GADGET2, FT])
def test_the_speed_up_curves_go_through_the_papers_points(curve):
    assert curve.time(2) == pytest.approx(curve.t2)
    assert curve.time(curve.best_at) == pytest.approx(curve.best)
    assert min(range(2, curve.max_nodes + 1), key=curve.time) == curve.best_at
    assert curve.time(curve.max_nodes) < curve.t2  # growing never slows a job below its minimum's pace


def _alone(curve, nodes: int, threshold: int = 0) -> KoalaMalleable:
    sim = Simulation({"c0": nodes}, PolicySettings(preemptible="egs", local_threshold=threshold, fair_start=0.0))
    job = KoalaMalleable("m", "c0", curve)
    sim.add(0.0, job)
    sim.run()
    return job


@pytest.mark.parametrize("curve, nodes, threshold, size", [
    (GADGET2, 68, 4, 46),  # up to its maximum
    (GADGET2, 30, 4, 26),  # up to what is left above the threshold
    (FT, 68, 4, 32),
    (FT, 30, 4, 16),  # to a power of two only
])
def test_a_malleable_job_alone_grows_as_far_as_it_may_and_ends_sooner(curve, nodes, threshold, size):
    job = _alone(curve, nodes, threshold)
    assert job.max_size == size and job.grows == 1 and job.shrinks == 0
    assert job.ended is not None and job.started is not None
    # it grew within the first passes: its run is about T(size), far from T(2)
    assert job.ended - job.started == pytest.approx(curve.time(size), abs=5.0)


@pytest.mark.parametrize("precedence, shrinks, rigid_waits", [("waiting", 1, False), ("running", 0, True)])
def test_a_rigid_job_shrinks_a_malleable_one_under_pwa_and_waits_for_it_under_pra(precedence, shrinks,
                                                                                    rigid_waits):
    sim = Simulation({"c0": 48}, PolicySettings(preemptible="fpsma", precedence=precedence, fair_start=0.0,
                                                preempt_grace=10.0))
    job = KoalaMalleable("m", "c0", GADGET2)
    sim.add(0.0, job)
    sim.add(60.0, RigidLauncher("r", "c0", 8, 120.0, 100.0))
    result = sim.run()
    assert job.max_size == 46 and job.shrinks == shrinks
    started = result.apps["r"].started
    assert started is not None
    if rigid_waits:
        assert started >= job.ended  # type: ignore[operator]
    else:
        assert started <= 60.0 + 10.0  # within the grace


@pytest.mark.parametrize("module", [koala_pra, koala_pwa])
def test_the_quick_experiment_runs_every_combination_to_its_end(module, tmp_path):
    rows = module.run(tmp_path, quick=True)
    assert {(r["placement"], r["workload"], r["policy"]) for r in rows} == {
        (pl, w, p) for pl in koala.PLACEMENTS for w in koala.WORKLOADS for p in koala.POLICIES}
    assert all(r["unfinished"] == 0 for r in rows)
    assert (tmp_path / f"{module.NAME}.csv").exists()
    text = module.markdown(rows)[module.NAME]
    assert "| Wm | FPSMA |" in text and "**Paper:**" in text
    if module is koala_pra:
        assert all(r["shrinks"] == 0 for r in rows)  # PRA never shrinks
    else:
        assert all(r["shrinks"] > 0 for r in rows)
    # alone, Delft's cluster takes them all. Under PRA worst-fit spreads the malleable jobs over DAS3's clusters
    # (a grown job's nodes are not idle). Under PWA it counts the nodes jobs hold beyond their minimum as free
    # -- KOALA places "taking into account the minimum sizes of the running jobs" -- so the largest cluster
    # takes nearly all (94-99 % in the stored runs, 100 % in some quick ones): no spread is asserted there
    for r in rows:
        if r["placement"] == "single":
            assert r["busiest_cluster_pct"] == 100, r
        elif module is koala_pra:
            assert r["busiest_cluster_pct"] < 100, r


def test_worst_fit_places_each_job_on_the_cluster_with_the_most_idle_nodes():
    """Two malleable jobs one after the other on DAS3: the first goes to the VU's 85 nodes, where it grows
    (EGS, PRA) to its maximum of 46 -- leaving 39 idle there --, so the second goes to Delft's 68."""
    sim = Simulation(dict(koala.DAS3), PolicySettings(preemptible="egs", precedence="running", fair_start=0.0))
    first = KoalaMalleable("m1", koala.PLACEMENT, GADGET2)
    second = KoalaMalleable("m2", koala.PLACEMENT, GADGET2)
    sim.add(0.0, first)
    sim.add(30.0, second)
    sim.run()
    assert (first.cluster, first.max_size) == ("vu", 46)
    assert second.cluster == "delft"


def test_a_trend_within_two_percent_is_no_difference():
    assert koala._cmp(10.1, 10.0) == "no difference"
    assert koala._cmp(11.0, 10.0) == "holds" and koala._cmp(9.0, 10.0) == "opposite"


def test_a_job_that_gives_back_what_a_shrink_asked_is_not_ended_when_the_cluster_is_shared_again():
    """EGS, passes every 30 s, a grace of 10 s, 90 % load: m157 was told to go from 4 to 3 nodes and gave
    back 1 at once, but EGS, its want having fallen, shared the cluster again as 2 for it; judged against
    that re-shared view, it kept the old deadline and the next pass ended it (the run stopped with a refused
    command). A pending shrink is now met against what it asked: no job is ended, every job finishes."""
    r = koala.simulate("egs", "waiting", "Wm", jobs=300, interarrival=30, seed=0, background=0.9, poll=30, grace=10)
    assert (r["violators"], r["finished"]) == (0, r["malleable"]) == (0, 300)
