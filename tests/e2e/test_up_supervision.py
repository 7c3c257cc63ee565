"""``coorm up`` supervises what it starts: SIGKILL any of its children -- the leading policy engine, a service,
an agent, the Celery worker, the standby, valkey, nats-server -- and it comes back (a new pid in
``pids.json``) and the system serves jobs again; every application connected when ``coorm up`` stops is told
why; a child that keeps dying makes ``coorm up`` give up and exit non-zero; a signal while it starts stops
what it started. Real processes throughout."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import deque
from pathlib import Path
from urllib.parse import urlparse

import pytest

from coorm.cli.supervise import Backoff, pid_alive, spawn
from tests.e2e.processes import interrupt, wait_for

COORM = [sys.executable, "-m", "coorm.cli.main"]
# every child, in the order they are killed: "leader" and "standby" are the policy engines leading and
# standing by at the moment of the kill (the standby is killed last among the engines: by then the first
# leader's successor leads and the restarted first leader stands by)
ORDER = ("leader", "node-allocator", "view-publisher", "accounting", "batch", "celery-worker", "agent-c0",
         "standby", "valkey", "nats-server")
ENGINES = ("policy-engine", "policy-engine-standby")
SERVERS = ("valkey", "nats-server")


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


def _batch_job(env, work) -> subprocess.CompletedProcess:
    """A batch job, queued and run to its end: the history says completed (or the job's failure)."""
    r = subprocess.run([*COORM, "submit", "--no-wait", "-c", "c0", "-N", "1", "-t", "1m", "--", "true"], env=env,
                       capture_output=True, text=True, timeout=60, cwd=work)
    if r.returncode != 0:
        return r
    job = r.stdout.split()[-1]

    def ended():
        out = subprocess.run([*COORM, "history", "--json"], env=env, capture_output=True, text=True, timeout=30)
        return [x for x in json.loads(out.stdout or "[]") if x["id"] == job]

    (rec,) = wait_for(ended, 60, f"batch job {job} to end")
    return subprocess.CompletedProcess(r.args, 0 if rec["state"] == "completed" else 1, json.dumps(rec), "")


def _urls(env) -> dict[str, str]:
    return json.loads(open(env["COORM_CONNECTION_FILE"]).read())


def _as_user(env) -> dict:
    """nats-py's arguments to connect as this user (coorm up's credential store has their identity)."""
    import getpass

    from coorm.shared.credentials import CredentialStore

    me = CredentialStore(Path(_urls(env)["credentials_dir"])).user(getpass.getuser())
    return {"nkeys_seed_str": me.seed, "inbox_prefix": me.inbox_prefix}


def _listens(url: str) -> bool:
    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname, u.port), timeout=0.5):
            return True
    except OSError:
        return False


def _leading(work) -> str | None:
    """Which policy engine leads (only the leader's metrics say ``coorm_policy_leader 1.0``)."""
    targets = {t["labels"]["job"]: t["targets"][0] for t in json.loads((work / "prometheus-targets.json").read_text())}
    for name in ENGINES:
        try:
            with urllib.request.urlopen(f"http://{targets[name]}/metrics", timeout=2) as r:  # noqa: S310 - local
                if "coorm_policy_leader 1.0" in r.read().decode():
                    return name
        except OSError:
            continue  # (dead, or not serving its metrics yet)
    return None


