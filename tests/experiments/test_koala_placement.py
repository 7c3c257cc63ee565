"""KOALA's jobs are placed by the policy core: each asks for its minimum (a rigid job: its nodes) once, with no
cluster and the worst-fit rule; the RMS picks the cluster at its first pass and the start names it; a
malleable job grows there and nowhere else. (Before the core placed requests, each job applied the rule to its
first views, and once asked twice: the simulator delivers the views of a pass run at the instant a job opens
before its opening.)"""

from __future__ import annotations

from collections import Counter

import pytest

from coorm.experiments import koala
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator.engine import Simulation


@pytest.mark.parametrize("precedence", ["running", "waiting"])
def test_the_rms_places_each_job_once_and_a_malleable_one_grows_where_it_was_placed(precedence):
    sim = Simulation(dict(koala.DAS3), PolicySettings(preemptible="egs", precedence=precedence,
                                                      local_threshold=koala.THRESHOLD))
    jobs, rigid = [], []
    for i in range(6):
        curve = (koala.GADGET2, koala.FT)[i % 2]
        job = koala.KoalaMalleable(f"m{i}", koala.PLACEMENT, curve)
        sim.add(30.0 * i, job)
        jobs.append(job)
        t = curve.time(koala.MIN_NODES)
        r = koala.PlacedRigid(f"r{i}", koala.PLACEMENT, koala.MIN_NODES, t * 1.1, t)
        sim.add(30.0 * i + 5, r)
        rigid.append(r)
    result = sim.run()
    minimums = [r for r in result.requests if r.type == "non-preemptible"]
    assert Counter(r.app for r in minimums) == {**{f"m{i}": 1 for i in range(6)}, **{f"r{i}": 1 for i in range(6)}}
    where = {r.app: r.cluster for r in minimums}
    assert all(j.started is not None and j.ended is not None for j in jobs)
    for j in jobs + rigid:
        assert j.cluster == where[j.app] in koala.DAS3  # the start named the RMS's choice
    grown = [r for r in result.requests if r.type == "preemptible"]
    assert grown  # (they did grow)
    assert all(r.cluster == where[r.app] for r in grown)
    # worst-fit: the first job, on an idle platform, goes to the largest cluster
    assert where["m0"] == max(koala.DAS3, key=koala.DAS3.__getitem__)


def test_a_job_leaves_its_cluster_to_the_rms():
    for job in (koala.KoalaMalleable("m", koala.PLACEMENT, koala.FT),
                koala.PlacedRigid("r", koala.PLACEMENT, koala.MIN_NODES, 100.0, 90.0)):
        (submit,) = job.on_open(0.0, {})
        (spec,) = submit.requests
        assert (spec.cluster, spec.placement, spec.nodes) == (None, koala.PLACEMENT, koala.MIN_NODES)
        assert job.on_views(_views()) == []  # nothing more to ask before it starts
    pinned = koala.KoalaMalleable("m", "delft", koala.FT)
    (submit,) = pinned.on_open(0.0, {})
    assert (submit.requests[0].cluster, submit.requests[0].placement) == ("delft", None)


def _views():
    from coorm.launchers.base import Views
    from coorm.shared.stepfn import StepFunction

    idle = {c: StepFunction.from_steps([(0.0, n)]) for c, n in koala.DAS3.items()}
    return Views(now=0.0, non_preemptive=idle, preemptive=idle)
