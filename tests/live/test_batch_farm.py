"""Arrays in their task farm, on the live system: one session for an array, its tasks run one after the
other on slots (real requests, real agents, real processes), each task with its own state, exit code and
output file; cancel of a task or of the array, a task past its walltime, and a batch service SIGKILLed in
the middle of an array -- nothing lost, nothing run twice. (With ``batch_farm`` off, each task is a job of
its own: tests/live/test_batch.py covers that path with the same array test.)"""
# ruff: noqa: F811 - the fixtures stack and nc are test_batch's, imported

from __future__ import annotations

import asyncio
import os
import time

from coorm.services.stack import LocalStack, wait_until
from coorm.shared import bus, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import StatusQuery, StatusReply
from coorm.shared.settings import Settings
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


async def _apps(nc) -> list:
    return (await bus.call(nc, subjects.QUERY_STATUS, StatusQuery(), StatusReply, timeout=10)).apps


async def _until_no_app(nc) -> None:
    """Until the RMS has no application left (the farm closes its session after its last task's end)."""
    deadline = time.monotonic() + 10
    while await _apps(nc):
        assert time.monotonic() < deadline, "the farm's session never closed"
        await asyncio.sleep(0.05)  # polling the RMS's status: nothing tells of a session's close


async def test_an_array_runs_in_one_session_each_task_with_its_own_exit_code_and_file(stack, nc, tmp_path):
    job = await submit(nc, tmp_path, argv=["sh", "-c", 'echo "task $COORM_ARRAY_TASK_ID on $COORM_NODE"; '
                                                       "exit $((COORM_ARRAY_TASK_ID % 3))"],
                       array="0-11", cluster="c1")
    recs = await ended(nc, job, count=12)
    assert [r.task for r in recs] == list(range(12))
    for r in recs:
        want = ("completed", 0) if r.task % 3 == 0 else ("failed", r.task % 3)
        assert (r.state, r.exit_code) == want, r
        (node,) = r.node_ids
        assert (tmp_path / f"coorm-{job}_{r.task}.out").read_text() == f"task {r.task} on {node}\n"
    # c1 has 2 nodes: twelve tasks ran on them, at most two at once, in a farm of at most 2 slots
    assert most_at_once(recs) <= 2
    assert len({n for r in recs for n in r.node_ids}) <= 2
    await _until_no_app(nc)  # the farm's session closes after its last task


async def test_an_array_is_one_application_not_one_per_task(stack, nc, tmp_path):
    gate = tmp_path / "gate"
    job = await submit(nc, tmp_path, argv=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                       array="0-5", cluster="c0")
    await until_state(nc, f"{job}_0", "running")
    apps = await _apps(nc)
    assert len(apps) == 1 and apps[0].kind == "batch-array"
    gate.touch()
    recs = await ended(nc, job, count=6)
    assert {r.state for r in recs} == {"completed"}


async def test_cancel_of_a_running_task_kills_it_and_the_others_go_on(stack, nc, tmp_path):
    gate = tmp_path / "gate"
    job = await submit(nc, tmp_path, argv=["sh", "-c", f'echo $$; while [ ! -e {gate} ]; do sleep 0.05; done'],
                       array="0-3", cluster="c1")
    await until_state(nc, f"{job}_0", "running")
    out = tmp_path / f"coorm-{job}_0.out"
    await wait_until(lambda: out.exists() and out.read_text().strip() != "", what="task 0's pid")
    pid = int(out.read_text().split()[0])
    reply = await control(nc, "cancel", jobs=[f"{job}_0"])
    assert reply.jobs == [f"{job}_0"]
    await wait_until(lambda: _gone(pid), timeout=10, what="the cancelled task's process killed")
    gate.touch()
    recs = await ended(nc, job, count=4)
    assert [(r.task, r.state) for r in recs] == [(0, "cancelled"), (1, "completed"), (2, "completed"),
                                                 (3, "completed")]


