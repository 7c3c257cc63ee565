"""The simulator runs malleable launchers that leave their cluster to the RMS through the same policy core
as live (tests/live/test_placement.py): each lands where KOALA's worst-fit puts it, learns the cluster from
its start, and grows there only."""

from __future__ import annotations

from coorm.launchers.malleable import MalleableLauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator.engine import Simulation

QUIET = PolicySettings(fair_start=0.0, reschedule_interval=0.0)
DAS3 = {"vu": 85, "uva": 41, "delft": 68, "multimedian": 46, "leiden": 32}  # KOALA's Table I


def test_malleable_jobs_placed_by_worst_fit_spread_over_the_clusters_and_grow_where_they_started():
    """Rigid jobs keep 80 of vu's nodes and 40 of delft's: idle are vu 5, uva 41, delft 28, multimedian 46,
    leiden 32. Malleable jobs of 8 to 32 nodes arrive 100 s apart: the first goes to multimedian (46), the
    second to uva (41 against multimedian's 38 left), the third to multimedian (38 against 33), the fourth to
    uva (33 against leiden's 32). Worst-fit reads the non-preemptive views, where what a job holds
    preemptibly beyond its minimum is idle (it is given back to a waiting request): KOALA's experiments'
    launchers choose on the same views."""
    sim = Simulation(DAS3, QUIET, validate=True)
    sim.add(0.0, RigidLauncher("bg-vu", "vu", 80, 5000.0, runtime=4000.0))
    sim.add(0.0, RigidLauncher("bg-delft", "delft", 40, 5000.0, runtime=4000.0))
    jobs = [MalleableLauncher(f"m{i}", "", 8, 32, sizes="any", duration=4000.0, work=40_000.0,
                              placement="worst-fit") for i in range(4)]
    for i, m in enumerate(jobs):
        sim.add(10.0 + 100.0 * i, m)
    sim.run()
    assert not sim.rejections
    assert [m.cluster for m in jobs] == ["multimedian", "uva", "multimedian", "uva"]
    for m in jobs:
        assert m.finished and m.peak > 8  # it grew, on its cluster only
        assert {r.cluster for r in sim.requests.values() if r.app == m.app} == {m.cluster}
