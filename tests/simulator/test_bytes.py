"""The simulator's message count and sizes (CORBA CDR, as CooRM §IV-B measured them): what a launcher sends
and is told, and the cluster information it pulls when it starts (CooRM Fig. 4, steps 3 and 4), worked out
by hand."""

from __future__ import annotations

from coorm.launchers.rigid import RigidLauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator import cdr
from coorm.simulator.engine import Simulation

QUIET = PolicySettings(fair_start=0.0, reschedule_interval=1.0, pass_burst=16)


def test_cluster_info_replies_are_sized_by_the_cdr_rules():
    # a query: the request header only. CINFO: sequence length 4, then per cluster "c0" (4 + 3, padded to 8),
    # three longs (12), aligned on 8 for the speed (a double): 24 + 8 = 32 -> 36 + 4 + 32 = 72, padded: 76.
    # ICINFO with one cluster: no pair, 36 + 4 padded to 8 = 44; with two, one pair: 36 + 4 + (8 + 8) + 16 -> 76
    assert cdr.cluster_queries(["c0"]) == [36, 76, 36, 44]
    assert cdr.cluster_queries(["c0", "c1"]) == [36, 108, 36, 76]
    # ICINFO: one entry per pair of clusters (3 for 3 clusters), as the live view publisher answers
    three = cdr.inter_cluster_info(["c0", "c1", "c2"]) - cdr.HEADER
    assert three == cdr._align(4 + 3 * 32, 8)


def test_a_launcher_pulls_the_cluster_information_before_its_first_request():
    """One rigid job: its subscribe, the two queries and their replies, its request, done and close, and what
    it was told (its views and its start; the end it hears after its own done is not an RMS message of its
    own in the totals) -- nothing else."""
    for clusters in ({"c0": 4}, {"c0": 4, "c1": 4, "c2": 2}):
        sim = Simulation(clusters, QUIET)
        sim.add(10.0, RigidLauncher("r", "c0", 2, 100.0, runtime=5.0))
        r = sim.run()
        app = r.apps["r"]
        (req,) = r.requests
        sent = (cdr.subscribe("r") + cdr.request("r", [(req.request, "c0", None)]) + cdr.done("r", req.request, 0)
                + cdr.close("r"))
        told = app.notification_bytes - cdr.close(req.request)
        queries = cdr.cluster_queries(sorted(clusters))
        assert r.messages == 4 + len(queries) + app.notifications - 1
        assert r.bytes == sent + sum(queries) + told
