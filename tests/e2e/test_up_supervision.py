"""``coorm up`` supervises what it starts: SIGKILL any of its children -- a service, the standby's leader, an
agent, the Celery worker, valkey, nats-server -- and it comes back (a new pid in ``pids.json``) and the
system serves jobs again; a job running when ``coorm up`` stops is told why; a child that keeps dying makes
``coorm up`` give up. Real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import deque

import pytest

from coorm.cli.supervise import Backoff, pid_alive, spawn
from tests.e2e.processes import interrupt, wait_for

COORM = [sys.executable, "-m", "coorm.cli.main"]
# every child, in the order they are killed (the standby is killed last among the engines: by then the
# first engine's successor leads or stands by)
CHILDREN = ("policy-engine", "node-allocator", "view-publisher", "accounting", "celery-worker", "agent-c0",
            "policy-engine-standby", "valkey", "nats-server")


@pytest.fixture
def up(tmp_path):
    conn = tmp_path / "connection.json"
    env = dict(os.environ, COORM_CONNECTION_FILE=str(conn), COORM_RESCHEDULE_INTERVAL="0.05",
               COORM_FAIR_START="0", COORM_KILL_GRACE="0.5")
    env.pop("COORM_NATS_URL", None)
    env.pop("COORM_REDIS_URL", None)
    work = tmp_path / "work"
    with open(tmp_path / "up.log", "wb") as out:
        proc = subprocess.Popen([*COORM, "up", "--clusters", "c0=4", "--workdir", str(work)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: conn.exists() or proc.poll() is not None, 90, "coorm up to write its connection file")
        if proc.poll() is not None:
            pytest.fail(f"coorm up exited: {(tmp_path / 'up.log').read_text()}")
        user_env = dict(env)
        yield proc, user_env, work
    finally:
        interrupt(proc)


def _pids(work) -> dict[str, int]:
    return json.loads((work / "pids.json").read_text())


def _job(env, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*COORM, "submit", "-c", "c0", "-N", "2", "-t", "1m", "--", *command], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_child_killed_comes_back_and_jobs_run_again(up):
    proc, env, work = up
    assert set(_pids(work)) == set(CHILDREN)
    recovery = {}
    for name in CHILDREN:
        old = _pids(work)[name]
        t0 = time.monotonic()
        os.kill(old, signal.SIGKILL)
        new = wait_for(lambda name=name, old=old: (p := _pids(work)[name]) != old and pid_alive(p) and p, 30,
                       f"{name} to be started again")
        r = _job(env, "sh", "-c", "exit 0")
        recovery[name] = round(time.monotonic() - t0, 2)
        assert r.returncode == 0, (name, r.stderr)
        assert new != old and proc.poll() is None
    print("\nkilled -> a job ran again, seconds:", json.dumps(recovery))
    assert all(t < 30 for t in recovery.values()), recovery
    log = (work / "supervisor.log").read_text()
    assert all(f"{name} killed by SIGKILL" in log for name in CHILDREN), log


def test_a_job_running_when_coorm_up_stops_is_told_why(up):
    proc, env, work = up
    job = subprocess.Popen([*COORM, "submit", "-c", "c0", "-N", "2", "-t", "5m", "--", "sleep", "300"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        conn = env["COORM_CONNECTION_FILE"]
        wait_for(lambda: "started" in subprocess.run([*COORM, "requests", "--json"], env=env, capture_output=True,
                                                     text=True).stdout, 30, "the job to start")
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = job.communicate(timeout=60)
        assert job.returncode == 3 and "CooRM is stopping: coorm up was stopped (SIGTERM)" in err, err
        assert proc.wait(60) == 0
        assert not os.path.exists(conn)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_a_child_that_keeps_dying_is_beyond_repair(tmp_path):
    """A child whose every restart dies at once: at more than ``limit`` deaths within the window,
    supervision gives up (``coorm up`` then stops everything and exits 1)."""
    from coorm.cli.up import Up

    env = {"COORM_RESCHEDULE_INTERVAL": "0.05", "COORM_CONNECTION_FILE": str(tmp_path / "none.json")}
    with Up({"c0": 1}, tmp_path / "work", env=env, accounting=False, write_connection=False) as up:
        up.backoff = Backoff(first=0.05, cap=0.2, limit=4, window=60)
        child = up.children["view-publisher"]
        child.start = lambda: spawn(["sh", "-c", "exit 3"], env=dict(os.environ), log=tmp_path / "crash.log")
        child.proc.kill()
        deadline = time.monotonic() + 30
        while up.supervise():
            assert time.monotonic() < deadline, "supervision never gave up"
            time.sleep(0.02)  # the supervisor's own loop: a look every few milliseconds
        assert up.failed is not None and "view-publisher exited with code 3 5 times" in up.failed
        assert child.restarts == 4  # the fifth death within the window is one too many
        assert all(c.alive() for name, c in up.children.items() if name != "view-publisher")


def test_backoff_doubles_resets_after_a_stable_run_and_gives_up():
    b = Backoff(first=0.5, cap=4.0, stable=30.0, limit=3, window=60.0)
    deaths: deque[float] = deque()
    assert b.delay(deaths, started=0.0, now=1.0, previous=None) == 0.5
    assert b.delay(deaths, started=1.5, now=2.0, previous=0.5) == 1.0
    assert b.delay(deaths, started=3.0, now=3.5, previous=1.0) == 2.0
    assert b.delay(deaths, started=4.0, now=5.0, previous=2.0) == 4.0
    assert b.delay(deaths, started=9.0, now=10.0, previous=4.0) == 4.0  # capped
    assert b.delay(deaths, started=10.0, now=100.0, previous=4.0) == 0.5  # it stayed up 90 s: from the start
    deaths.extend([1.0, 2.0, 3.0])
    assert b.delay(deaths, started=3.5, now=4.0, previous=2.0) is None  # 3 deaths within the minute
    assert b.delay(deaths, started=70.0, now=70.0, previous=2.0) == 4.0  # they are more than a minute old
