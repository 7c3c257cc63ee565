"""Issue 17's livelock, live: a CEM launcher is not made to cancel a request that has started by a view that
shows it running before its start is heard.

Over ``coorm up`` (every service, an agent per cluster starting real processes) and the shipped launcher
objects through :class:`~coorm.launchers.live.LiveRunner`: a PSA takes cluster c0 preemptibly, then a CEM
arrives and asks 8 + 8 nodes on the two free 8-node clusters. Its member on c1 starts at once, the one on c0
once the PSA gives its nodes back; the views of that pass reach the launcher before its start does, and show
c1 taken. Before the fix the CEM chose again on them -- c0 alone -- and cancelled both members, which had
started: its sessions started three requests for one run (twice out of twice). Now it waits for the start."""

from __future__ import annotations

from coorm.experiments import twin_live
from coorm.experiments.twin_workload import ENV, TwinApp

CLUSTERS = {"c0": 8, "c1": 8}


def test_a_cem_runs_the_group_it_asked_for_without_cancelling_a_started_request():
    specs = [TwinApp("psa-c0", "psa", 0.0, "c0", {"task_duration": 3.0}),
             TwinApp("cem", "cem", 1.0, "c0", {"iterations": 10, "work": 8.0})]
    live = twin_live.run(specs, CLUSTERS, ENV, limit=60.0)
    cem = live.apps["cem"]
    assert cem.error is None and cem.ended is not None and cem.refused == []
    mine = [r for r in live.requests if r["name"] == "cem"]
    started = [r for r in mine if r["start"] is not None]
    # one group, both members started and ran it: none was cancelled, none started in vain
    assert cem.resubmissions == 0, mine
    assert sorted(r["nodes"] for r in started) == [8, 8] and len(mine) == 2, mine
