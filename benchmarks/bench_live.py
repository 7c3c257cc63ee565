"""The live system's speed, on the embedded default (``coorm up``'s servers, services and agents as
separate processes), with N concurrent launchers (one process here, one NATS connection each):

* request -> startNotify latency on an idle cluster (p50, p99), beside the re-scheduling interval: with
  the N launchers' requests arriving one by one (a Poisson stream from random launchers, each request done
  once started), and with all N asking at the same moment (a burst: the last waits for the N-1 before it);
* rigid-job throughput: sessions that open, request one node, run a trivial command (``true``) through the
  node's agent, wait for its exit, ``done`` and close -- submitted and completed jobs per second; and the
  same jobs submitted one after the other in each of the N launchers' sessions (a workflow manager);
* notification bytes per application (CooRM §IV-B reports 175 KB per application for its CORBA RMS).

    python benchmarks/bench_live.py              # N = 10, 100, 1000
    python benchmarks/bench_live.py --n 10 100   # fewer
    python benchmarks/bench_live.py --n 100 1000 --only latency   # the latency rows alone
    python benchmarks/bench_live.py --n 100 --only latency --tap   # and the messages per subject
    python benchmarks/bench_live.py --n 5000 --nodes 10000 --workers 4
                                                  # the sessions spread over 4 more processes

With ``--workers K`` the other N - 100 sessions are opened, heartbeat and receive their views in K worker
processes (this one process cannot run 5,000 launchers: it was busy in 880 of 896 samples and printed
nothing in 12 minutes): the one-by-one latency is measured from the 100 sessions of this process; in the
burst every session asks at once, each timed in its own process; the throughput runs' N launchers are
spread alike. The workers' CPU is counted as the launchers'.

Beside the latencies, the CPU milliseconds each process of the system (and this one, the launchers) spent
per request over the two latency runs -- from the first request to the last, the sessions open (their
heartbeats and views included, their openings and closings not) -- read from ``/proc/PID/stat`` of the
processes ``coorm up`` started (with their descendants): where a request's cost goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coorm.cli.up import Up  # noqa: E402
from coorm.launchers.sdk import Session  # noqa: E402
from coorm.shared.requests import RequestSpec  # noqa: E402

INTERVAL = 0.01
IDLE_WINDOW = 6.0  # seconds with every session open and no request: what the sessions alone cost


_TICK = os.sysconf("SC_CLK_TCK")


def family(subject: str) -> str:
    """A subject with its application, node, user and inbox names starred: what the counts are kept by."""
    t = subject.split(".")
    if t[0] == "_INBOX":
        return "_INBOX.* (replies)"
    if len(t) > 4 and t[2] == "app":
        t[3:5] = ["*", "*"]
        if len(t) > 6 and t[5] == "output":
            t[6:] = ["*"]
    elif len(t) > 3 and t[2] == "node":
        t[3] = "*"
        if len(t) > 5:
            t[5:] = ["*"]
    return ".".join(t)


def _covers(a: str, b: str) -> bool:
    """Whether every subject NATS pattern ``b`` matches, ``a`` matches."""
    ta, tb = a.split("."), b.split(".")
    for i, x in enumerate(ta):
        if x == ">":
            return len(tb) > i
        if i >= len(tb) or (x != "*" and x != tb[i]) or (x == "*" and tb[i] == ">"):
            return False
    return len(ta) == len(tb)


class Tap:
    """Every message on the bus during the latency runs (a subscription to everything, with the services'
    identity), counted by subject family: the messages and bytes a request costs, per subject."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.bytes: dict[str, int] = {}
        self.on = False
        self.seconds = 0.0  # how long it counted
        self._since = 0.0

    async def close(self) -> None:
        from coorm.shared import bus

        for nc in getattr(self, "conns", []):
            await bus.shutdown(nc)

    def switch(self) -> None:
        now = time.perf_counter()
        if self.on:
            self.seconds += now - self._since
        self.on, self._since = not self.on, now

    async def start(self, up: Up) -> None:
        """No identity may read everything: each role's connection subscribes to what that role may read
        (the launchers' as this user, whose sessions these are), a pattern another one covers left out, so
        that a message is counted once. Stream messages are counted as their consumers get them (inboxes)."""
        import getpass

        from coorm.shared import bus
        from coorm.shared.credentials import CredentialStore
        from coorm.shared.endpoints import Role, permissions

        assert up.settings is not None and up.servers is not None
        store = CredentialStore(up.servers.credentials)
        user = getpass.getuser()
        grants = [(store.role(Role.SERVICE), permissions(Role.SERVICE)),
                  (store.role(Role.AGENT), permissions(Role.AGENT)),
                  (store.user(user), permissions(Role.LAUNCHER, user))]
        taken: dict[str, int] = {}  # pattern -> the grant it is read with
        for k, (_, perms) in enumerate(grants):
            for pattern in perms.subscribe:
                if not any(_covers(t, pattern) for t in taken):
                    taken = {t: g for t, g in taken.items() if not _covers(pattern, t)}
                    taken[pattern] = k

        async def seen(msg) -> None:
            if self.on:
                f = family(msg.subject)
                self.count[f] = self.count.get(f, 0) + 1
                self.bytes[f] = self.bytes.get(f, 0) + len(msg.data)

        self.conns = []
        for k, (identity, _) in enumerate(grants):
            nc = await bus.connect(up.settings.nats_url, "bench-tap", identity)
            self.conns.append(nc)
            for pattern, g in sorted(taken.items()):
                if g == k:
                    await nc.subscribe(pattern, cb=seen)
            await nc.flush()

    def table(self, requests: int) -> str:
        rows = sorted(self.count.items(), key=lambda kv: -kv[1])
        per, secs = max(requests, 1), max(self.seconds, 1e-9)
        lines = [f"       messages over {requests} requests in {self.seconds:.1f} s: "
                 f"{sum(self.count.values()) / per:.1f} a request, {sum(self.count.values()) / secs:,.0f}/s"]
        lines += [f"         {f:<40} {c / per:8.2f} msg/request {c / secs:8.1f}/s {self.bytes[f] / per:9.0f} B/request"
                  for f, c in rows[:16]]
        self.count, self.bytes, self.seconds = {}, {}, 0.0
        return "\n".join(lines)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its reaped children (``/proc/PID/stat``, fields 14-17),
    0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def cpu_by_process(up: Up) -> dict[str, float]:
    """CPU seconds so far of each process ``coorm up`` started (its live descendants added in: an agent's
    spawner), and of this one (the launchers)."""
    out: dict[str, float] = {}
    for name, child in up.children.items():
        if child.pid is None:
            continue
        total, todo = 0.0, [child.pid]
        while todo:
            pid = todo.pop()
            total += cpu_seconds(pid)
            todo.extend(children_of(pid))
        out[name] = total
    t = os.times()
    out["launchers (bench)"] = t.user + t.system
    if _workers:
        out["launchers (workers)"] = sum(cpu_seconds(w.pid) for w in _workers)
    return out


