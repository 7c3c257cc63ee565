"""KOALA's jobs placed by worst-fit on their first views ask for their minimum (a rigid job: its nodes) once,
whatever comes first, their views or their opening: the simulator delivers the views of a pass run at the
instant a job opens before its opening, and each job asked twice then -- a second request of its minimum
running to its walltime beside the one it used."""

from __future__ import annotations

from collections import Counter

import pytest

from coorm.experiments import koala
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator.engine import Simulation


@pytest.mark.parametrize("precedence", ["running", "waiting"])
def test_a_job_placed_on_its_views_asks_for_its_minimum_once(precedence):
    sim = Simulation(dict(koala.DAS3), PolicySettings(preemptible="egs", precedence=precedence,
                                                      local_threshold=koala.THRESHOLD))
    jobs = []
    for i in range(6):
        curve = (koala.GADGET2, koala.FT)[i % 2]
        job = koala.KoalaMalleable(f"m{i}", koala.PLACEMENT, curve)
        sim.add(30.0 * i, job)
        jobs.append(job)
        t = curve.time(koala.MIN_NODES)
        sim.add(30.0 * i + 5, koala.PlacedRigid(f"r{i}", koala.PLACEMENT, koala.MIN_NODES, t * 1.1, t))
    result = sim.run()
    asked = Counter(r.app for r in result.requests if r.type == "non-preemptible")
    assert asked == {**{f"m{i}": 1 for i in range(6)}, **{f"r{i}": 1 for i in range(6)}}
    assert all(j.started is not None and j.ended is not None for j in jobs)