@pytest.mark.slow
def test_every_child_killed_comes_back_and_jobs_run_again(up):
    proc, env, work = up
    assert set(_pids(work)) == {*ENGINES, *(n for n in ORDER if n not in ("leader", "standby"))}
    urls = _urls(env)
    back, serving, killed = {}, {}, []
    for role in ORDER:
        name = role
        if role in ("leader", "standby"):
            leader = wait_for(lambda: _leading(work), 30, "a policy engine to lead")
            name = leader if role == "leader" else next(e for e in ENGINES if e != leader)
        old = _pids(work)[name]
        killed.append(name)
        t0 = time.monotonic()
        os.kill(old, signal.SIGKILL)
        # back: a new process (a server: listening again on the same port)
        new = wait_for(lambda name=name, old=old: (p := _pids(work)[name]) != old and pid_alive(p) and p, 30,
                       f"{name} to be started again")
        if name in SERVERS:
            wait_for(lambda name=name: _listens(urls["redis_url" if name == "valkey" else "nats_url"]), 30,
                     f"{name} to listen again")
        back[role] = round(time.monotonic() - t0, 2)
        # serving: a job submitted now runs to its end (the batch service: a batch job)
        r = _batch_job(env, work) if name == "batch" else _job(env, "sh", "-c", "exit 0")
        serving[role] = round(time.monotonic() - t0, 2)
        assert r.returncode == 0, (role, r.stderr)
        assert new != old and proc.poll() is None
    print("\nkilled -> started again, seconds:", json.dumps(back))
    print("killed -> a job ran again, seconds:", json.dumps(serving))
    assert all(t < 30 for t in serving.values()), serving  # (generous: the speed is measured, not asserted)
    assert _urls(env) == urls  # the same servers' addresses throughout
    st = json.loads(subprocess.run([*COORM, "status", "--json"], env=env, capture_output=True, text=True,
                                   timeout=30).stdout)
    assert [(c["cluster"], c["up"]) for c in st["clusters"]] == [("c0", 4)], st
    log = (work / "supervisor.log").read_text()
    assert all(log.count(f"{name} killed by SIGKILL") == killed.count(name) for name in _pids(work)), log