async def test_cancel_of_the_array_ends_every_task_and_its_session(stack, nc, tmp_path):
    job = await submit(nc, tmp_path, argv=["sleep", "60"], array="0-9", cluster="c1")
    await until_state(nc, f"{job}_1", "running")
    reply = await control(nc, "cancel", jobs=[job])
    assert len(reply.jobs) == 10
    recs = await ended(nc, job, count=10)
    assert {r.state for r in recs} == {"cancelled"}
    await _until_no_app(nc)


async def test_a_task_past_its_walltime_ends_timeout_and_the_next_runs(stack, nc, tmp_path):
    job = await submit(nc, tmp_path, argv=["sh", "-c", '[ "$COORM_ARRAY_TASK_ID" = 0 ] && exec sleep 60; true'],
                       array="0-2%1", cluster="c0", walltime=1.0)
    recs = await ended(nc, job, count=3)
    assert [(r.state, r.exit_code) for r in recs] == [("timeout", 124), ("completed", 0), ("completed", 0)]
    assert recs[0].ended - recs[0].started < 5.0


async def test_a_batch_service_killed_in_the_middle_of_an_array_loses_no_task_and_runs_none_twice(
        servers, redis_url, tmp_path):
    """The batch service as a real process, SIGKILLed while an array's first tasks run (held by a gate) and
    the rest wait in its farm; another process takes the farm up: every task ends completed, each ran once
    (each appends a line to a file of its own)."""
    batch = BatchProcesses(servers, tmp_path)
    batch.start()
    async with LocalStack(batch.settings, {"c0": 4, "c1": 2}) as stack:
        conn = await bus.connect(stack.settings.nats_url, "test-user", stack.settings.identity(Role.LAUNCHER))
        try:
            gate = tmp_path / "gate"
            runs = tmp_path / "runs"
            runs.mkdir()
            await _until_served(conn)
            job = await submit(conn, tmp_path, cluster="c1", array="0-7", argv=[
                "sh", "-c", f'echo x >> {runs}/$COORM_ARRAY_TASK_ID; while [ ! -e {gate} ]; do sleep 0.05; done; '
                            "exit $((COORM_ARRAY_TASK_ID % 2))"])
            await until_state(conn, f"{job}_1", "running")
            batch.sigkill()
            gate.touch()
            batch.start()
            await _until_served(conn)
            recs = await ended(conn, job, count=8)
            assert [(r.task, r.state, r.exit_code) for r in recs] == [
                (t, "completed" if t % 2 == 0 else "failed", t % 2) for t in range(8)]
            assert sorted(os.listdir(runs)) == sorted(str(t) for t in range(8))
            for t in range(8):
                assert (runs / str(t)).read_text() == "x\n", f"task {t} ran more than once"
            assert (await query(conn)).total == 0
        finally:
            await bus.shutdown(conn)
            batch.stop_all()


async def test_with_the_farm_off_each_task_is_an_application_of_its_own(servers, redis_url, tmp_path):
    settings = Settings(nats_url=servers.nats_url, redis_url=servers.redis_url, reschedule_interval=0.05,
                        fair_start=0.0, kill_grace=0.3, launcher_heartbeat=0.2, session_timeout=5.0,
                        agent_heartbeat=0.2, agent_timeout=2.0, batch_farm=False)
    async with LocalStack(settings, {"c0": 4}, with_batch=True) as s:
        conn = await bus.connect(s.settings.nats_url, "test-user", s.settings.identity(Role.LAUNCHER))
        try:
            gate = tmp_path / "gate"
            job = await submit(conn, tmp_path, argv=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
                               array="0-2", cluster="c0")
            for t in range(3):
                await until_state(conn, f"{job}_{t}", "running")
            apps = await _apps(conn)
            assert len(apps) == 3 and {a.kind for a in apps} == {"batch"}
            gate.touch()
            recs = await ended(conn, job, count=3)
            assert {r.state for r in recs} == {"completed"}
        finally:
            await bus.shutdown(conn)
