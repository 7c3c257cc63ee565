"""An array's task farm: the decisions of the one launcher that runs all of an array's tasks.

A task of an array run as a batch job of its own costs a session, a request, a start notification, a node
assignment and an accounting record -- about 50 ms of CPU over the whole system for a ``true`` that runs
for a millisecond. The farm runs an array's tasks in **slots** instead: one session for the array, one
non-preemptible request per slot (``nodes`` nodes, the size of one task), and each slot runs the array's
tasks one after the other, as HTCondor's and Flux's task farms do. The RMS keeps control: a slot is an
ordinary request, placed, backfilled, ended and accounted like any other, and a slot's nodes go back as
soon as nothing is left for it to run.

A slot asks for as much time as the tasks it is expected to run need at their walltime (its share of the
array's tasks still to run, times the walltime, and a margin for launches): the plan other jobs see is the
one separate tasks would make, and it shrinks as the tasks end early. A slot starts a task only if what
remains of its own request holds the task's whole walltime, so a task is never cut short by the end of a
slot; a task that outlives its walltime has its slot released (which kills it) and ends ``timeout``, like a
job at its walltime.

Pure: events in (tasks added or withdrawn, slots started or ended, tasks ended, the time passed in), and
:meth:`FarmCore.decide` says what to do (ask a slot, run a task on a slot, release a slot, wake up at a
time). The shell (:mod:`coorm.services.batch.farm_runner`) carries it out over a session.

A farm of **separate jobs** (``per_job``: a user's like jobs, of one cluster, size and walltime, submitted one
by one) plans differently, for a lone job's request must not stand longer in everyone's schedule than the
job's own would: one slot per pending job, each asking the walltime and a margin small against it
(:func:`slot_margin`) -- never a share of several walltimes, so that other users' backfilling sees the plan
separate jobs would make. A slot whose job ended early takes the next like job only while what remains of it
holds that job's whole walltime, i.e. within the margin, and only for a job that came less than ``linger``
ago (one that waited longer has its own request in the RMS's queue, where it keeps its place: the freed
nodes go back, for the RMS to give by priority). In a stream of jobs (one came less than ``linger`` before
the slot fell idle), an idle slot with nothing to run may **linger** (``linger`` seconds, never past that
point) for the next like job before it goes back: idle time others could have used, bounded by ``linger``
per slot and by the slot's own request -- and none after a job that ran longer than ``linger``, nor in a
batch of jobs released together (the backfill benchmark's makespan went from 1.08 to 1.17x the ideal when
every idle slot lingered)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# seconds a slot asks beyond its tasks' walltimes: what its start and each task's launch and exit take, so
# that a slot asked for k tasks holds k whole walltimes from when it can run the first
SLOT_MARGIN = 10.0


def slot_margin(walltime: float) -> float:
    """A separate job's slot's margin: at least a second (a slot's start and a launch take some tens of
    milliseconds on a loaded machine), a fiftieth of the walltime (2 % longer in everyone's schedule than the
    job's own request), at most :data:`SLOT_MARGIN`."""
    return min(SLOT_MARGIN, max(1.0, walltime / 50))

@dataclass(frozen=True)
class Ask:
    """Request a slot: ``request`` (an id of the farm's session), ``duration`` seconds."""

    request: str
    duration: float


@dataclass(frozen=True)
class Run:
    """Start ``task`` on the nodes of slot ``request``."""

    task: str
    request: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Release:
    """Give slot ``request`` back (``done``): nothing is left for it, or what runs there must stop (one not
    started yet: its request is cancelled)."""

    request: str


@dataclass(frozen=True)
class Wake:
    """Call :meth:`FarmCore.decide` again at ``at`` (a running task's walltime, a lingering slot's end)."""

    at: float


Decision = Ask | Run | Release | Wake


@dataclass
class Slot:
    nodes: tuple[str, ...] = ()
    end: float = math.inf  # when its request ends (the RMS's walltime of the slot)
    started: bool = False
    task: str | None = None  # the task it runs
    since: float = 0.0  # when that task started
    releasing: bool = False  # released: its end (and its task's exit) is on the way
    idle_since: float | None = None  # started, with no task, since then (a lingering slot's bound counts from it)
    ran: bool = False  # it has run a task (freed, it is the farm's: not a pending job's own request)


@dataclass
class FarmCore:
    app: str
    walltime: float  # of each task
    width: int  # at most this many slots (the cluster's nodes // a task's nodes)
    pending: deque[str] = field(default_factory=deque)  # tasks to run, in order
    slots: dict[str, Slot] = field(default_factory=dict)  # request -> slot (asked, running or being released)
    timed_out: set[str] = field(default_factory=set)  # tasks stopped at their walltime (their exit is on the way)
    withdrawn: set[str] = field(default_factory=set)  # running tasks cancelled (their exit is on the way)
    expected: int = 0  # tasks of the array still to run, as the shell last counted them (a slot's share)
    asked: int = 0  # requests asked so far (their ids: "<app>.<n>")
    per_job: bool = False  # a farm of separate jobs: one slot per pending job, of a walltime and slot_margin
    linger: float = 0.0  # seconds an idle slot waits for the next task (0: it goes back at once)
    drained: set[str] = field(default_factory=set)  # nodes an operator drains: a slot there starts nothing new
    _releases: list[str] = field(default_factory=list)  # slots to release at the next decision
    _ended: set[str] = field(default_factory=set)  # slots ended: a start told late (a cancel's race) is none
    _added: dict[str, float] = field(default_factory=dict)  # pending task -> when it came (per_job)
    _last_came: float | None = None  # when the last task came
    _woken: float | None = None  # the Wake last decided, not yet passed

    # -- events ---------------------------------------------------------------------------------------
    def add(self, tasks: list[str], expected: int, now: float | None = None) -> None:
        """Tasks to run (entered by the batch queue); ``expected``: how many of the array's tasks are still to
        run in all, these included (those a throttle or a dependency keeps back too); ``now``: when they came
        (a farm of separate jobs: how long a job may take a freed slot counts from it)."""
        known = set(self.pending) | {s.task for s in self.slots.values()}
        new = [t for t in tasks if t not in known]
        self.pending.extend(new)
        if now is not None:
            self._added.update((t, now) for t in new)
            self._last_came = now if self._last_came is None else max(self._last_came, now)
        self.expected = max(expected, len(self.pending))

    def withdraw(self, task: str) -> None:
        """The task was cancelled: it does not start, or its slot is released (its exit then ends nothing)."""
        if task in self.pending:
            self.pending.remove(task)
            self._added.pop(task, None)
            return
        for rid, s in self.slots.items():
            if s.task == task and not s.releasing:
                self.withdrawn.add(task)
                s.releasing = True
                self._releases.append(rid)

    def drain(self, nodes: list[str], on: bool) -> None:
        """An operator drains nodes (or resumes them): what runs there finishes, nothing new starts there --
        an idle slot on them goes back at the next decision."""
        if on:
            self.drained.update(nodes)
        else:
            self.drained.difference_update(nodes)

    def started(self, request: str, nodes: tuple[str, ...], end: float) -> None:
        """A slot started -- or, after a restart, one asked by the last instance is told of: adopted (it runs
        the next task, or goes back at once)."""
        if request in self._ended:
            return
        s = self.slots.setdefault(request, Slot())
        s.nodes, s.end, s.started = tuple(nodes), end, True

    def running(self, request: str, task: str, since: float) -> None:
        """Taken up after a restart: ``task`` was started on slot ``request`` at ``since``. The slot takes no
        other task before its start is told again (its nodes and end are not known until then)."""
        s = self.slots.setdefault(request, Slot())
        s.task, s.since, s.ran = task, since, True
        if task in self.pending:
            self.pending.remove(task)

    def task_ended(self, task: str) -> str | None:
        """Every process of ``task`` exited: its slot is free. Returns how the farm ended it, if it did
        (``timeout``, ``withdrawn``), else None: its processes' exit codes tell."""
        for s in self.slots.values():
            if s.task == task:
                s.task = None
        if task in self.timed_out:
            self.timed_out.discard(task)
            return "timeout"
        if task in self.withdrawn:
            self.withdrawn.discard(task)
            return "withdrawn"
        return None

    def slot_ended(self, request: str) -> str | None:
        """The slot's request ended (released, or ended by the RMS). Returns the task it ran, if any: that
        task's processes were killed with it."""
        self._ended.add(request)
        s = self.slots.pop(request, None)
        return s.task if s is not None else None

    # -- decisions ------------------------------------------------------------------------------------
    def decide(self, now: float) -> list[Decision]:
        if self._woken is not None and now >= self._woken:
            self._woken = None  # (passed: the same time asked again is a new wake-up)
        out: list[Decision] = [Release(rid) for rid in self._releases if rid in self.slots]
        self._releases.clear()
        for rid, s in self.slots.items():  # tasks past their walltime: their slots go (which kills them)
            if s.task is not None and not s.releasing and now >= s.since + self.walltime:
                self.timed_out.add(s.task)
                s.releasing = True
                out.append(Release(rid))
        lingering = []
        for rid, s in self.slots.items():  # idle slots: the next task, if the slot holds its walltime
            if not s.started or s.task is not None or s.releasing:
                continue
            usable = s.end - now >= self.walltime and not self.drained.intersection(s.nodes)
            task = self._next_for(s, now) if usable else None
            if task is not None:
                self.pending.remove(task)
                self._added.pop(task, None)
                s.task, s.since, s.idle_since, s.ran = task, now, None, True
                out.append(Run(task, rid, s.nodes))
                continue
            if not self.pending and self.linger > 0 and usable:
                s.idle_since = now if s.idle_since is None else s.idle_since
                until = self._linger_until(s)
                # only in a stream of jobs (one came within the linger before the slot fell idle): the bet
                # that the next comes as soon. A job that ran longer came alone, or in a batch released
                # together: nothing more is coming, and idle nodes would only stretch others' schedule
                streaming = self._last_came is not None and s.idle_since - self._last_came < self.linger
                if streaming and now < until:
                    lingering.append(until)
                    continue
            s.releasing = True
            out.append(Release(rid))
        if self.per_job:  # a slot not started whose job ran elsewhere, or was withdrawn: cancelled, the newest
            # first (it stood for that job in everyone's schedule, as the job's own request would have). Not
            # one taken up with its task running, whose start the RMS has yet to tell again: released, it
            # killed a running job, then counted as completed
            waiting = [rid for rid, s in self.slots.items() if not s.started and not s.releasing and s.task is None]
            for rid in waiting[len(self.pending):][::-1]:
                self.slots[rid].releasing = True
                out.append(Release(rid))
        out += self._ask(now)
        due = [s.since + self.walltime for s in self.slots.values() if s.task is not None and not s.releasing]
        due += lingering
        wake = min(due) if due else None
        if wake is not None and wake != self._woken:
            self._woken = wake
            out.append(Wake(wake))
        return out

    def _next_for(self, s: Slot, now: float) -> str | None:
        """The task an idle slot runs next. A farm of separate jobs' slot that has run a job (freed early: the
        RMS planned those nodes back) takes only a job that came less than ``linger`` ago -- one that would
        have found it lingering; a job that has waited longer has its own request in the RMS's queue, where
        it keeps its place, and the slot goes back for the RMS to give by priority (other users' earlier jobs
        may wait for those nodes)."""
        if not self.pending:
            return None
        if not (self.per_job and s.ran):
            return self.pending[0]
        return next((t for t in self.pending if now - self._added.get(t, now) < self.linger), None)

    def _linger_until(self, s: Slot) -> float:
        """When an idle slot goes back: ``linger`` after it fell idle, or as soon as it can no longer hold a
        whole walltime, whichever comes first."""
        assert s.idle_since is not None
        return min(s.idle_since + self.linger, s.end - self.walltime)

    def free(self, now: float) -> int:
        """Slots that could start a task at once, beyond the tasks pending (a job joining the farm now would
        run without a new request)."""
        idle = sum(1 for s in self.slots.values() if s.started and s.task is None and not s.releasing
                   and s.end - now >= self.walltime and not self.drained.intersection(s.nodes))
        return idle - len(self.pending)

    def _ask(self, now: float) -> list[Ask]:
        waiting = sum(1 for s in self.slots.values() if not s.started and not s.releasing)
        want = len(self.pending) - waiting  # tasks no slot that is yet to start will take
        live = sum(1 for s in self.slots.values() if not s.releasing)
        n = min(want, self.width - live)
        if n <= 0:
            return []
        if self.per_job:  # one job's walltime, as its own request would ask, and a margin small against it
            duration = self.walltime + slot_margin(self.walltime)
        else:  # each slot's share of what is still to run, at the walltime: the plan separate tasks would make
            share = max(1, math.ceil(self.expected / max(1, live + n)))
            duration = share * self.walltime + SLOT_MARGIN
        out = []
        for _ in range(n):
            self.asked += 1
            rid = f"{self.app}.{self.asked}"
            self.slots[rid] = Slot()
            out.append(Ask(rid, duration))
        return out

    @property
    def idle(self) -> bool:
        """Nothing to run and no slot held or asked: the farm may close its session."""
        return not self.pending and not self.slots
