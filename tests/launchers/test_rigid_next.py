"""The rigid and NEXT-chain launchers' decisions."""

from __future__ import annotations

from coorm.launchers.base import Close, ClusterProps, Done, Submit, Timer
from coorm.launchers.next_chain import NextChainLauncher
from coorm.launchers.rigid import RigidLauncher

PROPS = ClusterProps(nodes={"c0": 16})


def test_rigid_asks_once_and_finishes_early_with_done():
    r = RigidLauncher("a", "c0", 8, 3600, runtime=600)
    (submit,) = r.on_open(0, PROPS)
    spec = submit.requests[0]
    assert (spec.nodes, spec.duration, spec.type.value, spec.cluster) == (8, 3600, "non-preemptible", "c0")
    assert r.on_start(10, spec.id, tuple(f"n{i}" for i in range(8))) == [Timer(610, "finished")]
    out = r.on_timer(610, "finished")
    assert out == [Done(spec.id), Close()] and r.finished


def test_rigid_that_needs_its_whole_walltime_is_ended_by_the_rms():
    r = RigidLauncher("a", "c0", 8, 600)
    (submit,) = r.on_open(0, PROPS)
    assert r.on_start(10, submit.requests[0].id, ("n0",)) == []
    assert r.on_end(610, submit.requests[0].id, "walltime") == [Close()]


def test_next_chain_sends_its_phases_at_once_linked_by_next():
    c = NextChainLauncher("w", "c0", [(4, 600), (12, 300), (2, 60)])
    (submit,) = c.on_open(0, PROPS)
    specs = submit.requests
    assert [(s.nodes, s.duration) for s in specs] == [(4, 600), (12, 300), (2, 60)]
    assert specs[0].related_how.value == "FREE"
    assert [(s.related_to, s.related_how.value) for s in specs[1:]] == [(specs[0].id, "NEXT"), (specs[1].id, "NEXT")]
    assert isinstance(submit, Submit)


def test_next_chain_closes_after_its_last_phase_or_when_broken():
    c = NextChainLauncher("w", "c0", [(4, 600), (12, 300)])
    (submit,) = c.on_open(0, PROPS)
    first, last = (s.id for s in submit.requests)
    assert c.on_end(600, first, "next") == []  # handed over: goes on
    assert c.on_end(900, last, "walltime") == [Close()]
    broken = NextChainLauncher("v", "c0", [(4, 600), (12, 300)])
    (submit,) = broken.on_open(0, PROPS)
    first, last = (s.id for s in submit.requests)
    assert broken.on_end(300, first, "node_failure") == [Done(last), Close()]  # cancels the rest
