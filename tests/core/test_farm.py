"""An array's task farm's decisions (services/batch/farm.py), driven by a small RMS of its own: slots asked
start when there are free nodes, tasks run for the time the test gives them, and the properties that make a
farm trustworthy hold whatever the order of events: each task runs exactly once unless withdrawn, never two
on a slot, never on a slot too short for its walltime, never more slots than the width, and the farm ends
idle with its nodes given back."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.services.batch.farm import SLOT_MARGIN, Ask, FarmCore, Release, Run, Wake

W = 100.0


class Driver:
    """An RMS of ``nodes`` one-node slots: asks start in order while nodes are free; releases free them."""

    def __init__(self, core: FarmCore, nodes: int) -> None:
        self.core, self.free = core, [f"n{i}" for i in range(nodes)]
        self.now = 0.0
        self.asked: list[Ask] = []  # waiting, in order
        self.held: dict[str, tuple[str, float]] = {}  # request -> (node, end)
        self.runs: list[Run] = []
        self.running: dict[str, tuple[str, float]] = {}  # task -> (request, start)
        self.wakes: list[float] = []

    def decide(self) -> list:
        out = self.core.decide(self.now)
        for d in out:
            if isinstance(d, Ask):
                assert d.request not in self.held and d.request not in {a.request for a in self.asked}
                assert d.duration >= W
                self.asked.append(d)
            elif isinstance(d, Run):
                node, end = self.held[d.request]
                assert d.nodes == (node,)
                assert d.request not in {r for r, _ in self.running.values()}, "two tasks on one slot"
                assert end - self.now >= W, "a task started on a slot too short for its walltime"
                assert d.task not in self.running and d.task not in {r.task for r in self.runs}, "ran twice"
                self.runs.append(d)
                self.running[d.task] = (d.request, self.now)
            elif isinstance(d, Release):
                assert d.request in self.held or d.request in {a.request for a in self.asked}
            elif isinstance(d, Wake):
                self.wakes.append(d.at)
        assert sum(1 for s in self.core.slots.values() if not s.releasing) <= self.core.width
        for d in out:
            if isinstance(d, Release) and d.request not in self.held:  # not started: its request is cancelled
                self.asked = [a for a in self.asked if a.request != d.request]
                assert self.core.slot_ended(d.request) is None
            elif isinstance(d, Release):  # the RMS ends it at once: its task's processes are killed
                node, _ = self.held.pop(d.request)
                self.free.append(node)
                task = self.core.slot_ended(d.request)
                if task is not None:
                    self.running.pop(task, None)
                    self.core.task_ended(task)
        return out

    def start_slots(self) -> None:
        while self.asked and self.free:
            a = self.asked.pop(0)
            if a.request not in self.core.slots:
                continue
            node = self.free.pop(0)
            self.held[a.request] = (node, self.now + a.duration)
            self.core.started(a.request, (node,), self.now + a.duration)

    def end_task(self, task: str) -> str | None:
        self.running.pop(task)
        return self.core.task_ended(task)

    def run_to_the_end(self, rounds: int) -> None:
        """Rounds of: start what was asked, let a second pass, end every running task; until the farm is
        idle or ``rounds`` have passed."""
        for _ in range(rounds):
            if self.core.idle:
                break
            self.start_slots()
            self.decide()
            self.now += 1.0
            for task in list(self.running):
                self.end_task(task)
            self.decide()


def test_tasks_run_on_slots_one_after_the_other_and_the_slots_go_back_at_the_end():
    core = FarmCore(app="a", walltime=W, width=2)
    d = Driver(core, nodes=4)
    core.add([f"t{i}" for i in range(5)], expected=5)
    asks = [x for x in d.decide() if isinstance(x, Ask)]
    assert len(asks) == 2  # the width, not the 4 free nodes
    assert {a.duration for a in asks} == {3 * W + SLOT_MARGIN}  # each slot's share: 3 of the 5 tasks
    d.start_slots()
    runs = [x for x in d.decide() if isinstance(x, Run)]
    assert [r.task for r in runs] == ["t0", "t1"]
    while d.running:
        d.now += 1.0
        for task in list(d.running):
            assert d.end_task(task) is None
        d.decide()
    assert [r.task for r in d.runs] == [f"t{i}" for i in range(5)]
    assert core.idle and len(d.free) == 4  # every slot given back


def test_a_slot_whose_time_left_cannot_hold_a_walltime_goes_back_and_another_is_asked():
    core = FarmCore(app="a", walltime=W, width=1)
    d = Driver(core, nodes=1)
    core.add(["t0"], expected=1)  # its slot asks for one walltime
    d.decide()
    d.start_slots()
    d.decide()
    core.add(["t1"], expected=1)  # (a throttle let it in as t0 ran)
    d.now += 50.0  # t0 ran 50 s: the slot has W + margin - 50 left, less than a walltime
    d.end_task("t0")
    out = d.decide()
    assert any(isinstance(x, Release) for x in out) and any(isinstance(x, Ask) for x in out)
    d.start_slots()
    assert [x.task for x in d.decide() if isinstance(x, Run)] == ["t1"]


def test_a_task_past_its_walltime_has_its_slot_released_and_ends_timeout():
    core = FarmCore(app="a", walltime=W, width=1)
    d = Driver(core, nodes=1)
    core.add(["t0", "t1"], expected=2)
    d.decide()
    d.start_slots()
    out = d.decide()
    assert Wake(W) in out  # woken at t0's walltime
    d.now = W
    core_slot = next(iter(core.slots))
    out = core.decide(d.now)
    assert Release(core_slot) in out and "t0" in core.timed_out
    assert core.task_ended("t0") == "timeout"


def test_a_withdrawn_task_never_starts_and_a_running_one_has_its_slot_released():
    core = FarmCore(app="a", walltime=W, width=1)
    d = Driver(core, nodes=1)
    core.add(["t0", "t1", "t2"], expected=3)
    d.decide()
    d.start_slots()
    d.decide()
    core.withdraw("t2")  # pending: dropped
    core.withdraw("t0")  # running: its slot goes
    out = core.decide(d.now)
    assert any(isinstance(x, Release) for x in out)
    assert core.task_ended("t0") == "withdrawn"
    assert "t2" not in core.pending


def test_after_a_restart_a_slot_is_not_used_before_its_start_is_told_again():
    core = FarmCore(app="a", walltime=W, width=4)
    core.running("a.1", "t0", since=0.0)
    core.add(["t1"], expected=1)
    assert core.task_ended("t0") is None
    out = core.decide(1.0)
    assert not any(isinstance(x, Run) and x.request == "a.1" for x in out)
    core.started("a.1", ("n0",), end=1000.0)
    out = core.decide(1.0)
    assert Run("t1", "a.1", ("n0",)) in out or any(isinstance(x, Run) and x.task == "t1" for x in out)


# the properties, whatever the order of events -------------------------------------------------------
step = st.one_of(
    st.tuples(st.just("tick"), st.floats(min_value=0.0, max_value=2 * W)),
    st.tuples(st.just("start"), st.just(0)),
    st.tuples(st.just("end"), st.integers(min_value=0, max_value=30)),
    st.tuples(st.just("withdraw"), st.integers(min_value=0, max_value=30)),
    st.tuples(st.just("add"), st.integers(min_value=1, max_value=5)),
)


@settings(max_examples=300, deadline=None)
@given(nodes=st.integers(1, 6), width=st.integers(1, 6), first=st.integers(1, 10),
       steps=st.lists(step, max_size=60))
def test_every_task_runs_once_unless_withdrawn_and_the_farm_ends_idle(nodes, width, first, steps):
    core = FarmCore(app="a", walltime=W, width=width)
    d = Driver(core, nodes=nodes)
    n = first
    added = [f"t{i}" for i in range(n)]
    withdrawn: set[str] = set()
    core.add(added, expected=n)
    d.decide()
    for kind, arg in steps:
        if kind == "tick":
            d.now += arg
        elif kind == "start":
            d.start_slots()
        elif kind == "end" and d.running:
            task = sorted(d.running)[arg % len(d.running)]
            d.end_task(task)
        elif kind == "withdraw":
            task = added[arg % len(added)]
            if task not in withdrawn and task not in {r.task for r in d.runs if r.task not in d.running}:
                withdrawn.add(task)
                core.withdraw(task)
                if task in d.running:
                    pass  # its slot is released by the next decision, which kills it
        elif kind == "add":
            new = [f"t{i}" for i in range(n, n + arg)]
            n += arg
            added += new
            core.add(new, expected=len(core.pending) + len(new))
        d.decide()
    # then let everything run to its end: every task not withdrawn runs, exactly once
    d.run_to_the_end(10 * (n + 1))
    assert core.idle, "the farm never finished"
    ran = [r.task for r in d.runs]
    assert len(ran) == len(set(ran))
    assert set(added) - withdrawn <= set(ran)
    assert len(d.free) == nodes
    assert all(w < math.inf for w in d.wakes)