@pytest.mark.parametrize("victim", ["nats-server", "batch"])
def test_an_attached_submit_rides_over_a_restart_and_exits_with_its_job_s_code(up, victim):
    """``coorm submit`` (the fast path: a batch job attached to the command) while nats-server or the batch
    service is SIGKILLed and started again: the job goes on, and the command still exits with its code
    (nats-server: it connects again and asks the history; the batch service: the next instance tells it)."""
    proc, env, work = up
    gate = work / f"gate-{victim}"
    job = subprocess.Popen([sys.executable, "-m", "coorm.cli.fast", "submit", "-c", "c0", "-N", "1", "-t", "5m", "--",
                            "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done; echo through; exit 5"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: '"started"' in subprocess.run([*COORM, "requests", "--json"], env=env, capture_output=True,
                                                       text=True).stdout, 30, "the job to start")
        old = _pids(work)[victim]
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: (p := _pids(work)[victim]) != old and pid_alive(p), 30, f"{victim} to be started again")
        if victim == "nats-server":
            wait_for(lambda: _listens(_urls(env)["nats_url"]), 30, "nats-server to listen again")
        gate.touch()  # (at once: the process exits while the services may still be reconnecting)
        _, err = job.communicate(timeout=90)
        assert job.returncode == 5, err
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_every_connected_application_is_told_why_coorm_up_stops(up):
    """A bare NATS subscriber gets ``SystemStopping`` with the reason; a job running through the SDK
    (``coorm submit``) ends with exit code 3 and says why; then ``coorm up`` exits 0."""
    import nats

    from coorm.shared import bus, subjects
    from coorm.shared.protocol import SystemStopping

    proc, env, work = up
    # through the full command line (an SDK session of its own) and the coorm script's fast path (a batch job
    # attached to the command)
    jobs = [subprocess.Popen([*entry, "submit", "-c", "c0", "-N", "2", "-t", "5m", "--", "sleep", "300"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for entry in (COORM, [sys.executable, "-m", "coorm.cli.fast"])]

    async def listen_then_stop() -> SystemStopping:
        nc = await nats.connect(_urls(env)["nats_url"], allow_reconnect=False, **_as_user(env))
        try:
            sub = await nc.subscribe(subjects.SYSTEM_STOPPING)
            await bus.settled(nc)  # subscribed before coorm up is asked to stop
            os.killpg(proc.pid, signal.SIGTERM)
            msg = await sub.next_msg(timeout=30)
            return bus.decode(msg.data, SystemStopping)
        finally:
            await nc.close()

    try:
        conn = env["COORM_CONNECTION_FILE"]
        wait_for(lambda: subprocess.run([*COORM, "requests", "--json"], env=env, capture_output=True,
                                        text=True).stdout.count('"started"') == 2, 30, "both jobs to start")
        told = asyncio.run(listen_then_stop())
        assert told.reason == "coorm up was stopped (SIGTERM)"
        for job in jobs:
            _, err = job.communicate(timeout=60)
            assert job.returncode == 3 and "CooRM is stopping: coorm up was stopped (SIGTERM)" in err, err
        assert proc.wait(60) == 0
        assert not os.path.exists(conn)
        assert not [n for n, p in _pids(work).items() if pid_alive(p)]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
                job.wait()


@pytest.mark.slow
def test_coorm_up_exits_non_zero_when_a_child_cannot_be_repaired(up):
    """valkey's append-only manifest made unreadable, then valkey killed: every restart exits at once, and
    after the sixth death within a minute ``coorm up`` stops everything, tells the applications, and exits
    1 with the reason on one line."""
    import nats

    from coorm.shared import bus, subjects
    from coorm.shared.protocol import SystemStopping

    proc, env, work = up
    manifest = work / "servers" / "appendonlydir" / "appendonly.aof.manifest"
    with open(manifest, "a") as f:  # (valkey reads it only when it starts)
        f.write("not a manifest line\n")

    async def kill_and_listen() -> SystemStopping:
        nc = await nats.connect(_urls(env)["nats_url"], **_as_user(env))
        try:
            sub = await nc.subscribe(subjects.SYSTEM_STOPPING)
            await bus.settled(nc)
            os.kill(_pids(work)["valkey"], signal.SIGKILL)
            msg = await sub.next_msg(timeout=90)  # the back-offs: 0.5 + 1 + 2 + 4 + 8 s
            return bus.decode(msg.data, SystemStopping)
        finally:
            await nc.close()

    told = asyncio.run(kill_and_listen())
    assert proc.wait(60) == 1
    last = (work.parent / "up.log").read_text().strip().splitlines()[-1]
    assert last.startswith("coorm up could not repair itself: valkey exited with code 1 6 times within 60 s;"), last
    assert told.reason.startswith("coorm up could not repair itself: valkey exited with code 1"), told.reason
    assert not [n for n, p in _pids(work).items() if pid_alive(p)]
    assert (work / "supervisor.log").read_text().count("valkey started again") == 5


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_starting_stops_what_started(tmp_path, sig):
    """Ctrl-C (or SIGTERM) before the system is up: what was started is stopped (the children are in
    sessions of their own: nothing else would end them), and ``coorm up`` exits 0."""
    env = dict(os.environ, COORM_CONNECTION_FILE=str(tmp_path / "connection.json"))
    work = tmp_path / "work"
    with open(tmp_path / "up.log", "wb") as out:
        proc = subprocess.Popen([*COORM, "up", "--clusters", "c0=2", "--workdir", str(work)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = wait_for(lambda: (work / "pids.json").exists() and "policy-engine" in _pids(work) and _pids(work),
                           60, "coorm up to start its first service")
        os.killpg(proc.pid, sig)
        assert proc.wait(60) == 0, (tmp_path / "up.log").read_text()
        assert "CooRM is up" not in (tmp_path / "up.log").read_text()  # (it was stopped while starting)
        assert started.keys() <= _pids(work).keys()
        assert not [n for n, p in _pids(work).items() if pid_alive(p)]
        assert not (tmp_path / "connection.json").exists()
    finally:
        interrupt(proc)
        for pid in _pids(work).values() if (work / "pids.json").exists() else ():
            if pid_alive(pid):  # (what a failed run left: the processes this test started, by pid)
                os.killpg(pid, signal.SIGKILL)


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
