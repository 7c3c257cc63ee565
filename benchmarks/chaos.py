"""The chaos run: a mixed live workload on the embedded default (``coorm up``'s processes, supervised), while
every kind of process is SIGKILLed in turn -- the policy engine's leader, the node allocator, the view
publisher, accounting, the Celery worker, an agent, valkey and nats-server. Then, from the RMS's own records
and the applications' own observations:

* accepted requests lost: requests the RMS accepted that neither started nor were told ended;
* applications hung or untold: applications that did not finish by the deadline, or whose session was lost;
* double bookings: a node held by two started requests in one of the RMS's status snapshots (sampled every
  quarter of a second through the whole run);
* wrong exit codes: an application whose processes all ran to their end but whose exit code is not its
  command's, or one that exited 0 although a process of it was killed or lost;
* per killed process: the time from the kill until a new job ran to its end (recovery).

Applications: rigid jobs (the SDK, the shipped rigid launcher) of ``sh -c 'sleep S; exit K'`` on 1 to 4
nodes with K in 0..3 -- their expected exit code -- ``coorm submit`` jobs (the command line; every other one
through the ``coorm`` script's fast path, a batch job attached to the command) of the same, and
a parameter-sweep application per cluster (the shipped PSA launcher: malleable, preempted by the others),
``coorm batch --wrap`` jobs, and every fourth of those an array (its task farm) whose task ``t`` exits ``(t +
K) % 4`` and marks a file of its own each time it runs: a task run twice is counted.

    python benchmarks/chaos.py                  # 300 applications, every process killed once
    python benchmarks/chaos.py --apps 60 --clusters c0=8,c1=8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coorm.cli.up import Up, parse_clusters  # noqa: E402
from coorm.launchers.live import LiveRunner  # noqa: E402
from coorm.launchers.rigid import RigidLauncher  # noqa: E402
from coorm.launchers.sdk import Exited, Session  # noqa: E402
from coorm.shared import bus, subjects  # noqa: E402
from coorm.shared.endpoints import Role  # noqa: E402
from coorm.shared.protocol import BatchQuery, BatchQueryReply  # noqa: E402
from coorm.shared.settings import Settings  # noqa: E402

LEADER, STANDBY = "policy engine (leader)", "policy engine (standby)"
VICTIMS = (LEADER, "node-allocator", "view-publisher", "accounting", "celery-worker", "agent-c0", "batch",
           STANDBY, "valkey", "nats-server")
ENV = {"COORM_RESCHEDULE_INTERVAL": "0.05", "COORM_FAIR_START": "0", "COORM_KILL_GRACE": "0.5",
       "COORM_AGENT_TIMEOUT": "5", "COORM_SESSION_TIMEOUT": "15", "COORM_LAUNCHER_HEARTBEAT": "1"}


@dataclass
class Outcome:
    name: str
    via: str  # sdk | cli
    expected: int  # the command's own exit code
    code: int | None = None  # what the application reported (None: it did not finish)
    exits: list[Exited] = field(default_factory=list)
    started: bool = False
    ended_by_rms: str | None = None
    error: str | None = None
    accepted: bool = False
    detail: str = ""  # what a hung application was waiting for
    refused: list[str] = field(default_factory=list)  # what the RMS refused it
    twice: list[str] = field(default_factory=list)  # an array's tasks that ran more than once

    @property
    def killed(self) -> bool:
        return any(e.killed and e.reason not in ("done", "next", "cancelled") or e.code is None for e in self.exits)

    def wrong_code(self) -> bool:
        if self.code is None or self.via == "cli" and self.code == 3:
            return False  # counted as hung / untold, not as a wrong code
        if self.via == "cli":  # only its exit code is seen: it is its command's, or it says it was cut short
            if self.ended_by_rms:
                return self.code == 0
            return self.code != self.expected and self.code < 124
        if self.via == "psa":  # it runs no command: 0 once its tasks are done, 2 if it gave up on a refusal
            return self.code != (2 if self.refused else 0)
        if self.via == "batch":  # completed or failed: its command's code; cut short by the RMS: never 0
            return self.code == 0 if self.ended_by_rms else self.code != self.expected
        if self.killed or self.ended_by_rms:
            return self.code == 0
        return self.code != self.expected


async def sdk_app(settings: Settings, i: int, rng: random.Random, deadline: float) -> Outcome:
    cluster, nodes = rng.choice(["c0", "c1"]), rng.randint(1, 4)
    sleep, code = rng.uniform(1.0, 8.0), rng.randint(0, 3)
    out = Outcome(f"sdk{i}", "sdk", code)
    session = None
    while session is None:  # opening is retried while CooRM cannot be reached (a server restarting)
        try:
            session = await Session.open(settings, kind="rigid", name=out.name, preemptive_views=False)
        except bus.Unreachable:
            if time.monotonic() > deadline:
                out.error = "could not open a session"
                return out
            await asyncio.sleep(0.5)  # back-off before trying again
    runner = LiveRunner(session, RigidLauncher(session.app, cluster, nodes, 300.0),
                        command=["sh", "-c", f"sleep {sleep:.2f}; exit {code}"], command_ends_work=True)
    handle = runner._handle

    async def observe(item) -> None:
        if isinstance(item, Exited):
            out.exits.append(item)
        await handle(item)

    runner._handle = observe  # type: ignore[method-assign]
    lz = runner.launcher
    return await _run(runner, out, deadline, lambda: (
        f"{session.app}: started={runner.result.started is not None} exits={len(out.exits)} "
        f"running={sorted(lz.running)} waiting={sorted(lz.waiting)} refused={runner.result.refused}"))


async def _run(runner: LiveRunner, out: Outcome, deadline: float, detail) -> Outcome:
    """Run the application until the deadline; what it reported, or how it hung (``detail()``: what it waited
    for) or what error it was told."""
    try:
        async with asyncio.timeout(max(1.0, deadline - time.monotonic())) as limit:
            result = await runner.run()
    except TimeoutError as e:
        if limit.expired():
            out.error, out.detail = "hung", detail()
        else:  # a timeout the application was told (nats-py's is a TimeoutError): not a hang
            out.error = f"{type(e).__name__}: {e}"
        return out
    except Exception as e:  # noqa: BLE001 - what the application was told
        out.error = f"{type(e).__name__}: {e}"
        return out
    out.code, out.started, out.ended_by_rms = result.exit_code, result.started is not None, result.end_reason
    out.accepted = result.started is not None or result.end_reason is not None or not result.refused
    out.refused = result.refused
    return out


async def psa_app(settings: Settings, cluster: str, tasks: int, deadline: float) -> Outcome:
    """A parameter-sweep application (malleable: it grows into what the others leave idle, and gives nodes
    back when they want them), ``tasks`` tasks of 2 s."""
    from coorm.launchers.psa import PSALauncher

    out = Outcome(f"psa-{cluster}", "psa", 0)
    session = await Session.open(settings, kind="psa", name=out.name, preemptive_views=True)
    psa = PSALauncher(session.app, cluster, 2.0, total_tasks=tasks)
    runner = LiveRunner(session, psa)
    return await _run(runner, out, deadline, lambda: (
        f"{session.app}: completed={psa.completed}/{tasks} running={sorted(psa.running)} "
        f"waiting={sorted(psa.waiting)} asked={psa.asked} tasks={len(psa.tasks)} view={psa._view()} "
        f"refused={runner.result.refused}"))


async def cli_app(env: dict[str, str], i: int, rng: random.Random, deadline: float) -> Outcome:
    sleep, code = rng.uniform(0.5, 3.0), rng.randint(0, 3)
    out = Outcome(f"cli{i}", "cli", code)
    # every other one through the coorm script's fast path: a batch job attached to the command
    entry = "coorm.cli.fast" if i % 2 else "coorm.cli.main"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", entry, "submit", "-c", rng.choice(["c0", "c1"]), "-N", str(rng.randint(1, 2)),
        "-t", "5m", "--", "sh", "-c", f"sleep {sleep:.2f}; exit {code}", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), max(1.0, deadline - time.monotonic()))
    except TimeoutError:
        proc.kill()
        await proc.wait()
        out.error = "hung"
        return out
    out.code = proc.returncode
    out.accepted = out.started = True
    said = err.decode(errors="replace").strip()
    if out.code != code:  # (what the command said, for the report)
        out.detail = said[-300:]
    if out.code not in (code, 0) and (out.code >= 124 or _cut_short(said)):
        out.ended_by_rms = said[-200:]
    return out


def _cut_short(said: str) -> bool:
    """The command says the RMS ended its job or refused its launch (its node failed, went to another
    request...): it did not complete, and its exit code must only not be 0."""
    from coorm.shared.protocol import AGENT_KILL_REASONS

    return "refused:" in said or "ended by the RMS" in said or any(m in said for m in AGENT_KILL_REASONS.values())


async def _submitted(env: dict[str, str], cwd: Path, out: Outcome, argv: list[str]) -> str | None:
    """``coorm batch ARGV`` through the command's fast path: the job's id (None: the submission failed, said
    in ``out``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "coorm.cli.fast", "batch", *argv,
        env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, err = await proc.communicate()
    words = stdout.decode().split()
    if proc.returncode != 0 or words[:3] != ["Submitted", "batch", "job"]:
        out.error = f"submission failed ({proc.returncode}): {err.decode(errors='replace').strip()[-200:]}"
        return None
    out.accepted = True
    return words[3]


async def _history(settings: Settings, out: Outcome, job: str, count: int, deadline: float) -> list | None:
    """The history's records of ``job`` (its tasks) once ``count`` have ended; None if they never did."""
    nc = None
    try:
        while time.monotonic() < deadline:
            try:
                if nc is None or nc.is_closed:
                    nc = await bus.connect_client(settings.nats_url, out.name, timeout=2.0, reconnect_window=30.0,
                                                  identity=settings.identity(Role.LAUNCHER))
                reply = await bus.call(nc, subjects.BATCH_QUERY, BatchQuery(ended=True, since=0.0, jobs=[job]),
                                       BatchQueryReply, timeout=5)
            except Exception:  # noqa: BLE001 - a server or the batch service restarting: ask again
                reply = None
            if reply is not None and len(reply.jobs) >= count:
                return reply.jobs
            await asyncio.sleep(0.5)  # polling the history: the service tells no one of an end
        return None
    finally:
        if nc is not None:
            await bus.shutdown(nc)


async def batch_app(settings: Settings, env: dict[str, str], cwd: Path, name: str, cluster: str, nodes: int,
                    sleep: float, code: int, deadline: float) -> Outcome:
    """A batch job submitted as a user does (``coorm batch --wrap``, the command's fast path), then followed
    in the queue and the history until it ends: its exit code and state, as ``coorm history`` shows them."""
    out = Outcome(name, "batch", code)
    job = await _submitted(env, cwd, out, ["-p", cluster, "-N", str(nodes), "-t", "5", "-o", "/dev/null",
                                           "--wrap", f"sleep {sleep:.2f}; exit {code}"])
    if job is None:
        return out
    recs = await _history(settings, out, job, 1, deadline)
    if recs is None:
        out.error, out.detail = "hung", f"job {job} never ended"
        return out
    rec = recs[0]
    out.started, out.code = rec.started is not None, rec.exit_code
    if rec.state not in ("completed", "failed"):
        out.ended_by_rms = rec.state
    return out


async def array_app(settings: Settings, env: dict[str, str], cwd: Path, name: str, cluster: str, tasks: int,
                    sleep: float, code: int, deadline: float) -> Outcome:
    """An array (``coorm batch --array``, run in its task farm): each task's state and exit code from the
    history -- ``(task + code) % 4`` unless the RMS cut it short -- and how many times each ran (its marks)."""
    out = Outcome(name, "batch", 0)
    marks = cwd / name
    marks.mkdir()
    job = await _submitted(env, cwd, out, [
        "-p", cluster, "-N", "1", "-t", "5", f"--array=0-{tasks - 1}", "-o", "/dev/null",
        "--wrap", f"echo x >> {marks}/$COORM_ARRAY_TASK_ID; sleep {sleep:.2f}; "
                  f"exit $(((COORM_ARRAY_TASK_ID + {code}) % 4))"])
    if job is None:
        return out
    recs = await _history(settings, out, job, tasks, deadline)
    if recs is None:
        out.error, out.detail = "hung", f"array {job} never ended"
        return out
    out.started = any(r.started is not None for r in recs)
    cut = [r for r in recs if r.state not in ("completed", "failed")]
    out.ended_by_rms = ", ".join(f"{r.id} {r.state}" for r in cut) or None
    bad = [f"{r.id}: {r.exit_code} not {((r.task or 0) + code) % 4}" for r in recs
           if r.state in ("completed", "failed") and r.exit_code != ((r.task or 0) + code) % 4]
    out.code = 1 if bad else 0
    out.detail = "; ".join(bad)
    out.twice = [r.id for r in recs if (marks / str(r.task)).exists()
                 and (marks / str(r.task)).read_text().count("x") > 1]
    return out


async def sample_double_bookings(settings: Settings, stop: asyncio.Event, seen: list[str]) -> int:
    """Snapshots of the RMS's status through the run: a node in two started requests at once."""
    from coorm.cli.live import _status

    samples = 0
    while not stop.is_set():
        try:
            st = await _status(settings)
        except Exception:  # noqa: BLE001 - the engine or a server may be down right now
            await asyncio.sleep(0.25)
            continue
        samples += 1
        owner: dict[str, str] = {}
        for r in st.requests:
            for n in r.node_ids:
                if n in owner and owner[n] != r.request:
                    seen.append(f"{n}: {owner[n]} and {r.request} at epoch {st.epoch}")
                owner[n] = r.request
        await asyncio.sleep(0.25)  # the sampling period
    return samples


async def probe(settings: Settings, k: int, env: dict[str, str], cwd: Path, batch: bool) -> bool:
    """A one-node job of ``true``, through the SDK (or ``batch``: the batch queue): True once it ran to its
    end with 0."""
    if batch:
        out = await batch_app(settings, env, cwd, f"probe{k}", "c0", 1, 0.0, 0, time.monotonic() + 20)
        return out.error is None and out.code == 0
    try:
        session = await Session.open(settings, kind="rigid", name=f"probe{k}", preemptive_views=False)
        result = await asyncio.wait_for(LiveRunner(session, RigidLauncher(session.app, "c0", 1, 60.0),
                                                   command=["true"], command_ends_work=True).run(), 20)
        return result.exit_code == 0
    except Exception:  # noqa: BLE001 - not back yet
        return False


def engine(up: Up, leading: bool) -> str:
    """Which of the two policy engines leads now (or stands by), from their own metrics."""
    import urllib.request

    for name in ("policy-engine", "policy-engine-standby"):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{up.metrics_ports[name]}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            continue
        value = next((line.split()[-1] for line in text.splitlines() if line.startswith("coorm_policy_leader ")),
                     "0")
        if (float(value) == 1.0) == leading:
            return name
    raise RuntimeError("no policy engine in that role now")


async def kill_in_turn(up: Up, settings: Settings, victims: tuple[str, ...], pause: float, env: dict[str, str],
                       cwd: Path) -> dict[str, float]:
    recovery: dict[str, float] = {}
    for k, victim in enumerate(victims):
        await asyncio.sleep(pause)  # the workload runs a while between two kills
        name = engine(up, victim == LEADER) if victim in (LEADER, STANDBY) else victim
        pid = up.children[name].pid
        assert pid is not None
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while not await probe(settings, k, env, cwd, batch=victim == "batch"):
            if time.monotonic() - t0 > 60:
                recovery[victim] = float("inf")
                break
        else:
            recovery[victim] = time.monotonic() - t0
    return recovery


async def chaos(clusters: dict[str, int], apps: int, cli_share: float, victims: tuple[str, ...], seed: int,
                workdir: Path | None = None, batch_share: float = 0.2) -> dict:
    rng = random.Random(seed)
    up = Up(clusters, workdir, env=ENV, write_connection=False)
    settings = await asyncio.to_thread(up.start, 120)
    env = dict(os.environ, **ENV, COORM_NATS_URL=settings.nats_url, COORM_REDIS_URL=settings.redis_url,
               COORM_CREDENTIALS_DIR=str(settings.credentials_dir), COORM_CONNECTION_FILE=str(up.workdir / "none.json"))

    async def supervise() -> None:
        while True:
            if not up.supervise():
                raise RuntimeError(up.failed)
            await asyncio.sleep(0.2)  # coorm up's own supervision period

    supervisor = asyncio.create_task(supervise())
    stop_sampling = asyncio.Event()
    doubles: list[str] = []
    sampler = asyncio.create_task(sample_double_bookings(settings, stop_sampling, doubles))
    try:
        pause = 4.0
        deadline = time.monotonic() + pause * (len(victims) + 2) + 180
        tasks = [asyncio.create_task(psa_app(settings, c, 4 * n, deadline)) for c, n in clusters.items()]
        killer = None
        jobs_dir = up.workdir / "batch-jobs"
        jobs_dir.mkdir(exist_ok=True)
        for i in range(apps):
            x = rng.random()
            if x < cli_share:
                tasks.append(asyncio.create_task(cli_app(env, i, rng, deadline)))
            elif x < cli_share + batch_share:
                job = (rng.choice(["c0", "c1"]), rng.randint(1, 2), rng.uniform(0.5, 4.0), rng.randint(0, 3))
                if rng.random() < 0.25:  # an array of 3 to 12 one-node tasks, in its task farm
                    job = (job[0], rng.randint(3, 12), job[2] / 2, job[3])
                    tasks.append(asyncio.create_task(array_app(settings, env, jobs_dir, f"array{i}", *job, deadline)))
                else:
                    tasks.append(asyncio.create_task(batch_app(settings, env, jobs_dir, f"batch{i}", *job, deadline)))
            else:
                tasks.append(asyncio.create_task(sdk_app(settings, i, rng, deadline)))
            await asyncio.sleep(rng.expovariate(apps / (pause * len(victims))))  # arrivals through the kills
            if i == apps // 10:
                killer = asyncio.create_task(kill_in_turn(up, settings, victims, pause, env, jobs_dir))
        outcomes: list[Outcome] = await asyncio.gather(*tasks)
        assert killer is not None
        recovery = await killer
        stop_sampling.set()
        samples = await sampler
    finally:
        supervisor.cancel()
        await asyncio.to_thread(up.stop)
    hung = [o for o in outcomes if o.error == "hung"]
    untold = [o for o in outcomes if o.error is not None and o.error != "hung"]
    lost = [o for o in outcomes if o.accepted and not o.started and not o.ended_by_rms and o.error is None]
    wrong = [o for o in outcomes if o.wrong_code() or (o.name.startswith("array") and o.code == 1)]
    return {"apps": len(outcomes), "sdk": sum(o.via == "sdk" for o in outcomes),
            "cli": sum(o.via == "cli" for o in outcomes), "psa": sum(o.via == "psa" for o in outcomes),
            "batch": sum(o.via == "batch" for o in outcomes),
            "arrays": sum(o.name.startswith("array") for o in outcomes),
            "twice": [t for o in outcomes for t in o.twice],
            "killed_apps": sum(o.killed or bool(o.ended_by_rms) for o in outcomes),
            "lost": [o.name for o in lost], "hung": [f"{o.name} {o.detail}" for o in hung],
            "untold": [f"{o.name}: {o.error}" for o in untold], "wrong": [
                f"{o.name}: expected {o.expected}, got {o.code} ({[(e.code, e.reason) for e in o.exits]}) {o.detail}"
                f" started={o.started} ended_by_rms={o.ended_by_rms} refused={o.refused}"
                for o in wrong],
            "double_bookings": doubles, "samples": samples, "recovery": recovery,
            "gave_up": [f"{o.name}: {o.refused[0]}" for o in outcomes if o.refused and o.via == "psa"],
            "exits": sum(len(o.exits) for o in outcomes)}


def report(r: dict) -> str:
    lines = [f"{r['apps']} applications ({r['sdk']} SDK rigid jobs, {r['cli']} coorm submit jobs, {r['batch']} "
             f"batch jobs of which {r['arrays']} arrays, {r['psa']} parameter-sweep applications), "
             f"{r['exits']} process exits seen by the SDK ones, {r['killed_apps']} cut short by a kill",
             "", "| check | count |", "| --- | --- |",
             f"| accepted requests lost | {len(r['lost'])} |",
             f"| applications hung | {len(r['hung'])} |",
             f"| applications untold (session lost) | {len(r['untold'])} |",
             f"| nodes held by two started requests ({r['samples']} status snapshots) | {len(r['double_bookings'])} |",
             f"| wrong exit codes | {len(r['wrong'])} |",
             f"| array tasks run twice | {len(r['twice'])} |",
             "", "| SIGKILL of | back to running a job (s) |", "| --- | --- |"]
    lines += [f"| {name} | {t:.1f} |" for name, t in r["recovery"].items()]
    for key in ("lost", "hung", "untold", "wrong", "double_bookings", "gave_up", "twice"):
        for item in r[key][:10]:
            lines.append(f"{key}: {item}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--apps", type=int, default=300)
    ap.add_argument("--clusters", default="c0=32,c1=32")
    ap.add_argument("--cli-share", type=float, default=0.1, help="share of the applications run by coorm submit")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    r = asyncio.run(chaos(parse_clusters(args.clusters), args.apps, args.cli_share, VICTIMS, args.seed))
    print(report(r))
    bad = r["lost"] or r["hung"] or r["untold"] or r["wrong"] or r["double_bookings"]
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
