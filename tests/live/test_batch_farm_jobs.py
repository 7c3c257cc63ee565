"""Separate batch jobs in task farms, on the live system: a user's like jobs (one cluster, size and walltime,
not attached) share a farm's session and slots -- each launched with its own command, environment, directory
and files, each with its own state, exit code and history row; a cancel withdraws only its job; a job past
its walltime ends ``timeout``; a farm older than its joining bound takes no new job (a new farm, with the
priority of now, does); and a batch service SIGKILLed in the middle loses none and runs none twice."""
# ruff: noqa: F811 - the fixtures stack and nc are test_batch's, imported

from __future__ import annotations

import asyncio
import os
import time

from coorm.services.batch.service import JOIN_YOUNG
from coorm.services.stack import LocalStack, wait_until
from coorm.shared import bus
from coorm.shared.endpoints import Role
from tests.live.test_batch import (  # noqa: F401 - (stack, nc: fixtures)
    BatchProcesses,
    _gone,
    _until_served,
    control,
    ended,
    most_at_once,
    nc,
    query,
    stack,
    submit,
    until_state,
)
from tests.live.test_batch_farm import _apps, _until_no_app


async def _held(nc, tmp_path, n: int, **kw) -> list[str]:
    """``n`` like jobs, held: released together, they enter the queue at one instant (one young farm)."""
    return [await submit(nc, tmp_path, hold=True, **kw) for _ in range(n)]


async def test_like_jobs_share_a_farm_each_with_its_own_command_environment_directory_and_file(stack, nc, tmp_path):
    jobs = []
    for i in range(6):
        d = tmp_path / f"d{i}"
        d.mkdir()
        kw: dict = {"argv": ["sh", "-c", 'echo "$COORM_JOB_ID $COORM_JOB_NAME $X $(pwd)"; exit $((X % 3))']}
        if i == 4:  # a wrapped command line and a script among them: the same shape, each run as it was submitted
            kw = {"wrap": 'echo "wrapped $COORM_JOB_ID $X"'}
        elif i == 5:
            kw = {"script": '#!/bin/sh\necho "script $COORM_JOB_ID $X $1"\n', "argv": ["arg"]}
        jobs.append(await submit(nc, tmp_path, cluster="c1", hold=True, name=f"job{i}", cwd=str(d),
                                 env={"PATH": os.environ["PATH"], "X": str(i)}, **kw))
    await control(nc, "release", jobs=jobs)
    recs = [(await ended(nc, j))[0] for j in jobs]
    for i, (j, r) in enumerate(zip(jobs, recs, strict=True)):
        out = (tmp_path / f"d{i}" / f"coorm-{j}.out").read_text()
        if i < 4:
            assert (r.state, r.exit_code) == (("completed", 0) if i % 3 == 0 else ("failed", i % 3)), r
            assert out == f"{j} job{i} {i} {tmp_path / f'd{i}'}\n"
        else:
            assert (r.state, r.exit_code) == ("completed", 0), r
            assert out == (f"wrapped {j} 4\n" if i == 4 else f"script {j} 5 arg\n")
    # one application for the six (c1 has 2 nodes: at most two at once, on slots of the farm)
    assert len({r.app for r in recs}) == 1 and recs[0].app is not None
    assert most_at_once(recs) <= 2
    await _until_no_app(nc)  # its slots go back (after a linger) and its session closes


async def test_a_farm_is_one_application_in_the_rms_and_the_queue(stack, nc, tmp_path):
    gate = tmp_path / "gate"
    jobs = await _held(nc, tmp_path, 3, argv=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                       cluster="c0")
    await control(nc, "release", jobs=jobs)
    for j in jobs:
        await until_state(nc, j, "running")
    apps = await _apps(nc)
    assert len(apps) == 1 and apps[0].kind == "batch-farm"
    assert {j.app for j in (await query(nc, jobs=jobs)).jobs} == {apps[0].app}  # coorm queue shows it
    gate.touch()
    recs = [(await ended(nc, j))[0] for j in jobs]
    assert {r.state for r in recs} == {"completed"}


async def test_cancel_withdraws_only_its_job_running_or_waiting_in_the_farm(stack, nc, tmp_path):
    gate = tmp_path / "gate"
    jobs = await _held(nc, tmp_path, 4, argv=["sh", "-c", f'echo $$; while [ ! -e {gate} ]; do sleep 0.05; done'],
                       cluster="c1")
    await control(nc, "release", jobs=jobs)
    await until_state(nc, jobs[0], "running")
    await until_state(nc, jobs[1], "running")
    out = tmp_path / f"coorm-{jobs[0]}.out"
    await wait_until(lambda: out.exists() and out.read_text().strip() != "", what="job 0's pid")
    pid = int(out.read_text().split()[0])
    assert (await control(nc, "cancel", jobs=[jobs[0], jobs[2]])).jobs == [jobs[0], jobs[2]]
    await wait_until(lambda: _gone(pid), timeout=10, what="the cancelled job's process killed")
    gate.touch()
    recs = [(await ended(nc, j))[0] for j in jobs]
    assert [r.state for r in recs] == ["cancelled", "completed", "cancelled", "completed"]
    assert recs[2].started is None  # withdrawn before it ran
    await _until_no_app(nc)


