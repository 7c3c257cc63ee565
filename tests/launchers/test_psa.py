"""The PSA launcher's decisions (CooRMv2 §V-A2), driven by hand with made-up views."""

from __future__ import annotations

from coorm.launchers.base import Done, Submit, Timer, Views
from coorm.launchers.psa import PSALauncher
from coorm.shared.stepfn import StepFunction


def views(now: float, steps) -> Views:
    return Views(now, {"c0": StepFunction.from_steps([(now, 0)])}, {"c0": StepFunction.from_steps(steps)})


def started(psa: PSALauncher, now: float, nodes: int) -> list:
    """Answer its request as the RMS would and return its commands."""
    (rid,) = [c.requests[0].id for c in psa._last if isinstance(c, Submit)]
    return psa.on_start(now, rid, tuple(f"n{i}" for i in range(nodes)))


def ask(psa: PSALauncher, v: Views) -> list:
    psa._last = psa.on_views(v)
    return psa._last


def test_asks_what_the_view_keeps_for_a_whole_task():
    psa = PSALauncher("p", "c0", 600)
    out = ask(psa, views(0, [(0, 10), (300, 4), (900, 8)]))  # 10 now, but only 4 for a whole 600 s task
    (submit,) = [c for c in out if isinstance(c, Submit)]
    assert submit.requests[0].nodes == 4 and submit.requests[0].type.value == "preemptible"
    # no new view comes when an announced change happens: it wakes itself up when the view leaves 4
    assert [c.at for c in out if isinstance(c, Timer)] == [900]


def test_an_immediate_drop_kills_the_youngest_tasks_and_counts_the_waste():
    psa = PSALauncher("p", "c0", 600)
    ask(psa, views(0, [(0, 4)]))
    started(psa, 0, 4)
    psa.tasks["n0"] = 0.0
    psa.tasks["n1"] = 50.0  # the youngest two: n1 and n3
    psa.tasks["n3"] = 80.0
    out = ask(psa, views(100, [(100, 2)]))
    done = [c for c in out if isinstance(c, Done)][0]
    assert set(done.released) == {"n3", "n1"}
    assert psa.waste == (100 - 80) + (100 - 50) and psa.killed == 2
    successor = [c for c in out if isinstance(c, Submit)][0].requests[0]
    assert successor.nodes == 2 and successor.related_how.value == "NEXT" and successor.related_to == done.request


def test_an_announced_drop_lets_tasks_finish_and_releases_their_nodes():
    psa = PSALauncher("p", "c0", 600)
    ask(psa, views(0, [(0, 4)]))
    started(psa, 0, 4)
    psa.views = views(500, [(500, 4), (1000, 1)])  # announced at 500: only 1 node from 1000 on
    out = psa.on_timer(600, "tasks")
    done = [c for c in out if isinstance(c, Done)][0]
    assert len(done.released) == 3 and psa.waste == 0 and psa.completed == 4
    assert len(psa.tasks) == 1  # one task restarted: the view keeps one node for its whole run


def test_a_waiting_request_the_view_no_longer_holds_is_asked_again_smaller():
    psa = PSALauncher("p", "c0", 60)
    out = ask(psa, views(0, [(0, 10)]))
    first = [c for c in out if isinstance(c, Submit)][0].requests[0]
    out = psa.on_views(views(1, [(1, 5)]))  # another application asked too: our share is 5
    assert [c.request for c in out if isinstance(c, Done)] == [first.id]
    again = [c for c in out if isinstance(c, Submit)][0].requests[0]
    assert again.nodes == 5


def test_tasks_on_nodes_not_given_back_are_counted_lost():
    psa = PSALauncher("p", "c0", 600)
    ask(psa, views(0, [(0, 4)]))
    started(psa, 0, 4)
    out = ask(psa, views(100, [(100, 2)]))  # shrink to 2: all tasks are as old, n0 and n1 go
    successor = [c for c in out if isinstance(c, Submit)][0].requests[0].id
    psa.on_end(100, [c for c in out if isinstance(c, Done)][0].request, "done")
    psa.on_start(130, successor, ("n2", "n9"))  # n3 was not carried over
    assert "n3" not in psa.tasks and psa.tasks["n2"] == 0 and psa.tasks["n9"] == 130
    assert psa.killed == 3  # two killed by the shrink, n3 lost on the way


def test_a_shrinks_successor_that_never_starts_is_forgotten_and_the_view_asked_again():
    """Live, a shrink's NEXT successor can be refused (its predecessor ended meanwhile): the runner tells the
    PSA it ended, and the PSA stops counting the nodes it was to keep -- before, it counted them for ever and
    never asked for nodes again (a PSA hung in a chaos run)."""
    psa = PSALauncher("p", "c0", 600)
    ask(psa, views(0, [(0, 4)]))
    (rid,) = [c.requests[0].id for c in psa._last if isinstance(c, Submit)]
    psa.on_start(0, rid, ("n0", "n1", "n2", "n3"))
    out = ask(psa, views(100, [(100, 2)]))  # shrink: a successor keeps 2 nodes
    successor = [c for c in out if isinstance(c, Submit)][0].requests[0]
    assert psa._held() == 2 and successor.id in psa.handing
    psa.on_end(100, rid, "walltime")  # the predecessor ends before its successor could start
    out = psa.on_end(100, successor.id, "cancelled")  # the runner: the successor was refused
    assert successor.id not in psa.handing and psa._held() == 0
    (again,) = [c for c in out if isinstance(c, Submit)]  # the view still offers 2: asked again
    assert again.requests[0].nodes == 2 and again.requests[0].related_to is None


def test_it_never_asks_past_its_maximum():
    psa = PSALauncher("p", "c0", 600, max_nodes=6)
    (submit,) = [c for c in ask(psa, views(0, [(0, 10)])) if isinstance(c, Submit)]
    assert submit.requests[0].nodes == 6
    started(psa, 0, 6)
    assert not [c for c in ask(psa, views(10, [(10, 12)])) if isinstance(c, Submit)]  # at its maximum


def test_under_fpsma_what_the_first_psa_does_not_want_past_its_maximum_goes_to_the_next():
    from coorm.launchers.rigid import RigidLauncher
    from coorm.services.policy_engine.core import PolicySettings
    from coorm.simulator.engine import Simulation

    sim = Simulation({"c0": 16, "c1": 1}, PolicySettings(preemptible="fpsma", fair_start=0.0))
    first, second = PSALauncher("p1", "c0", 60, max_nodes=10), PSALauncher("p2", "c0", 60)
    sim.add(0.0, first)
    sim.add(5.0, second)
    sim.add(0.0, RigidLauncher("r", "c1", 1, 30.0, 20.0))  # PSAs are background work: this keeps time going
    sim.run()
    assert sim.now >= 20.0 and (first._held(), second._held()) == (10, 6)
