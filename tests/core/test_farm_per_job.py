"""A task farm of separate jobs (FarmCore with ``per_job``): one slot per pending job, each asking one
walltime and a small margin (never a share of several walltimes: other users' backfilling sees the plan
separate jobs would make); an idle slot lingers a bounded time for the next like job, never past the point
where it could no longer hold a whole walltime. Driven by the small RMS of tests/core/test_farm.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.services.batch.farm import SLOT_MARGIN, Ask, FarmCore, Release, Run, Wake, slot_margin
from tests.core.test_farm import Driver

W = 100.0
LINGER = 0.4


class Watch(Driver):
    """The driver, checking after every decision what a farm of separate jobs promises."""

    def __init__(self, core: FarmCore, nodes: int) -> None:
        super().__init__(core, nodes)
        self.idle_from: dict[str, float] = {}  # held slot -> since when it has run nothing
        self.wake_at: float | None = None
        self.came: dict[str, float] = {}  # job -> when it was added
        self.ran_on: set[str] = set()  # slots that have run a job

    def add(self, jobs: list[str]) -> None:
        self.came.update((j, self.now) for j in jobs)
        self.core.add(jobs, expected=len(self.core.pending) + len(jobs), now=self.now)

    def first_run(self, job: str) -> Run:
        """``job`` added to an idle farm, its slot asked and started: the decision that runs it."""
        self.add([job])
        self.decide()
        self.start_slots()
        (run,) = [x for x in self.decide() if isinstance(x, Run)]
        return run

    def start_slots(self) -> None:
        before = set(self.held)
        super().start_slots()
        for rid in set(self.held) - before:
            self.idle_from[rid] = self.now

    def end_task(self, task: str) -> str | None:
        rid, _ = self.running[task]
        self.idle_from[rid] = self.now
        return super().end_task(task)

    def decide(self) -> list:
        out = super().decide()
        for x in out:
            if isinstance(x, Ask):
                assert x.duration == W + slot_margin(W), "a separate job's slot asks one walltime and the margin"
            elif isinstance(x, Run):
                self.idle_from.pop(x.request, None)
                if x.request in self.ran_on:  # a freed slot: only for a job that would have found it lingering
                    assert self.now - self.came[x.task] < self.core.linger, "a freed slot passed the RMS's queue"
                self.ran_on.add(x.request)
            elif isinstance(x, Release):
                self.idle_from.pop(x.request, None)
            elif isinstance(x, Wake):
                self.wake_at = x.at
        waiting = sum(1 for s in self.core.slots.values() if not s.started and not s.releasing)
        assert waiting <= len(self.core.pending), "a slot asked for no pending job"
        busy = {r for r, _ in self.running.values()}
        for rid, since in self.idle_from.items():
            if rid not in self.held or rid in busy:
                continue
            _, end = self.held[rid]
            assert self.now < since + self.core.linger + 1e-9, "a slot lingered past its bound"
            assert end - self.now >= W, "a slot lingered that could no longer hold a walltime"
            assert self.wake_at is not None and self.now < self.wake_at <= since + self.core.linger + 1e-9, \
                "a lingering slot with no wake-up at its bound"
        return out


def farm(width: int = 8) -> FarmCore:
    return FarmCore(app="a", walltime=W, width=width, per_job=True, linger=LINGER)


def test_the_margin_is_small_against_the_walltime():
    assert slot_margin(10.0) == 1.0  # at least a second
    assert slot_margin(60.0) == 1.2
    assert slot_margin(300.0) == 6.0  # a fiftieth
    assert slot_margin(86400.0) == SLOT_MARGIN  # at most


def test_one_slot_per_pending_job_each_of_one_walltime():
    core = farm()
    d = Watch(core, nodes=8)
    core.add(["j0", "j1", "j2"], expected=3)
    asks = [x for x in d.decide() if isinstance(x, Ask)]
    assert len(asks) == 3
    assert {a.duration for a in asks} == {W + slot_margin(W)}


def test_an_idle_slot_lingers_then_goes_back_and_takes_a_job_that_comes_meanwhile():
    core = farm()
    d = Watch(core, nodes=2)
    run = d.first_run("j0")
    d.now += 0.1
    d.end_task("j0")
    out = d.decide()
    assert not any(isinstance(x, Release) for x in out)  # it lingers
    assert Wake(d.now + LINGER) in out
    assert core.free(d.now) == 1
    d.now += LINGER / 2
    d.add(["j1"])  # the next like job: on the same slot, no request of its own
    out = d.decide()
    assert [x for x in out if isinstance(x, Run)] == [Run("j1", run.request, run.nodes)]
    assert not any(isinstance(x, Ask) for x in out)
    d.now += 0.1
    d.end_task("j1")
    d.decide()
    d.now += LINGER  # nothing came: it goes back at its bound
    out = d.decide()
    assert Release(run.request) in out
    assert core.idle


def test_a_slot_lingers_only_while_it_can_hold_a_whole_walltime():
    core = FarmCore(app="a", walltime=W, width=8, per_job=True, linger=5.0)  # (longer than the margin)
    d = Watch(core, nodes=1)
    d.add(["j0"])
    d.decide()
    d.start_slots()
    d.decide()
    d.now += slot_margin(W) - 0.1  # j0 ends 0.1 s before its slot can no longer hold a walltime
    d.end_task("j0")
    out = d.decide()
    (slot,) = core.slots
    assert Wake(core.slots[slot].end - W) in out  # not LINGER from now: the slot's own bound comes first
    d.now = core.slots[slot].end - W + 1e-6
    d.add(["j1"])  # too late for this slot: a new one is asked
    out = d.decide()
    assert Release(slot) in out and any(isinstance(x, Ask) for x in out)


def test_a_freed_slot_goes_back_to_the_rms_rather_than_to_a_job_that_has_waited_in_its_queue():
    """Under contention a job's own slot waits in the RMS's queue at the farm's priority; a slot of the farm
    freed early goes back, for the RMS to give by priority -- it is not kept for that job, which would pass
    other users' earlier jobs waiting for those nodes. A job that came within the linger takes it (it would
    have found the slot lingering)."""
    core = farm()
    d = Watch(core, nodes=1)  # one node: the second job's slot waits
    d.add(["j0", "j1"])
    d.decide()
    d.start_slots()
    (run,) = [x for x in d.decide() if isinstance(x, Run)]
    assert run.task == "j0" and len(d.asked) == 1  # j1's own slot waits
    d.now += 5.0
    d.end_task("j0")
    out = d.decide()
    assert Release(run.request) in out and not any(isinstance(x, Run) for x in out)
    d.start_slots()  # (the RMS gives the node to j1's own slot here: nobody else waits)
    assert [x.task for x in d.decide() if isinstance(x, Run)] == ["j1"]
    d.now += 0.5
    d.add(["j2"])  # j1 runs; j2 asks a slot of its own ...
    d.decide()
    d.now += 0.1
    d.end_task("j1")  # ... and j1's slot, freed within the linger of j2's coming, runs j2
    out = d.decide()
    assert [x.task for x in out if isinstance(x, Run)] == ["j2"]
    assert any(isinstance(x, Release) for x in out)  # its own slot, not started: withdrawn


def test_a_slot_lingers_only_in_a_stream_of_jobs():
    core = farm()
    d = Watch(core, nodes=2)
    run = d.first_run("j0")
    d.now += 1.0  # j0 ran a second, and nothing came meanwhile: no stream, nothing to wait for
    d.end_task("j0")
    assert Release(run.request) in d.decide()


def test_an_array_farm_does_not_linger():
    core = FarmCore(app="a", walltime=W, width=2)
    d = Driver(core, nodes=2)
    core.add(["t0"], expected=1)
    d.decide()
    d.start_slots()
    d.decide()
    d.end_task("t0")
    assert any(isinstance(x, Release) for x in d.decide())


step = st.one_of(
    st.tuples(st.just("tick"), st.floats(min_value=0.0, max_value=3.0)),
    st.tuples(st.just("long"), st.floats(min_value=0.0, max_value=2 * W)),
    st.tuples(st.just("start"), st.just(0)),
    st.tuples(st.just("end"), st.integers(min_value=0, max_value=30)),
    st.tuples(st.just("withdraw"), st.integers(min_value=0, max_value=30)),
    st.tuples(st.just("add"), st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("wake"), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(nodes=st.integers(1, 6), width=st.integers(1, 6), first=st.integers(1, 6),
       linger=st.sampled_from([0.0, 0.3, LINGER, 2.0]), steps=st.lists(step, max_size=60))
def test_separate_jobs_run_once_on_slots_that_hold_them_and_no_slot_lingers_past_its_bound(
        nodes, width, first, linger, steps):
    core = FarmCore(app="a", walltime=W, width=width, per_job=True, linger=linger)
    d = Watch(core, nodes=nodes)
    n = first
    added = [f"j{i}" for i in range(n)]
    withdrawn: set[str] = set()
    d.add(added)
    d.decide()
    for kind, arg in steps:
        if kind in ("tick", "long"):
            d.now += arg
        elif kind == "wake" and d.wake_at is not None and d.wake_at > d.now:
            d.now = d.wake_at  # the shell's timer
        elif kind == "start":
            d.start_slots()
        elif kind == "end" and d.running:
            d.end_task(sorted(d.running)[arg % len(d.running)])
        elif kind == "withdraw":
            job = added[arg % len(added)]
            if job not in withdrawn and job not in {r.task for r in d.runs if r.task not in d.running}:
                withdrawn.add(job)
                core.withdraw(job)
        elif kind == "add":
            new = [f"j{i}" for i in range(n, n + arg)]
            n += arg
            added += new
            d.add(new)
        d.decide()
    d.run_to_the_end(10 * (n + 1))
    assert core.idle, "the farm never finished"
    ran = [r.task for r in d.runs]
    assert len(ran) == len(set(ran)), "a job ran twice"
    assert set(added) - withdrawn <= set(ran), "a job neither ran nor was withdrawn"
    assert len(d.free) == nodes


def test_a_slot_taken_up_with_its_job_running_is_kept_until_its_start_is_told_again():
    """After a restart the farm learns a job runs on a slot (``running``) before the RMS tells that slot's
    start again: the slot is not a stand-in for a pending job that ran elsewhere, and is not released (it
    was, killing the running job, which then counted as completed: CI's
    test_a_restarted_batch_service_takes_its_running_jobs_up, one run in ten)."""
    core = FarmCore(app="a", walltime=W, width=4, per_job=True, linger=LINGER)
    core.running("a.1", "job-1", since=0.0)
    assert [d for d in core.decide(1.0) if isinstance(d, Release)] == []
    core.started("a.1", ("n0",), end=W + SLOT_MARGIN)
    assert [d for d in core.decide(2.0) if isinstance(d, Release)] == []
    assert core.task_ended("job-1") is None  # its processes ended: the slot is idle, and goes back
    assert [d for d in core.decide(3.0) if isinstance(d, Release)] == [Release("a.1")]
