"""The batch queue's decisions: which queued jobs go to the RMS, and what becomes of those that wait on others.

A batch job is a record until it is *eligible*; the batch service then runs a launcher for it (a session
and a request, as any application does), and the RMS's policy decides when it starts. What the queue itself
decides -- the part Slurm users know from ``squeue``'s reasons -- is here, pure (events in, actions out, the
time passed in):

* a **held** job waits for ``release``;
* a job with **dependencies** waits until they are satisfied (``after``: the other started; ``afterok``,
  ``afternotok``, ``afterany``: it ended well, badly, or at all; ``singleton``: no earlier job of the same
  user and name is still queued or running); one that can never be satisfied (``afterok`` on a job that
  failed) is cancelled with the reason ``DependencyNeverSatisfied``, and so are its own dependents;
* an **array**'s tasks are jobs of their own (``<id>_<task>``); a throttle ``%N`` lets at most ``N`` of them be
  in the RMS at once;
* **cancel** ends a job in any state: one not yet in the RMS at once, one in it through its launcher.

Every change of state goes through :data:`TRANSITIONS`; a change it does not list raises
:class:`InvalidTransition`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum


class JobState(StrEnum):
    HELD = "held"  # by its user: not eligible until released
    BLOCKED = "blocked"  # its dependencies are not satisfied yet
    ELIGIBLE = "eligible"  # to be handed to the RMS (the batch service opens its session)
    QUEUED = "queued"  # its request waits in the RMS (the RMS's policy decides its start)
    RUNNING = "running"
    COMPLETED = "completed"  # every process exited 0
    FAILED = "failed"  # a process exited non-zero, or could not start
    TIMEOUT = "timeout"  # ended by the RMS at its walltime
    CANCELLED = "cancelled"  # by its user, or because a dependency can never be satisfied
    NODE_FAIL = "node_fail"  # ended by the RMS for another reason (a node failed, its agent stopped...)


ACTIVE = frozenset({JobState.QUEUED, JobState.RUNNING})  # in the RMS: a session is open for it
PENDING = frozenset({JobState.HELD, JobState.BLOCKED, JobState.ELIGIBLE, JobState.QUEUED})
ENDED = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT, JobState.CANCELLED, JobState.NODE_FAIL})
S = JobState
_IN_RMS = frozenset({JobState.ELIGIBLE, JobState.QUEUED, JobState.RUNNING})  # what an array's throttle counts

# (from, to): why such a change happens. Nothing else may happen to a job.
TRANSITIONS: dict[tuple[JobState, JobState], str] = {
    (S.HELD, S.BLOCKED): "released, dependencies not satisfied",
    (S.HELD, S.ELIGIBLE): "released",
    (S.HELD, S.CANCELLED): "cancelled",
    (S.BLOCKED, S.HELD): "held",
    (S.BLOCKED, S.ELIGIBLE): "dependencies satisfied",
    (S.BLOCKED, S.CANCELLED): "cancelled, or a dependency can never be satisfied",
    (S.ELIGIBLE, S.HELD): "held",
    (S.ELIGIBLE, S.QUEUED): "its request was sent to the RMS",
    (S.ELIGIBLE, S.CANCELLED): "cancelled",
    (S.ELIGIBLE, S.FAILED): "the RMS refused its request",
    (S.QUEUED, S.RUNNING): "the RMS started it",
    (S.QUEUED, S.CANCELLED): "cancelled while waiting in the RMS",
    (S.QUEUED, S.FAILED): "the RMS refused it, or its session was lost",
    (S.QUEUED, S.NODE_FAIL): "the RMS ended it before it started",
    (S.QUEUED, S.ELIGIBLE): "its session was reaped before it started (the batch service unheard): it enters again",
    (S.RUNNING, S.COMPLETED): "every process exited 0",
    (S.RUNNING, S.FAILED): "a process failed",
    (S.RUNNING, S.TIMEOUT): "its walltime",
    (S.RUNNING, S.CANCELLED): "cancelled while running",
    (S.RUNNING, S.NODE_FAIL): "ended by the RMS (node failure, agent stopped, preemption)",
}


class InvalidTransition(Exception):
    def __init__(self, job: str, old: JobState, new: JobState) -> None:
        super().__init__(f"job {job}: {old} -> {new} is not a transition of the batch queue")
        self.job, self.old, self.new = job, old, new


class BatchError(ValueError):
    """A submission or a command the queue refuses (the caller turns it into an error reply)."""


DEPENDENCY_KINDS = ("after", "afterok", "afternotok", "afterany", "singleton")


@dataclass(frozen=True)
class Dep:
    kind: str  # one of DEPENDENCY_KINDS
    jobs: tuple[str, ...] = ()  # job ids; an array's id stands for all its tasks


@dataclass
class Job:
    id: str  # "<n>" or, for an array's task, "<n>_<task>"
    user: str
    name: str
    seq: int  # submission order (ties between a user's singletons, and the queue's order)
    submitted: float
    state: JobState
    array_id: str | None = None  # the array's id, for its tasks
    task: int | None = None
    deps: tuple[Dep, ...] = ()
    deps_any: bool = False  # '?': one satisfied dependency is enough
    reason: str = ""  # why it waits, or why it ended
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    nodes: int = 1

    @property
    def ended_ok(self) -> bool:
        return self.state is JobState.COMPLETED


# -- what the core asks of its shell ------------------------------------------------------------------
@dataclass(frozen=True)
class Enter:
    """Hand the job to the RMS: open its session and send its request."""

    job: str


@dataclass(frozen=True)
class Withdraw:
    """The job was cancelled while in the RMS: cancel its request or end its run (close its session)."""

    job: str


Action = Enter | Withdraw


@dataclass
class BatchCore:
    jobs: dict[str, Job] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)  # array id -> its tasks' ids
    throttle: dict[str, int] = field(default_factory=dict)  # array id -> at most this many tasks in the RMS
    _dependents: dict[str, set[str]] = field(default_factory=dict)  # job or array id -> jobs waiting on it
    _in_rms: dict[str, int] = field(default_factory=dict)  # array id -> its tasks eligible, queued or running
    _named: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (user, name) -> its jobs, in order
    _singletons: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # the same, those with 'singleton'
    _changed: dict[str, None] = field(default_factory=dict)  # jobs whose state changed since take_changed()

    # -- queries --------------------------------------------------------------------------------------
    def members(self, job_or_array: str) -> list[Job]:
        """The jobs an id names: one job, or every task of an array."""
        if job_or_array in self.arrays:
            return [self.jobs[t] for t in self.arrays[job_or_array]]
        j = self.jobs.get(job_or_array)
        return [j] if j is not None else []

    def known(self, job_or_array: str) -> bool:
        return job_or_array in self.arrays or job_or_array in self.jobs

    def take_changed(self) -> list[str]:
        """The jobs whose state changed since the last call (what the shell must write down)."""
        out = list(self._changed)
        self._changed.clear()
        return out

    # -- events ---------------------------------------------------------------------------------------
    def load(self, jobs: list[Job], throttles: dict[str, int]) -> None:
        """The queue as it was written down (in submission order), before :meth:`settle_all`."""
        for j in jobs:
            self.jobs[j.id] = j
            if j.array_id is not None:
                self.arrays.setdefault(j.array_id, []).append(j.id)
                if j.state in _IN_RMS:
                    self._in_rms[j.array_id] = self._in_rms.get(j.array_id, 0) + 1
            self._index(j)
        self.throttle.update(throttles)

    def settle_all(self, now: float) -> list[Action]:
        """Judge every blocked job again (after :meth:`load`); eligible ones not yet in the RMS enter."""
        out = [Enter(j.id) for j in self.jobs.values() if j.state is JobState.ELIGIBLE]
        return out + self._settle([j.id for j in self.jobs.values() if j.state is JobState.BLOCKED], now)

    def _index(self, j: Job) -> None:
        for d in j.deps:
            for other in d.jobs:
                self._dependents.setdefault(other, set()).add(j.id)
        self._named.setdefault((j.user, j.name), []).append(j.id)
        if any(d.kind == "singleton" for d in j.deps):
            self._singletons.setdefault((j.user, j.name), []).append(j.id)

    def submit(self, jobs: list[Job], now: float, *, hold: bool, throttle: int | None = None) -> list[Action]:
        """New jobs (one, or an array's tasks, which share ``array_id``): held, blocked or eligible."""
        if not jobs:
            raise BatchError("nothing to submit")
        for j in jobs:
            if j.id in self.jobs:
                raise BatchError(f"job {j.id} exists already")
            for d in j.deps:
                if d.kind not in DEPENDENCY_KINDS:
                    raise BatchError(f"unknown dependency {d.kind!r}")
                for other in d.jobs:
                    if not self.known(other):
                        raise BatchError(f"dependency on {other}: no such job")
                    if any(m.user != j.user for m in self.members(other)):
                        raise BatchError(f"dependency on {other}: another user's job")
        array = jobs[0].array_id
        if array is not None:
            self.arrays[array] = [j.id for j in jobs]
            if throttle is not None:
                self.throttle[array] = throttle
        for j in jobs:
            self.jobs[j.id] = j
            self._index(j)
            j.state = JobState.HELD if hold else JobState.BLOCKED
            j.reason = "held by its user" if hold else ""
            self._changed[j.id] = None
        return self._settle([j.id for j in jobs], now) if not hold else []

    def entered(self, job: str) -> None:
        """Its request is in the RMS."""
        self._move(self.jobs[job], JobState.QUEUED, "waiting for resources")

    def requeue(self, job: str) -> list[Action]:
        """Its session ended before it started -- the RMS reaped it while the batch service could not be heard
        -- so nothing of it ran: it enters the RMS again (a new session, whose opening is its new priority)."""
        self._move(self.jobs[job], JobState.ELIGIBLE, "")
        return [Enter(job)]

    def started(self, job: str, now: float) -> list[Action]:
        j = self.jobs[job]
        self._move(j, JobState.RUNNING, "")
        j.started = now
        return self._settle(self._dependents_of(j), now)  # 'after' dependents may go now

    def ended(self, job: str, state: JobState, now: float, exit_code: int | None, reason: str = "") -> list[Action]:
        """The job's run (or its attempt to enter the RMS) ended: its dependents and its array may move on."""
        j = self.jobs[job]
        if state not in ENDED or state is JobState.CANCELLED:
            raise ValueError(f"{state} is not how a run ends")
        if j.state in ENDED:
            return []  # told twice (a recovery after a restart, then the notification)
        self._move(j, state, reason)
        j.ended, j.exit_code = now, exit_code
        return self._after_end(j, now)

    def cancel(self, ids: Iterable[str], now: float,
               reason: str = "cancelled by its user") -> tuple[list[str], list[Action]]:
        """Cancel jobs (an array's id: every task). Returns the ids cancelled and what the shell must do."""
        out: list[Action] = []
        done: list[str] = []
        for j in [m for i in ids for m in self.members(i)]:
            if j.state in ENDED:
                continue
            was_active = j.state in ACTIVE
            self._move(j, JobState.CANCELLED, reason)
            j.ended = now
            done.append(j.id)
            if was_active:
                out.append(Withdraw(j.id))
            out += self._after_end(j, now)
        return done, out

    def hold(self, ids: Iterable[str]) -> list[str]:
        """Hold jobs not yet in the RMS (Slurm, too, holds only pending jobs)."""
        held = []
        for j in [m for i in ids for m in self.members(i)]:
            if j.state in (JobState.BLOCKED, JobState.ELIGIBLE):
                self._move(j, JobState.HELD, "held by its user")
                held.append(j.id)
        return held

    def release(self, ids: Iterable[str], now: float) -> tuple[list[str], list[Action]]:
        released = []
        for j in [m for i in ids for m in self.members(i)]:
            if j.state is JobState.HELD:
                self._move(j, JobState.BLOCKED, "")
                released.append(j.id)
        return released, self._settle(released, now)

    def forget(self, job: str) -> None:
        """Drop an ended job (its history is kept elsewhere): it can no longer be named as a dependency."""
        j = self.jobs.get(job)
        if j is None or j.state not in ENDED:
            return
        del self.jobs[job]
        self._dependents.pop(job, None)
        for index in (self._named, self._singletons):
            named = index.get((j.user, j.name))
            if named is not None and job in named:
                named.remove(job)
                if not named:
                    del index[j.user, j.name]
        if j.array_id is not None and j.array_id in self.arrays:
            tasks = self.arrays[j.array_id]
            tasks.remove(job)
            if not tasks:
                del self.arrays[j.array_id]
                self.throttle.pop(j.array_id, None)
                self._in_rms.pop(j.array_id, None)
                self._dependents.pop(j.array_id, None)

    # -- the rules ------------------------------------------------------------------------------------
    def _move(self, j: Job, new: JobState, reason: str) -> None:
        if (j.state, new) not in TRANSITIONS:
            raise InvalidTransition(j.id, j.state, new)
        if j.array_id is not None:
            delta = (new in _IN_RMS) - (j.state in _IN_RMS)
            if delta:
                self._in_rms[j.array_id] = self._in_rms.get(j.array_id, 0) + delta
        j.state, j.reason = new, reason
        self._changed[j.id] = None

    def _dependents_of(self, j: Job) -> list[str]:
        out = set(self._dependents.get(j.id, ()))
        if j.array_id is not None:
            out |= self._dependents.get(j.array_id, set())
        return sorted(out, key=lambda i: self.jobs[i].seq) if out else []

    def _after_end(self, j: Job, now: float) -> list[Action]:
        out = self._settle(self._dependents_of(j), now)
        # the next singleton of the same user and name may go now
        # the next singleton of the same user and name may go now (the first one blocked: the later ones wait
        # for it anyway)
        singles = [i for i in self._singletons.get((j.user, j.name), ()) if self.jobs[i].state is JobState.BLOCKED]
        out += self._settle(singles[:1], now)
        if j.array_id is not None and j.array_id in self.throttle:  # throttled siblings may go now
            for t in self.arrays[j.array_id]:
                if self._in_rms.get(j.array_id, 0) >= self.throttle[j.array_id]:
                    break
                if self.jobs[t].state is JobState.BLOCKED and self.jobs[t].reason == "JobArrayTaskLimit":
                    out += self._settle([t], now)
        return out

    def _verdict(self, j: Job) -> bool | None:
        """True: the dependencies are satisfied; False: they never can be; None: not yet."""
        if not j.deps:
            return True
        verdicts = [self._dep_verdict(j, d) for d in j.deps]
        if j.deps_any:
            return True if any(v is True for v in verdicts) else (False if all(v is False for v in verdicts) else None)
        return False if any(v is False for v in verdicts) else (True if all(v is True for v in verdicts) else None)

    def _dep_verdict(self, j: Job, d: Dep) -> bool | None:
        if d.kind == "singleton":
            for other in self._named.get((j.user, j.name), ()):
                o = self.jobs[other]
                if o.seq < j.seq and o.state not in ENDED:
                    return None
            return True
        results: list[bool | None] = []
        for other in d.jobs:
            members = self.members(other)
            if not members:
                results.append(True)  # forgotten: it ended long ago (a submission naming it was refused then)
                continue
            results.append(_all(self._one_verdict(d.kind, m) for m in members))
        return _all(results)

    @staticmethod
    def _one_verdict(kind: str, m: Job) -> bool | None:
        if kind == "after":
            return True if m.state is JobState.RUNNING or m.state in ENDED else None
        if m.state not in ENDED:
            return None
        if kind == "afterany":
            return True
        if kind == "afterok":
            return m.ended_ok
        return not m.ended_ok  # afternotok

    def _settle(self, ids: Iterable[str], now: float) -> list[Action]:
        """Re-judge blocked jobs: eligible ones enter, impossible ones are cancelled (and so on, down their
        dependents)."""
        out: list[Action] = []
        todo = list(ids)
        while todo:
            j = self.jobs.get(todo.pop(0))
            if j is None or j.state is not JobState.BLOCKED:
                continue
            verdict = self._verdict(j)
            if verdict is False:
                self._move(j, JobState.CANCELLED, "DependencyNeverSatisfied")
                j.ended = now
                todo += self._dependents_of(j)
                continue
            if verdict is None:
                j.reason = "Dependency"
                continue
            if j.array_id is not None and j.array_id in self.throttle \
                    and self._in_rms.get(j.array_id, 0) >= self.throttle[j.array_id]:
                j.reason = "JobArrayTaskLimit"
                continue
            self._move(j, JobState.ELIGIBLE, "")
            out.append(Enter(j.id))
        return out


def _all(verdicts: Iterable[bool | None]) -> bool | None:
    vs = list(verdicts)
    if any(v is False for v in vs):
        return False
    return True if all(v is True for v in vs) else None
