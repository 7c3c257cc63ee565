"""The agent's spawner (node_agent/spawner.py) as a real process: launches are forked without waiting for
each other's exec, and every launch's exit is told, however soon it comes."""

from __future__ import annotations

import asyncio
import os

import pytest

from coorm.node_agent.spawn_client import Spawner, SpawnFailed

BOUND = 20.0  # seconds: a bound against a hang, not a pause


@pytest.fixture
async def spawner():
    s = Spawner.start()
    try:
        yield s
    finally:
        s.close()


def _spawn(s: Spawner, argv: list[str], files=None):
    return s.spawn(argv=argv, env={"PATH": os.environ["PATH"]}, cwd=None, cgroup=None, drop=None, files=files,
                   piped=[])


async def test_a_launch_slow_to_exec_does_not_hold_the_next(spawner, tmp_path):
    # the first launch's child blocks before its exec, opening its output file: a FIFO no one reads yet
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    slow = asyncio.ensure_future(_spawn(spawner, ["sh", "-c", "exit 5"], files=(str(fifo), None, True)))
    pid, _, _ = await asyncio.wait_for(_spawn(spawner, ["sh", "-c", "exit 3"]), BOUND)
    assert await asyncio.wait_for(spawner.exited(pid), BOUND) == 3
    assert not slow.done()  # (still opening its output: it was not waited for)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the child's open() returns: it execs
    try:
        slow_pid, _, _ = await asyncio.wait_for(slow, BOUND)
        assert await asyncio.wait_for(spawner.exited(slow_pid), BOUND) == 5
    finally:
        os.close(reader)


async def test_every_quick_exit_is_told_with_its_code(spawner):
    # launches that end at once: an exit may reach the spawner before the launch's exec is confirmed, and the
    # agent before spawn() has returned the pid
    launched = await asyncio.wait_for(asyncio.gather(*(_spawn(spawner, ["sh", "-c", f"exit {k}"])
                                                       for k in range(60))), BOUND)
    codes = await asyncio.wait_for(asyncio.gather(*(spawner.exited(pid) for pid, _, _ in launched)), BOUND)
    assert codes == list(range(60))


async def test_launches_that_cannot_start_say_why_and_the_others_go_on(spawner, tmp_path):
    results = await asyncio.wait_for(asyncio.gather(
        _spawn(spawner, ["/nonexistent/program"]),
        _spawn(spawner, ["true"], files=(str(tmp_path / "no" / "such" / "dir" / "out"), None, True)),
        _spawn(spawner, ["sh", "-c", "exit 9"]),
        return_exceptions=True), BOUND)
    missing, unwritable, ok = results
    assert isinstance(missing, SpawnFailed) and missing.stage == "exec", missing
    assert isinstance(unwritable, SpawnFailed) and unwritable.stage == "files", unwritable
    assert not isinstance(ok, BaseException)
    assert await asyncio.wait_for(spawner.exited(ok[0]), BOUND) == 9


_FLOOD = """
import asyncio, os, sys
from coorm.node_agent.spawn_client import Spawner

async def main(n):
    s = Spawner.start()
    try:
        env = {"PATH": os.environ["PATH"]}
        launched = await asyncio.gather(*(s.spawn(argv=["true"], env=env, cwd=None, cgroup=None, drop=None,
                                                  files=None, piped=[]) for _ in range(n)))
        codes = await asyncio.gather(*(s.exited(pid) for pid, _, _ in launched))
        print(len(codes), sorted(set(codes)))
    finally:
        s.close()

asyncio.run(main(int(sys.argv[1])))
"""


def test_a_thousand_launches_at_once_neither_side_waits_on_the_other_for_ever(tmp_path):
    """1,000 launches asked at once (an agent of many nodes, a thousand one-node jobs starting together): the
    spawner, telling answers and exits faster than they are read, fills the agent's end of the socket while
    the agent fills the spawner's. The agent sent each launch with a blocking send: both waited on each other
    for ever, the agent's event loop with them -- no heartbeat, every node down (``bench_live.py --n 1000``).
    Run in a process of its own, which a hang cannot take the test run with: every exit told, code 0."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "flood.py"
    script.write_text(_FLOOD)
    proc = subprocess.Popen([sys.executable, str(script), "1000"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)  # a bound against the hang: 1,000 launches take a few seconds
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("1,000 launches at once: the agent's side and the spawner waited on each other")
    assert (proc.returncode, out.split("\n")[0]) == (0, "1000 [0]")


@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup and another identity need root")
async def test_a_child_starts_in_its_cgroup_as_the_user_with_every_signal_at_its_default(spawner, tmp_path):
    """The child as the C fork makes it: born in its cgroup (the spawner stepped in for the fork, and out
    again), with the user's ids and groups, nothing ignored or blocked (the spawner catches SIGTERM: an
    ignored one would stay ignored in the job), its output file opened as the user and owned by the user."""
    import pwd

    from coorm.node_agent.containment import Cgroups

    cgroups = Cgroups.create(f"test-spawner-{os.getpid()}")
    if cgroups is None:
        pytest.skip(f"no cgroups here: {Cgroups.why_not}")
    nobody = pwd.getpwnam("nobody")
    out = tmp_path / "out"
    tmp_path.chmod(0o777)
    cg = cgroups.prepare()
    try:
        pid, _, _ = await asyncio.wait_for(spawner.spawn(
            argv=["/bin/sh", "-c", "id -u; id -G; cat /proc/self/cgroup; grep -E '^Sig(Ign|Blk)' /proc/self/status"],
            env={"PATH": os.environ["PATH"]}, cwd=str(tmp_path), cgroup=str(cg),
            drop=(nobody.pw_uid, nobody.pw_gid, [nobody.pw_gid]), files=("out", None, False), piped=[]), BOUND)
        assert await asyncio.wait_for(spawner.exited(pid), BOUND) == 0
        lines = out.read_text().split("\n")
        assert lines[0] == str(nobody.pw_uid) and lines[1] == str(nobody.pw_gid)
        assert f"0::/{cg.relative_to(cgroups.base.parent.parent)}" in lines or any(
            line.startswith("0::") and line.endswith(cg.name) for line in lines), lines
        assert "SigIgn:\t0000000000000000" in lines and "SigBlk:\t0000000000000000" in lines, lines
        assert out.stat().st_uid == nobody.pw_uid
        with open(f"/proc/{spawner.proc.pid}/cgroup") as f:
            assert cg.name not in f.read()  # (the spawner went back to its own)
    finally:
        Cgroups.remove(cg)
        cgroups.base.rmdir()
