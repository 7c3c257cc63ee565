"""The batch queue's core: its rules on examples, and its invariants over random runs (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coorm.services.batch.core import (
    ACTIVE,
    ENDED,
    TRANSITIONS,
    BatchCore,
    BatchError,
    Dep,
    Enter,
    InvalidTransition,
    Job,
    JobState,
    Withdraw,
)

S = JobState


def job(i: int, *, user="u", name="j", deps=(), any_of=False, task=None, array=None) -> Job:
    jid = str(i) if task is None else f"{i}_{task}"
    return Job(id=jid, user=user, name=name, seq=i, submitted=float(i), state=S.BLOCKED, deps=tuple(deps),
               deps_any=any_of, task=task, array_id=array)


def run(core: BatchCore, jid: str, state: JobState = S.COMPLETED, t: float = 1.0) -> list:
    core.entered(jid)
    out = core.started(jid, t)
    return out + core.ended(jid, state, t + 1, 0 if state is S.COMPLETED else 1)


def entered(actions) -> list[str]:
    return [a.job for a in actions if isinstance(a, Enter)]


# ==================================================================================================
# examples
# ==================================================================================================
def test_a_job_without_dependencies_enters_at_once_and_a_held_one_on_release():
    core = BatchCore()
    assert entered(core.submit([job(1)], 0.0, hold=False)) == ["1"]
    assert core.submit([job(2)], 0.0, hold=True) == []
    assert core.jobs["2"].state is S.HELD
    released, actions = core.release(["2"], 1.0)
    assert released == ["2"] and entered(actions) == ["2"]


def test_afterok_waits_then_enters_or_is_cancelled_with_its_dependents():
    core = BatchCore()
    core.submit([job(1)], 0.0, hold=False)
    core.submit([job(2, deps=[Dep("afterok", ("1",))])], 0.0, hold=False)
    core.submit([job(3, deps=[Dep("afterany", ("2",))])], 0.0, hold=False)
    assert (core.jobs["2"].state, core.jobs["2"].reason) == (S.BLOCKED, "Dependency")
    out = run(core, "1", S.FAILED)
    assert (core.jobs["2"].state, core.jobs["2"].reason) == (S.CANCELLED, "DependencyNeverSatisfied")
    assert entered(out) == ["3"]  # afterany: 2 has terminated (cancelled), as Slurm reads it


def test_any_of_needs_one_satisfied_dependency():
    core = BatchCore()
    core.submit([job(1)], 0.0, hold=False)
    core.submit([job(2)], 0.0, hold=False)
    core.submit([job(3, deps=[Dep("afterok", ("1",)), Dep("afterok", ("2",))], any_of=True)], 0.0, hold=False)
    run(core, "1", S.FAILED)
    assert core.jobs["3"].state is S.BLOCKED
    assert entered(run(core, "2")) == ["3"]


def test_after_lets_a_job_go_once_the_other_started():
    core = BatchCore()
    core.submit([job(1)], 0.0, hold=False)
    core.submit([job(2, deps=[Dep("after", ("1",))])], 0.0, hold=False)
    core.entered("1")
    assert entered(core.started("1", 1.0)) == ["2"]


def test_an_array_throttle_bounds_the_tasks_in_the_rms_and_lets_the_next_go_as_one_ends():
    core = BatchCore()
    tasks = [job(1, task=t, array="1") for t in range(5)]
    assert entered(core.submit(tasks, 0.0, hold=False, throttle=2)) == ["1_0", "1_1"]
    assert core.jobs["1_2"].reason == "JobArrayTaskLimit"
    assert entered(run(core, "1_0")) == ["1_2"]
    # a dependency on the array is on all its tasks
    core.submit([job(2, deps=[Dep("afterok", ("1",))])], 0.0, hold=False)
    for t in ("1_1", "1_2"):
        assert entered(run(core, t)) != ["2"]
    assert core.jobs["2"].state is S.BLOCKED
    run(core, "1_3")
    assert entered(run(core, "1_4")) == ["2"]


def test_singleton_waits_for_every_earlier_job_of_the_same_user_and_name():
    core = BatchCore()
    core.submit([job(1, name="n")], 0.0, hold=False)
    core.submit([job(2, name="n", deps=[Dep("singleton")])], 0.0, hold=False)
    core.submit([job(3, name="n", deps=[Dep("singleton")])], 0.0, hold=False)
    core.submit([job(4, name="n", user="v", deps=[Dep("singleton")])], 0.0, hold=False)  # another user's
    assert core.jobs["4"].state is S.ELIGIBLE
    assert entered(run(core, "1")) == ["2"]
    assert core.jobs["3"].state is S.BLOCKED
    assert entered(run(core, "2")) == ["3"]


def test_cancel_withdraws_what_is_in_the_rms_and_ends_the_rest_at_once():
    core = BatchCore()
    core.submit([job(1)], 0.0, hold=False)
    core.submit([job(2)], 0.0, hold=True)
    core.entered("1")
    done, actions = core.cancel(["1", "2"], 5.0)
    assert sorted(done) == ["1", "2"] and actions == [Withdraw("1")]
    assert all(core.jobs[j].state is S.CANCELLED and core.jobs[j].ended == 5.0 for j in done)
    assert core.cancel(["1"], 6.0) == ([], [])  # ended already
    assert core.ended("1", S.COMPLETED, 7.0, 0) == []  # its run's end, told after: it stays cancelled


def test_dependencies_must_name_known_jobs_of_the_same_user():
    core = BatchCore()
    core.submit([job(1, user="v")], 0.0, hold=False)
    with pytest.raises(BatchError, match="no such job"):
        core.submit([job(2, deps=[Dep("afterok", ("9",))])], 0.0, hold=False)
    with pytest.raises(BatchError, match="another user"):
        core.submit([job(3, deps=[Dep("afterok", ("1",))])], 0.0, hold=False)
    assert sorted(core.jobs) == ["1"]


def test_the_wire_names_the_states_of_the_table():
    import typing

    from coorm.cli.batch import SHORT_STATE
    from coorm.shared.protocol import BatchState

    assert set(typing.get_args(BatchState)) == {s.value for s in JobState} == set(SHORT_STATE)


def test_a_change_the_table_does_not_list_is_refused():
    core = BatchCore()
    core.submit([job(1)], 0.0, hold=True)
    with pytest.raises(InvalidTransition):
        core.started("1", 1.0)  # held: never in the RMS
    assert (S.HELD, S.RUNNING) not in TRANSITIONS


def test_a_job_whose_session_was_reaped_before_it_started_enters_again():
    core = BatchCore()
    assert entered(core.submit([job(1)], 0.0, hold=False)) == ["1"]
    core.entered("1")
    assert entered(core.requeue("1")) == ["1"]
    assert core.jobs["1"].state is S.ELIGIBLE
    run(core, "1")  # it runs as any job does from there
    assert core.jobs["1"].state is S.COMPLETED
    with pytest.raises(InvalidTransition):
        core.requeue("1")  # ended: nothing to send again


def test_a_forgotten_job_leaves_no_trace():
    core = BatchCore()
    core.submit([job(1, task=t, array="1") for t in range(2)], 0.0, hold=False, throttle=1)
    run(core, "1_0")
    run(core, "1_1")
    for t in ("1_0", "1_1"):
        core.forget(t)
    assert core.jobs == {} and core.arrays == {} and core.throttle == {}
    assert not core.known("1")


def test_load_and_settle_all_take_up_a_queue_as_it_was_written():
    core = BatchCore()
    core.submit([job(1)], 0.0, hold=False)
    core.submit([job(2, deps=[Dep("afterok", ("1",))])], 0.0, hold=False)
    core.entered("1")
    copy = BatchCore()
    copy.load([Job(**{**vars(j)}) for j in core.jobs.values()], dict(core.throttle))
    assert copy.settle_all(1.0) == []  # 1 is in the RMS (its runner is taken up), 2 still waits
    copy.started("1", 2.0)
    assert entered(copy.ended("1", S.COMPLETED, 3.0, 0)) == ["2"]


# ==================================================================================================
# invariants over random runs
# ==================================================================================================
ops = st.lists(st.tuples(st.sampled_from(["submit", "array", "hold", "release", "cancel", "enter", "start", "end",
                                                 "requeue"]),
                         st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=80)


def _deps(core: BatchCore, a: int, b: int) -> tuple[tuple[Dep, ...], bool]:
    ids = sorted(core.jobs) + sorted(core.arrays)
    if not ids or a % 3 == 0:
        return (), False
    kinds = ["after", "afterok", "afternotok", "afterany", "singleton"]
    kind = kinds[a % len(kinds)]
    if kind == "singleton":
        return (Dep("singleton"),), False
    other = ids[b % len(ids)]
    if any(m.user != "u" for m in core.members(other)):
        return (), False
    return (Dep(kind, (other,)),), bool(b % 2)


def check(core: BatchCore, in_rms: set[str]) -> None:
    for j in core.jobs.values():
        if j.state in (S.ELIGIBLE, *ACTIVE):
            assert core._verdict(j) is True or j.state in ACTIVE  # (deps of a running job may fail later)
        if j.state is S.ELIGIBLE and any(d.kind == "afterok" for d in j.deps) and not j.deps_any:
            for d in j.deps:
                for o in d.jobs:
                    assert all(m.state is S.COMPLETED for m in core.members(o))
        if j.state in ACTIVE | {S.ELIGIBLE} and any(d.kind == "singleton" for d in j.deps):
            earlier = [o for o in core.jobs.values() if o.user == j.user and o.name == j.name and o.seq < j.seq]
            assert all(o.state in ENDED for o in earlier), "a singleton went before an earlier job of its name"
    for array, limit in core.throttle.items():
        live = [t for t in core.arrays.get(array, []) if core.jobs[t].state in ACTIVE | {S.ELIGIBLE}]
        assert len(live) <= limit
        assert core._in_rms.get(array, 0) == len(live)
    # nothing enters the RMS but through an Enter
    assert {j.id for j in core.jobs.values() if j.state in ACTIVE} <= in_rms


@settings(max_examples=300, deadline=None)
@given(ops)
def test_random_runs_keep_the_rules(steps):
    core = BatchCore()
    n = 0
    told: set[str] = set()  # the jobs an Enter named
    in_rms: set[str] = set()
    t = 0.0
    for op, a, b in steps:
        t += 1.0
        actions: list = []
        if op in ("submit", "array"):
            n += 1
            deps, any_of = _deps(core, a, b)
            name = "ab"[a % 2]
            if op == "submit":
                jobs = [job(n, name=name, deps=deps, any_of=any_of)]
                actions = core.submit(jobs, t, hold=b % 5 == 0)
            else:
                jobs = [job(n, name=name, deps=deps, any_of=any_of, task=k, array=str(n)) for k in range(1 + a % 4)]
                actions = core.submit(jobs, t, hold=b % 5 == 0, throttle=1 + b % 3 if a % 2 else None)
        elif core.jobs:
            ids = sorted(core.jobs)
            target = ids[a % len(ids)]
            j = core.jobs[target]
            if op == "hold":
                core.hold([target])
            elif op == "release":
                actions = core.release([target], t)[1]
            elif op == "cancel":
                actions = core.cancel([target], t)[1]
                in_rms.discard(target)
            elif op == "enter" and j.state is S.ELIGIBLE and target in told:
                core.entered(target)
                in_rms.add(target)
            elif op == "start" and j.state is S.QUEUED:
                actions = core.started(target, t)
            elif op == "requeue" and j.state is S.QUEUED:  # its session reaped before it started
                actions = core.requeue(target)
                in_rms.discard(target)
            elif op == "end" and j.state in ACTIVE:
                ends = [to for (frm, to) in TRANSITIONS if frm is j.state and to in ENDED and to is not S.CANCELLED]
                actions = core.ended(target, ends[b % len(ends)], t, b % 2)
                in_rms.discard(target)
        told |= set(entered(actions))
        for a_ in actions:
            if isinstance(a_, Withdraw):
                assert core.jobs[a_.job].state is S.CANCELLED
        check(core, in_rms | told)
    # liveness: run everything that may run, and every job ends but those held (and what waits on them)
    for _ in range(10 * (len(core.jobs) + 1)):
        ready = [j for j in core.jobs.values() if j.state in (S.ELIGIBLE, *ACTIVE)]
        if not ready:
            break
        j = ready[0]
        if j.state is S.ELIGIBLE:
            core.entered(j.id)
        if j.state is S.QUEUED:
            core.started(j.id, t)
        core.ended(j.id, S.COMPLETED, t, 0)
        check(core, {x.id for x in core.jobs.values()})
    for j in core.jobs.values():
        if j.state is S.BLOCKED:
            assert j.reason in ("Dependency", "JobArrayTaskLimit"), j
            assert any(core.members(o) and any(m.state is S.HELD or m.state is S.BLOCKED for m in core.members(o))
                       for d in j.deps for o in d.jobs) or any(d.kind == "singleton" for d in j.deps) \
                or j.reason == "JobArrayTaskLimit", f"{j.id} waits on nothing that can end"
