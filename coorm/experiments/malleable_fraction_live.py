"""``coorm experiment malleable-fraction --live``: the malleable-fraction study's replay, live at a reduced size.

The same launcher objects as the simulated replay (:func:`coorm.simulator.replay.plan`: the trace's rigid
jobs as :class:`~coorm.launchers.rigid.RigidLauncher`, the seeded draw of the malleable ones as the PSA
model's :class:`~coorm.launchers.psa.PSALauncher`, or with ``--malleable-model negotiating`` as the shipped
negotiating launcher, :func:`coorm.simulator.replay.negotiating_malleable`: :data:`MODELS`),
each through :class:`~coorm.launchers.live.LiveRunner` (which forgives a malleable job the races a live
shrink meets, counting them: ``overtaken``, ``reassigned``) over ``coorm up`` (nats-server, valkey, every
service, one node agent starting a real ``sleep`` on every node a job holds, killed when the node goes back), under
``COORM_MALLEABLE_POLICY`` and ``COORM_PRECEDENCE=waiting`` as the simulated replay sets them.

At a reduced size (:func:`reduced`): ``JOBS`` consecutive jobs of the same SDSC SP2 slice (from job
``SKIP + OFFSET + 1``), on a quarter of its nodes (:data:`NODES`: 32; each job's nodes divided by 4, rounded
up), every time divided by :data:`SPEED` (submit times, run times, walltimes) -- a run time never below
:data:`MIN_RUN` seconds, what the live system needs to start and end a job without its own latencies
making the figures (the twin's live runs heard a start within 0.52 s at the 95th percentile). The policy
core's own intervals shrink with it (a pass every 0.2 s, no fair-start delay, a 2 s grace for a mandatory
shrink).

Beside each live run, the simulator replays the very same reduced workload (the same :func:`plan`, the same
policy settings): the simulated column of the table says what the live run would give with no messaging
and no process starts. The metrics of both are :func:`coorm.simulator.metrics.compute`'s, over records
made of what the run itself saw: each job's arrival, the starts and ends the RMS told its runner (the nodes
of each request, :class:`~coorm.launchers.sdk.Started` to :class:`~coorm.launchers.sdk.Killed`), its end.
Times are in seconds of the reduced workload (wall time for the live runs).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from coorm.experiments import common
from coorm.experiments import malleable_fraction as mf

NODES = 32  # the SDSC SP2's 128 nodes, over 4
NODE_DIV = 4
SPEED = 100.0  # every time of the trace divided by this
MIN_RUN = 3.0  # seconds: the shortest run time live
OFFSET = 165  # from the full study's first job (mf.SKIP): a busy stretch of it (the wide jobs queue)
JOBS, QUICK_JOBS = 16, 8
FRACTIONS, QUICK_FRACTIONS = (0.0, 0.5, 1.0), (0.0, 1.0)
POLICIES, QUICK_POLICIES = ("filling", "egs"), ("filling",)
MODELS = ("psa", "negotiating")
SEED = 1
CLUSTER = "c0"
LONG = ["sleep", "3600"]  # a job's process on each node it holds (killed when the node goes back)
GRACE = 2.0


def policy_settings(policy: str) -> dict:
    return {"preemptible": policy, "precedence": "waiting", "fair_start": 0.0, "reschedule_interval": 0.2,
            "preempt_grace": GRACE}


def env(policy: str) -> dict[str, str]:
    """The live system's settings: the simulated replay's policy settings (:func:`policy_settings`)."""
    return {"COORM_MALLEABLE_POLICY": policy, "COORM_PRECEDENCE": "waiting", "COORM_LOCAL_THRESHOLD": "0",
            "COORM_RESCHEDULE_INTERVAL": "0.2", "COORM_FAIR_START": "0", "COORM_PREEMPT_GRACE": str(GRACE),
            "COORM_KILL_GRACE": "1", "COORM_LOG_LEVEL": "WARNING", "COORM_SESSION_TIMEOUT": "60"}


def scenario(policy: str, jobs: int):
    from coorm.simulator.scenario import Scenario
    from coorm.simulator.traces import locate

    return Scenario.model_validate({
        "clusters": {CLUSTER: NODES}, "policy": policy_settings(policy),
        "trace": {"file": str(locate(mf.TRACE)), "jobs": jobs, "skip": mf.SKIP + OFFSET, "arrival_interval": None,
                  "seed": SEED}})


def reduced(jobs: list) -> list:
    """The trace's jobs at the reduced size: nodes / :data:`NODE_DIV` (rounded up), times / :data:`SPEED`, a
    run time of at least :data:`MIN_RUN`, a walltime a few seconds past it at least (the launcher, not the
    RMS, ends the job: as in the trace's slice, where every job ends before its walltime)."""
    out = []
    for j in jobs:
        run = max(j.runtime / SPEED, MIN_RUN)
        out.append(replace(j, submit=j.submit / SPEED, runtime=run, walltime=max(j.walltime / SPEED, run + 5.0),
                           nodes=math.ceil(j.nodes / NODE_DIV)))
    return out


def workload(policy: str, fraction: float, jobs_n: int, model: str = "psa"):
    """The planned jobs (launchers and arrival times) of one run: :func:`coorm.simulator.replay.plan` of the
    reduced slice, the malleable ones drawn with :data:`SEED` and made ``model``'s."""
    from coorm.simulator.replay import ReplayOptions, plan
    from coorm.simulator.run import read_trace

    sc = scenario(policy, jobs_n)
    trace = reduced(read_trace(sc) or [])
    return sc, plan(sc, ReplayOptions(seed=SEED, malleable_fraction=fraction, malleable_model=model), trace)


def simulated(policy: str, fraction: float, jobs_n: int, model: str = "psa") -> dict:
    """The simulator's replay of the same reduced workload: its metrics."""
    from coorm.simulator.engine import Simulation
    from coorm.simulator.metrics import compute
    from coorm.simulator.summary import job_records

    sc, planned = workload(policy, fraction, jobs_n, model)
    sim = Simulation(sc.sizes, sc.policy, sc.props())
    for p in planned:
        if p.launcher is not None:
            sim.add(p.at, p.launcher, p.name)
    return compute(job_records(sim.run(), planned), NODES)


# ======================================================================================================
# live
# ======================================================================================================
@dataclass
class Seen:
    """One job as its runner saw it: its arrival, and the nodes of each request from its start to its end."""

    submit: float
    open_: dict[str, tuple[float, int]] = field(default_factory=dict)  # request -> (start, nodes)
    segments: list[tuple[float, float, int]] = field(default_factory=list)
    sizes: set[int] = field(default_factory=set)  # how many nodes it held at once, at each change
    held: int = 0

    def started(self, at: float, request: str, nodes: int) -> None:
        self.open_[request] = (at, nodes)
        self.held += nodes
        self.sizes.add(self.held)

    def ended(self, at: float, request: str) -> None:
        if request in self.open_:
            start, nodes = self.open_.pop(request)
            self.segments.append((start, at, nodes))
            self.held -= nodes
            if self.held:
                self.sizes.add(self.held)


async def run_once(settings, policy: str, fraction: float, jobs_n: int, model: str = "psa") -> dict:
    """One live replay of the reduced workload: every job opened at its arrival time, run by its launcher
    through a :class:`LiveRunner`; its row (metrics from the records of what the runners saw)."""
    from coorm.launchers.kinds import BY_NAME
    from coorm.launchers.live import LiveRunner
    from coorm.launchers.sdk import Killed, Session, Started
    from coorm.simulator.metrics import JobRecord, compute

    _, planned = workload(policy, fraction, jobs_n, model)
    t0 = time.time()
    seen: dict[str, Seen] = {}

    def clock() -> float:
        return time.time() - t0  # the workload's time: its first arrival at 0

    def since_t0(t: float | None) -> float | None:
        return None if t is None else t - t0

    async def one(p) -> tuple:
        await asyncio.sleep(max(0.0, p.at - clock()))  # the workload's arrival times (not a synchronisation)
        s_ = seen[p.app] = Seen(submit=clock())
        kind = BY_NAME[p.launcher.kind]

        async def observe(item: object, _result) -> None:
            if isinstance(item, Started) and item.nodes:
                s_.started(clock(), item.request, len(item.nodes))
            elif isinstance(item, Killed):
                s_.ended(clock(), item.request)

        session = await Session.open(settings, kind=kind.name, name=p.name,
                                     preemptive_views=kind.preemptive_views, views=kind.live_views)
        # (the runner keeps wall-clock time, the RMS's: its launcher compares its own now with the times of
        # its views and offers. Given the workload's time instead, a negotiating job saw every offer start
        # some 1.8e9 s ahead, rejected it and asked again, a thousand times a second)
        return p, await LiveRunner(session, p.launcher, command=LONG, observe=observe).run()

    done = await asyncio.wait_for(asyncio.gather(*(one(p) for p in planned if p.launcher is not None)),
                                  timeout=30 * 60)
    records = []
    malleable = [p for p, _ in done if p.launcher.kind != "rigid"]
    for p, r in done:
        s_ = seen[p.app]
        started = since_t0(r.started)
        ended = clock() if r.ended is None else r.ended - t0  # (a runner that returned has its end)
        for start, nodes in s_.open_.values():  # (none should be: a request's end is always told)
            s_.segments.append((start, ended, nodes))
        state = "completed" if r.exit_code == 0 and r.started is not None else f"exit {r.exit_code}"
        records.append(JobRecord(app=p.app, seq=p.seq, submit=s_.submit, start=started, end=ended,
                                 segments=tuple(sorted(s_.segments)), state=state, job=p.job,
                                 kind=p.launcher.kind, nodes_requested=p.nodes))
    m = compute(records, NODES)
    failures = [f"{p.name}: exit {r.exit_code} ({r.end_reason or '; '.join(r.refused) or 'its processes'})"
                for p, r in done if r.exit_code != 0]
    tasks = [(p.launcher.completed, p.launcher.total_tasks) for p in malleable if p.launcher.kind == "psa"]
    return {
        "policy": policy if fraction else "rigid", "model": model if fraction else "-", "fraction": fraction,
        "jobs": len(done), "malleable": len(malleable),
        "finished": sum(1 for r in records if r.state == "completed"),
        "failed": len(failures), "failures": " | ".join(failures),
        "processes": sum(r.processes for _, r in done), "overtaken": sum(r.overtaken for _, r in done),
        "reassigned": sum(r.reassigned for _, r in done),
        "tasks_done": sum(c for c, _ in tasks), "tasks": sum(t or 0 for _, t in tasks),
        "resized": sum(1 for p in malleable if len(seen[p.app].sizes) > 1),
        "wider_than_1": sum(1 for p in malleable if max(seen[p.app].sizes, default=0) > 1),
        **{k: m[k] for k in mf.METRICS}, "unfinished": m["unfinished"],
    }


def run_live(out: Path, quick: bool = False, policies: tuple[str, ...] | None = None,
             fractions: tuple[float, ...] | None = None, model: str = "psa") -> list[dict]:
    """One system per policy (``coorm up``), the all-rigid replay on the first; each live row beside the
    simulator's replay of the same reduced workload (``sim_*``), the malleable jobs ``model``'s."""
    if model not in MODELS:
        raise ValueError(f"malleable model {model!r}: one of {', '.join(MODELS)}")
    from coorm.cli.up import Up

    policies = policies or (QUICK_POLICIES if quick else POLICIES)
    fractions = fractions or (QUICK_FRACTIONS if quick else FRACTIONS)
    jobs_n = QUICK_JOBS if quick else JOBS
    rows = []
    for i, policy in enumerate(policies):
        up = Up({CLUSTER: NODES}, env=env(policy), write_connection=False, accounting=False)
        try:
            settings = up.start(180)
            for f in fractions:
                if f == 0.0 and i:
                    continue  # the all-rigid replay: no preemptible request, the policy plays no part
                t = time.perf_counter()
                row = asyncio.run(run_once(settings, policy, f, jobs_n, model))
                sim = simulated(policy, f, jobs_n, model)
                row.update({f"sim_{k}": sim[k] for k in mf.METRICS}, wall_s=round(time.perf_counter() - t, 1))
                rows.append(row)
        finally:
            up.stop()
    common.write_csv(out / (f"{mf.NAME}-live.csv" if model == "psa" else f"{mf.NAME}-live-{model}.csv"), rows)
    return rows


def table(rows: list[dict]) -> str:
    def pct(r: dict, k: str) -> str:
        base = next((b for b in rows if b["policy"] == "rigid"), None)
        if base is None or r is base or not base[k]:
            return "—"
        return f"{100.0 * (r[k] - base[k]) / base[k]:+.0f} %"

    return common.md_table(
        ("policy", "malleable", "jobs (malleable)", "finished", "failed", "PSA tasks", "resized",
         "processes (overtaken, reassigned)", "wait (s)",
         "vs rigid", "turnaround (s)", "vs rigid", "makespan (s)", "utilisation (%)", "simulated: wait",
         "turnaround", "makespan", "utilisation"),
        [(r["policy"], f"{100 * r['fraction']:.0f} %", f"{r['jobs']} ({r['malleable']})", r["finished"],
          r["failed"], f"{r['tasks_done']}/{r['tasks']}", r["resized"],
          f"{r['processes']} ({r['overtaken']}, {r['reassigned']})", f"{r['wait_mean']:.1f}", pct(r, "wait_mean"),
          f"{r['turnaround_mean']:.1f}", pct(r, "turnaround_mean"), f"{r['makespan']:.1f}",
          f"{100 * r['utilisation']:.1f}", f"{r['sim_wait_mean']:.1f}", f"{r['sim_turnaround_mean']:.1f}",
          f"{r['sim_makespan']:.1f}", f"{100 * r['sim_utilisation']:.1f}") for r in rows])