async def test_a_job_past_its_walltime_ends_timeout_and_a_like_job_runs(stack, nc, tmp_path):
    slow, quick = await _held(nc, tmp_path, 2, argv=["sh", "-c", "mkdir lock 2>/dev/null && exec sleep 60; true"],
                              cluster="c1", walltime=1.0)
    await control(nc, "release", jobs=[slow, quick])
    (a,), (b,) = await ended(nc, slow), await ended(nc, quick)
    timed, done = (a, b) if a.exit_code == 124 else (b, a)
    assert (timed.state, timed.exit_code) == ("timeout", 124)
    assert timed.ended - timed.started < 5.0
    assert (done.state, done.exit_code) == ("completed", 0)


async def test_a_farm_past_its_joining_bound_takes_no_new_job_a_new_farm_does(stack, nc, tmp_path):
    """The RMS orders applications by when their session opened: a job joining an old farm would take its
    old priority. Past JOIN_YOUNG, with no idle slot to run it at once, a like job opens a new farm."""
    gate = tmp_path / "gate"
    argv = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]
    first = await submit(nc, tmp_path, argv=argv, cluster="c0")
    await until_state(nc, first, "running")
    (old,) = await _apps(nc)
    while time.time() < old.opened + JOIN_YOUNG:  # the bound is the time itself: waited out
        await asyncio.sleep(old.opened + JOIN_YOUNG - time.time() + 0.01)
    second = await submit(nc, tmp_path, argv=argv, cluster="c0")
    await until_state(nc, second, "running")
    apps = {a.app: a for a in await _apps(nc)}
    (j1, j2) = (await query(nc, jobs=[first, second])).jobs
    assert j1.app == old.app and j2.app != old.app and j2.app in apps
    assert apps[j2.app].opened > old.opened + JOIN_YOUNG  # its priority: now's
    gate.touch()
    assert (await ended(nc, first))[0].state == (await ended(nc, second))[0].state == "completed"
    await _until_no_app(nc)  # the old farm closed once its job ended, the new one too


async def test_jobs_released_together_keep_their_order_a_farm_takes_only_consecutive_like_jobs(stack, nc, tmp_path):
    """Jobs of two shapes, interleaved, released at once: a farm's priority would let its later jobs pass the
    other shape's jobs entered before them, so each run of consecutive like jobs is a farm of its own, and
    the farms' sessions open in the jobs' order (an application's priority in the RMS)."""
    gate = tmp_path / "gate"
    argv = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]
    walltimes = [60.0, 60.0, 120.0, 60.0, 120.0, 120.0]  # runs: [0 1] [2] [3] [4 5]
    jobs = [await submit(nc, tmp_path, argv=argv, cluster="c0", walltime=w, hold=True) for w in walltimes]
    await control(nc, "release", jobs=jobs)
    deadline = time.monotonic() + 30
    while True:  # (polling the queue: each job is told its farm's application once the farm has opened)
        recs = (await query(nc, jobs=jobs)).jobs
        if all(r.app for r in recs):
            break
        assert time.monotonic() < deadline, "the farms never opened"
        await asyncio.sleep(0.05)
    app = {r.id: r.app for r in recs}
    assert app[jobs[0]] == app[jobs[1]] and app[jobs[4]] == app[jobs[5]]
    assert len({app[j] for j in jobs}) == 4
    opened = {a.app: a.opened for a in await _apps(nc)}
    order = [app[j] for j in (jobs[0], jobs[2], jobs[3], jobs[4])]
    assert [opened[a] for a in order] == sorted(opened[a] for a in order)  # in the queue's order
    gate.touch()
    assert {(await ended(nc, j))[0].state for j in jobs} == {"completed"}


async def test_a_batch_service_killed_in_the_middle_of_a_farm_of_jobs_loses_none_and_runs_none_twice(
        servers, redis_url, tmp_path):
    """The batch service as a real process, SIGKILLed while a farm of separate jobs runs its first two (held
    by a gate) and six wait in it; another process takes the farm up: every job ends with its own exit code,
    each ran once (each appends a line to a file of its own)."""
    batch = BatchProcesses(servers, tmp_path)
    batch.start()
    async with LocalStack(batch.settings, {"c0": 4, "c1": 2}) as stack:
        conn = await bus.connect(stack.settings.nats_url, "test-user", stack.settings.identity(Role.LAUNCHER))
        try:
            gate = tmp_path / "gate"
            runs = tmp_path / "runs"
            runs.mkdir()
            await _until_served(conn)
            jobs = await _held(conn, tmp_path, 8, cluster="c1", argv=[
                "sh", "-c", f'echo x >> {runs}/$COORM_JOB_ID; while [ ! -e {gate} ]; do sleep 0.05; done; '
                            "exit $((COORM_JOB_ID % 2))"])
            await control(conn, "release", jobs=jobs)
            await until_state(conn, jobs[0], "running")
            await until_state(conn, jobs[1], "running")
            batch.sigkill()
            gate.touch()
            batch.start()
            await _until_served(conn)
            recs = [(await ended(conn, j))[0] for j in jobs]
            assert [(r.state, r.exit_code) for r in recs] == [
                ("completed" if int(j) % 2 == 0 else "failed", int(j) % 2) for j in jobs]
            assert sorted(os.listdir(runs)) == sorted(jobs)
            for j in jobs:
                assert (runs / j).read_text() == "x\n", f"job {j} ran more than once"
            assert (await query(conn)).total == 0
        finally:
            await bus.shutdown(conn)
            batch.stop_all()