MEASURING = 100  # with --workers: the sessions of this process, whose requests are timed
OPENING = 50  # sessions a process opens at once (see open_sessions)
OPENING_JOBS = 250  # ... and at most, all processes together, in the throughput run (see throughput)
_workers: list[asyncio.subprocess.Process] = []  # the worker processes holding the other sessions
_shares: list[int] = []  # ... and how many each holds


async def start_workers(settings, sessions: int, workers: int) -> None:
    """``workers`` processes holding ``sessions`` open sessions between them (``--worker``), once each has
    opened its share and received its views."""
    env = {**os.environ, "COORM_BENCH_SETTINGS": settings.model_dump_json()}
    share = [sessions // workers + (i < sessions % workers) for i in range(workers)]
    for i, k in enumerate(share):
        if k:
            _workers.append(await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--worker", str(k), "--worker-name", f"w{i}.", env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True))
            _shares.append(k)
    for w in _workers:
        assert w.stdout is not None
        line = await asyncio.wait_for(w.stdout.readline(), 600)
        if line.strip() != b"ready":
            raise RuntimeError(f"a worker failed to open its sessions (exit {await w.wait()})")


async def stop_workers() -> None:
    """Their sessions closed, the workers exit (end of their standard input); killed by group if not."""
    for w in _workers:
        if w.stdin is not None:
            w.stdin.close()
    for w in _workers:
        try:
            await asyncio.wait_for(w.wait(), 120)
        except TimeoutError:
            os.killpg(w.pid, signal.SIGKILL)
            await w.wait()
    _workers.clear()
    _shares.clear()


async def ask(command: str, timeout: float = 900.0) -> list[dict]:
    """Send ``command`` (a line) to every worker at once; the answer of each, a JSON line."""
    import json

    for w in _workers:
        assert w.stdin is not None
        w.stdin.write(f"{command}\n".encode())
    await asyncio.gather(*(w.stdin.drain() for w in _workers if w.stdin is not None))
    out = []
    for w in _workers:
        assert w.stdout is not None
        line = await asyncio.wait_for(w.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"a worker ended before answering {command!r} (exit {await w.wait()})")
        out.append(json.loads(line))
    return out


async def worker(count: int, name: str) -> None:
    """A worker process: ``count`` open sessions, heartbeating and receiving their views; then, a line at a time
    on its standard input, ``burst K`` (each of them asks for a node at once: the latencies), ``close`` (they
    close), ``open`` (``count`` sessions again), ``submit J L`` (``count`` launchers run J jobs each, a session
    per job, L opening at a time: :func:`throughput`) and ``in-session J`` (each open session runs J jobs:
    :func:`throughput_in_session`), each answered by a JSON line, until its standard input ends; then it
    closes what is still open."""
    import json

    from coorm.shared.settings import Settings

    settings = Settings.model_validate_json(os.environ["COORM_BENCH_SETTINGS"])
    sessions = await open_sessions(settings, count, name)
    await asyncio.gather(*(s.wait_views() for s in sessions))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        verb, *rest = line.split()
        answer: dict = {}
        if verb == "burst":
            answer = {"latencies": await burst(sessions, int(rest[0]))}
        elif verb == "close":
            await asyncio.gather(*(s.close() for s in sessions))
            sessions = []
        elif verb == "open":
            sessions = await open_sessions(settings, count, f"{name}ts")
        elif verb == "submit":
            answer = await throughput(settings, count, int(rest[0]), int(rest[1]), name)
        elif verb == "in-session":
            answer = await throughput_in_session(sessions, int(rest[0]))
        else:
            raise SystemExit(f"a worker was asked {line!r}")
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    await asyncio.gather(*(s.close() for s in sessions))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def open_sessions(settings, n: int, name: str, at_once: int = OPENING) -> list[Session]:
    """N rigid launchers' sessions, opened ``at_once`` at a time, an opening that could not connect tried
    again: a thousand NATS connections opened in the same instant overrun the 3 s connect timeout on a
    loaded 2-core machine (what is measured is the latency with N sessions open, not the stampede of their
    openings)."""
    from coorm.shared.bus import Unreachable

    async def one(i: int) -> Session:
        for attempt in range(3):
            try:
                return await Session.open(settings, kind="rigid", name=f"{name}{i}", preemptive_views=False)
            except Unreachable:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    out: list[Session] = []
    for k in range(0, n, at_once):
        out += await asyncio.gather(*(one(i) for i in range(k, min(n, k + at_once))))
    return out


async def latency_idle(sessions: list[Session], n: int, cpu: Callable[[], dict[str, float]],
                       cpu_of: Callable[[], dict[str, float]], samples: int = 200, rate: float = 25.0) -> dict:
    """N launchers with open sessions (receiving their views); requests arrive at ``rate`` a second in all,
    each from a random one of ``sessions`` (with workers: this process's MEASURING; the others are the
    workers'), and each is done once started: the time from request to start."""
    rng = random.Random(n)
    # what N open sessions cost with no request at all (heartbeats, mostly): CPU a second, per process
    quiet0, t0 = cpu_of(), time.perf_counter()
    await asyncio.sleep(IDLE_WINDOW)  # the window measured, not a synchronisation
    quiet1, dt = cpu_of(), time.perf_counter() - t0
    lat: list[float] = []
    cpu0 = cpu()

    async def one(s: Session, k: int) -> None:
        t = time.perf_counter()
        (rid,) = await s.request(RequestSpec(id=s.rid(f"i{k}"), cluster="c0", nodes=1, duration=600))
        await s.wait_start(rid, 60)
        lat.append(time.perf_counter() - t)
        await s.done(rid)

    tasks = []
    for k in range(samples):
        tasks.append(asyncio.create_task(one(rng.choice(sessions), k)))
        await asyncio.sleep(rng.expovariate(rate))  # the arrival process itself, not a synchronisation
    await asyncio.gather(*tasks)
    cpu1 = cpu()
    return {"p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99), "requests": len(lat),
            "cpu": {k: cpu1.get(k, 0.0) - v for k, v in cpu0.items()},
            "quiet": {k: (quiet1.get(k, 0.0) - v) / dt for k, v in quiet0.items()}}


BURST_PATIENCE = 600.0  # seconds a request of a burst may wait for its start (5,000 at once take tens)


async def burst(sessions: list[Session], k: int) -> list[float]:
    """Each of ``sessions`` asks for one node at the same moment: the time from each request to its start;
    then each is done."""

    async def one(s: Session) -> float:
        t = time.perf_counter()
        (rid,) = await s.request(RequestSpec(id=s.rid(f"r{k}"), cluster="c0", nodes=1, duration=600))
        await s.wait_start(rid, BURST_PATIENCE)
        return time.perf_counter() - t

    lat = list(await asyncio.gather(*(one(s) for s in sessions)))
    await asyncio.gather(*(s.done(s.rid(f"r{k}")) for s in sessions))
    return lat


async def latency(sessions: list[Session], n: int, cpu: Callable[[], dict[str, float]], samples: int = 200) -> dict:
    """N launchers each ask for one node at the same moment -- ``sessions`` here, the rest in the workers
    (whose requests are fired as these are, at a line from this process) -- the time from each request to its
    start. Rounds repeat until there are ``samples`` measurements (a p99 of 10 is no p99)."""
    lat: list[float] = []
    cpu0 = cpu()
    for k in range(max(1, -(-samples // n))):
        here, there = await asyncio.gather(burst(sessions, k), ask(f"burst {k}", BURST_PATIENCE + 300))
        lat += here + [x for answer in there for x in answer["latencies"]]
        await asyncio.sleep(2 * INTERVAL)  # the next round starts on an idle cluster, after a pass
    cpu1 = cpu()
    return {"p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99), "requests": len(lat),
            "cpu": {k: cpu1.get(k, 0.0) - v for k, v in cpu0.items()}}


async def throughput(settings, n: int, jobs_per_launcher: int, opening: int, name: str = "tp") -> dict:
    """N launchers, each running ``jobs_per_launcher`` rigid jobs one after the other, a session per job (as
    ``coorm submit``): the jobs completed and each session's notification bytes. At most ``opening`` sessions
    of this process open at a time (OPENING_JOBS over all the processes): with more, the launchers' own event
    loops answered nats-server's handshake after the 3 s connect timeout (1,225 launchers of each worker and
    100 here opening at once, or 250 of each: "cannot reach CooRM")."""
    sizes: list[int] = []
    at_once = asyncio.Semaphore(opening)

    async def launcher(i: int) -> int:
        done = 0
        for j in range(jobs_per_launcher):
            async with at_once:
                s = await Session.open(settings, kind="rigid", name=f"{name}{i}.{j}", preemptive_views=False)
            (rid,) = await s.request(RequestSpec(id=s.rid("j"), cluster="c0", nodes=1, duration=600))
            start = await s.wait_start(rid, BURST_PATIENCE)
            await s.launch(rid, start.nodes[0], ["true"])
            (ex,) = await s.wait_exits(rid, 1, BURST_PATIENCE)
            await s.done(rid)
            await s.close()
            sizes.append(s.stats.notification_bytes)
            done += ex.code == 0
        return done

    return {"completed": sum(await asyncio.gather(*(launcher(i) for i in range(n)))), "sizes": sizes}


async def throughput_in_session(sessions: list[Session], jobs_per_launcher: int) -> dict:
    """N launchers (one session each, as a workflow manager or a job array's launcher, opened beforehand), each
    running ``jobs_per_launcher`` rigid jobs one after the other: request one node, launch ``true``, wait for
    its exit, done. The jobs completed."""

    async def launcher(s: Session) -> int:
        done = 0
        for j in range(jobs_per_launcher):
            (rid,) = await s.request(RequestSpec(id=s.rid(f"j{j}"), cluster="c0", nodes=1, duration=600))
            start = await s.wait_start(rid, BURST_PATIENCE)
            await s.launch(rid, start.nodes[0], ["true"])
            (ex,) = await s.wait_exits(rid, 1, BURST_PATIENCE)
            await s.done(rid)
            done += ex.code == 0
        return done

    return {"completed": sum(await asyncio.gather(*(launcher(s) for s in sessions)))}


async def jobs_per_second(settings, here: int, jobs_per_launcher: int, in_session: bool) -> dict:
    """:func:`throughput` (or :func:`throughput_in_session`, its sessions opened before the clock starts) with
    ``here`` launchers in this process and the workers' shares in theirs, all at once: jobs completed and
    submitted a second over the whole run."""
    sessions: list[Session] = []
    if in_session:
        sessions = await open_sessions(settings, here, "ts")
        await ask("open")
    t = time.perf_counter()
    if in_session:
        mine, theirs = await asyncio.gather(throughput_in_session(sessions, jobs_per_launcher),
                                            ask(f"in-session {jobs_per_launcher}"))
    else:
        opening = max(1, OPENING_JOBS // (1 + len(_workers)))
        mine, theirs = await asyncio.gather(throughput(settings, here, jobs_per_launcher, opening),
                                            ask(f"submit {jobs_per_launcher} {opening}"))
    dt = time.perf_counter() - t
    await asyncio.gather(*(s.close() for s in sessions), ask("close"))
    answers = [mine, *theirs]
    total = (here + sum(_shares)) * jobs_per_launcher
    completed = sum(a["completed"] for a in answers)
    sizes = [x for a in answers for x in a.get("sizes", [])]
    return {"jobs": total, "completed": completed, "seconds": dt, "completed_per_s": completed / dt,
            "submitted_per_s": total / dt, "bytes_per_app_mean": statistics.mean(sizes) if sizes else 0.0,
            "bytes_per_app_max": max(sizes, default=0)}


def _role(process: str) -> str:
    """The policy engine's two processes count as one: either may be the leader (under load a lease may
    pass to the standby during a run)."""
    return "policy-engine (+standby)" if process.startswith("policy-engine") else process


def cpu_table(runs: list[dict]) -> str:
    """CPU ms per request of each process over the latency runs' requests (sessions open, views received:
    their openings and closings are not counted)."""
    requests = sum(r["requests"] for r in runs)
    spent: dict[str, float] = {}
    for r in runs:
        for k, v in r["cpu"].items():
            k = _role(k)
            spent[k] = spent.get(k, 0.0) + v
    rows = sorted(((v / max(requests, 1), k) for k, v in spent.items() if v > 0), reverse=True)
    total = sum(v for v, _ in rows)
    lines = [f"       CPU ms per request over {requests} requests (latency runs, sessions open): "
             f"total {1000 * total:.1f}"]
    lines += [f"         {k:<24} {1000 * v:8.2f}" for v, k in rows[:8]]
    return "\n".join(lines)


async def run(ns: list[int], nodes: int, jobs: int, only: str = "all", args_tap: bool = False,
              workers: int = 0) -> None:
    env = {"COORM_RESCHEDULE_INTERVAL": str(INTERVAL), "COORM_FAIR_START": "0", "COORM_LOG_LEVEL": "WARNING",
           "COORM_SESSION_TIMEOUT": "120"}
    up = Up({"c0": nodes}, env=env, write_connection=False, accounting=False)
    _started.append(up)
    settings = await asyncio.to_thread(up.start, 120)
    tap = Tap()
    try:
        if args_tap:
            await tap.start(up)
        print(f"embedded system: 1 cluster of {nodes} emulated nodes, re-scheduling interval {INTERVAL * 1000:g} ms")
        print("done/s: a session per job (as coorm submit); in-session: N launchers' sessions, jobs one after "
              "the other in each")
        print("latency: one by one (25 requests/s in all) and burst (all N at once), p50/p99 in ms")
        print(f"{'N':>6} {'p50':>6} {'p99':>6} {'burst50':>8} {'burst99':>8} {'jobs':>6} {'done/s':>8} "
              f"{'submitted/s':>12} {'in-session/s':>13} {'bytes/app':>10} {'max':>8}")
        for n in ns:
            def cpu() -> dict[str, float]:
                tap.switch()  # (called as the requests start, and as they end)
                return cpu_by_process(up)

            spread = workers > 0 and n > MEASURING
            here = MEASURING if spread else n
            if spread:
                await start_workers(settings, n - MEASURING, workers)
            sessions = await open_sessions(settings, here, "idle")
            await asyncio.gather(*(s.wait_views() for s in sessions))
            idle = await latency_idle(sessions, n, cpu, lambda: cpu_by_process(up))
            lat = await latency(sessions, n, cpu)
            await asyncio.gather(*(s.close() for s in sessions), ask("close"))
            if only == "latency":
                print(f"{n:>6} {idle['p50_ms']:>6.1f} {idle['p99_ms']:>6.1f} {lat['p50_ms']:>8.1f} "
                      f"{lat['p99_ms']:>8.1f}" + (f"  ({here} sessions here, {n - here} in {workers} workers)"
                                                  if spread else ""), flush=True)
            else:
                tp = await jobs_per_second(settings, here, max(1, jobs // n), in_session=False)
                ts = await jobs_per_second(settings, here, max(1, jobs // n), in_session=True)
                print(f"{n:>6} {idle['p50_ms']:>6.1f} {idle['p99_ms']:>6.1f} {lat['p50_ms']:>8.1f} "
                      f"{lat['p99_ms']:>8.1f} {tp['jobs']:>6} {tp['completed_per_s']:>8.1f} "
                      f"{tp['submitted_per_s']:>12.1f} {ts['completed_per_s']:>13.1f} "
                      f"{tp['bytes_per_app_mean']:>10.0f} {tp['bytes_per_app_max']:>8}"
                      + (f"  ({here} launchers here, {n - here} in {workers} workers)" if spread else ""),
                      flush=True)
                if tp["completed"] < tp["jobs"] or ts["completed"] < ts["jobs"]:
                    print(f"       jobs that did not complete: {tp['jobs'] - tp['completed']} a session each, "
                          f"{ts['jobs'] - ts['completed']} in-session", flush=True)
            await stop_workers()
            print(cpu_table([idle, lat]), flush=True)
            per_role: dict[str, float] = {}
            for k, v in idle["quiet"].items():
                per_role[_role(k)] = per_role.get(_role(k), 0.0) + v
            quiet = sorted(((v, k) for k, v in per_role.items() if v > 0), reverse=True)
            print(f"       CPU ms a second with {n} sessions open, no request ({IDLE_WINDOW:g} s): "
                  + ", ".join(f"{k} {1000 * v:.0f}" for v, k in quiet[:6]), flush=True)
            if args_tap:
                print(tap.table(idle["requests"] + lat["requests"]), flush=True)
    finally:
        await stop_workers()
        await tap.close()
        await asyncio.to_thread(up.stop)


_started: list[Up] = []  # the systems started: a SIGTERM stops them


def _sigterm(_sig, _frame):
    """A benchmark stopped with SIGTERM stops the system it started -- its servers and services run in
    sessions of their own, and were left running -- and exits 143 at once: the event loop, interrupted, waited
    for ever on a thousand sessions' tasks to end."""
    for w in _workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.pid, signal.SIGKILL)
    for up in _started:
        up.stop("the benchmark was stopped")
    os._exit(128 + signal.SIGTERM)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10, 100, 1000], help="concurrent launchers")
    ap.add_argument("--nodes", type=int, default=1024, help="emulated nodes (>= the largest N)")
    ap.add_argument("--jobs", type=int, default=1000, help="rigid jobs per throughput run")
    ap.add_argument("--only", choices=("all", "latency"), default="all",
                    help="latency: leave out the throughput runs")
    ap.add_argument("--tap", action="store_true",
                    help="count every message on the bus during the latency runs, per subject (adds its own load)")
    ap.add_argument("--workers", type=int, default=0,
                    help="spread all but 100 of the sessions and launchers over this many more processes")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)  # (a worker process: its sessions)
    ap.add_argument("--worker-name", default="w.", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        asyncio.run(worker(args.worker, args.worker_name))
        return
    signal.signal(signal.SIGTERM, _sigterm)
    asyncio.run(run(args.n, max(args.nodes, max(args.n)), args.jobs, args.only, args.tap, args.workers))


if __name__ == "__main__":
    main()
