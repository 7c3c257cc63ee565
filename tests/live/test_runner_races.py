"""What a shrink races with, live: :class:`~coorm.launchers.live.LiveRunner` does not fail a malleable
application (a PSA) for a launch on a node its request no longer holds (the agent answers ``not_owner``) or a
process killed because its node went to another request (``reassigned``) -- the RMS takes such nodes back by
design, and the PSA runs a killed task again -- while a rigid job, whose command is its work, fails on both.

Over a real nats-server and valkey, the services and an agent starting real processes: the launch goes to a
node another application holds, so the agent's refusal is the real one."""

from __future__ import annotations

import pytest

from coorm.launchers.live import LiveRunner
from coorm.launchers.psa import PSALauncher
from coorm.launchers.rigid import RigidLauncher
from coorm.launchers.sdk import Exited, Session, Started
from coorm.services.stack import LocalStack
from coorm.shared.requests import RequestSpec
from tests.live.test_system import _settings


@pytest.fixture
async def stack(servers, redis_url):
    async with LocalStack(_settings(servers, fair_start=0.0), {"c0": 4}) as s:
        yield s


async def _taken_node(stack, other: Session) -> str:
    (r,) = await other.request(RequestSpec(id=other.rid("hold"), cluster="c0", nodes=1, duration=600))
    return (await other.wait_start(r, 10)).nodes[0]


@pytest.mark.parametrize(("kind", "fails"), [("psa", False), ("rigid", True)])
async def test_a_launch_on_a_node_gone_to_another_fails_a_rigid_job_not_a_malleable_one(stack, kind, fails):
    async with await Session.open(stack.settings, kind="rigid") as other, \
            await Session.open(stack.settings, kind=kind) as app:
        node = await _taken_node(stack, other)
        launcher = PSALauncher(app.app, "c0", 5.0) if kind == "psa" else RigidLauncher(app.app, "c0", 1, 60.0)
        runner = LiveRunner(app, launcher, command=["sleep", "30"], command_ends_work=kind == "rigid")
        # the start as a runner hears it when the node went back before its launch reached the agent
        await runner._launch(Started(request=app.rid("grow"), cluster="c0", nodes=(node,), kept=(), end=None))
        r = runner.result
        assert r.processes == 0 and r.launched == []
        if fails:
            assert r.exit_code != 0 and len(r.refused) == 1 and r.overtaken == 0, r
        else:
            assert (r.exit_code, r.refused, r.overtaken) == (0, [], 1)


@pytest.mark.parametrize(("kind", "fails"), [("psa", False), ("rigid", True)])
async def test_a_process_killed_as_reassigned_fails_a_rigid_job_not_a_malleable_one(stack, kind, fails):
    async with await Session.open(stack.settings, kind=kind) as app:
        launcher = PSALauncher(app.app, "c0", 5.0) if kind == "psa" else RigidLauncher(app.app, "c0", 1, 60.0)
        runner = LiveRunner(app, launcher, command=["sleep", "30"])
        runner._running_procs = 1
        await runner._handle(Exited(request=app.rid("r"), node="c0n0", pid=4242, code=-9, killed=True,
                                    reason="reassigned"))
        r = runner.result
        assert runner._running_procs == 0
        assert (r.exit_code != 0, r.reassigned) == ((True, 0) if fails else (False, 1))


@pytest.mark.parametrize(("reason", "code"), [("node_failure", 1), ("walltime", 124)])
async def test_a_job_the_rms_ends_before_its_processes_report_does_not_exit_0(stack, reason, code):
    """The RMS ends a rigid job's request (its node failed; the agent that would report its processes is gone)
    while its command runs: the job did not complete, so its code is not 0 -- as coorm submit says, 1 (124 at
    the walltime). The chaos test met it: an SDK job exited 0 after a node failure."""
    import asyncio

    from coorm.launchers.sdk import Killed

    async with await Session.open(stack.settings, kind="rigid") as app:
        launcher = RigidLauncher(app.app, "c0", 1, 60.0)
        runner = LiveRunner(app, launcher, command=["sleep", "30"], command_ends_work=True)
        run = asyncio.create_task(runner.run())
        while not runner.result.launched:  # (its process runs)
            assert not run.done(), run.result()
            await asyncio.sleep(0.05)
        (request,) = launcher.running
        runner._inbox.put_nowait(Killed(request=request, reason=reason, nodes=()))
        result = await asyncio.wait_for(run, 10)
        assert (result.end_reason, result.exit_code) == (reason, code)
