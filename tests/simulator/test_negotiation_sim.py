"""The simulator runs the negotiating malleable launcher through the same policy core: offers, accepts and
lapses in virtual time, as live (tests/live/test_negotiation.py runs the same cases over the real system)."""

from __future__ import annotations

from coorm.launchers.malleable import MalleableLauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.simulator.engine import Simulation

QUIET = PolicySettings(fair_start=0.0, reschedule_interval=0.0)


def test_the_malleable_application_is_offered_the_nodes_a_rigid_job_frees_and_finishes_sooner():
    """§6 in virtual time: on 4 of 8 nodes, a rigid job of 4 for 50 s; at 50 s the RMS offers the 4, the
    application grows to 8 and its 800 node-seconds of work end at 50 + (800 - 200) / 8 = 125 s."""
    sim = Simulation({"c0": 8}, QUIET, validate=True)
    sim.add(0.0, RigidLauncher("r", "c0", 4, 100.0, runtime=50.0))
    mal = MalleableLauncher("m", "c0", 4, 8, sizes="pow2", duration=1000.0, work=800.0)
    sim.add(0.0, mal)
    sim.run()
    assert (mal.offers, mal.accepted, mal.grows, mal.peak) == (1, 1, 1, 8)
    assert mal.sizes_held[:2] == [(0.0, 4), (50.0, 8)]
    assert mal.finished and sim.apps["m"].ended == 125.0 and mal.done_work == 800.0


def test_three_free_nodes_are_no_growth_for_a_power_of_two_application():
    """Two rigid jobs of 3 and 1 end at 30 s and 60 s: nothing is offered until the fourth node frees up."""
    sim = Simulation({"c0": 8}, QUIET, validate=True)
    sim.add(0.0, RigidLauncher("r3", "c0", 3, 100.0, runtime=30.0))
    sim.add(0.0, RigidLauncher("r1", "c0", 1, 100.0, runtime=60.0))
    mal = MalleableLauncher("m", "c0", 4, 8, sizes="pow2", duration=1000.0, work=2000.0)
    sim.add(0.0, mal)
    sim.run()
    assert mal.offers == 1 and [t for t, n in mal.sizes_held if n == 8] == [60.0]
    assert not sim.rejections
