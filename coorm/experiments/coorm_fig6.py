"""CooRM Fig. 6: scalability -- computed configurations, CPU time and message size, OAR-SIM (W0) and CooRM
(W0..W3) on 1 to 8 clusters; minimum, quartiles and maximum over packs of the LLNL Atlas trace.

Set-up (CooRM §IV-A):

* **resources**: :func:`coorm.launchers.cem.paper_platform` -- ``nC`` clusters of 128 hosts, the i-th
  ``1 + 0.1 (i - 1)`` times faster than the first, hierarchical WAN; re-policy interval 1 s, fair-start 5 s;
* **W0**: a pack of consecutive usable jobs of the Atlas trace (200 in full mode), one arrival per second.
  Exactly 20% of them (drawn per pack) are simple-moldable with an Amdahl speed-up (serial fraction
  :data:`coorm.launchers.moldable.SERIAL_FRACTION`, the sequential time that makes the trace's runtime on the
  trace's host count), the others rigid: the trace's host count (capped at 128) on a cluster drawn at random,
  walltime and runtime divided by that cluster's speed. A moldable job's configurations are OAR's full
  enumeration, :func:`coorm.launchers.moldable.oar_configs`: every cluster, 2..128 hosts (``nC x 127``); under
  CooRM its :class:`~coorm.launchers.moldable.MoldableLauncher` makes OAR's earliest-completion choice itself from
  its views, among those very configurations -- so both systems produce the same schedule;
* **W1**: W0 with one CEM application (:class:`coorm.launchers.cem.CEMLauncher`, default model) inserted in the
  middle of the pack (the jobs after it arrive one second later); **W2**: W0 with 50% of the jobs (drawn per
  pack) replaced by CEM applications; **W3**: only CEM applications.

Packs are the repetitions: ``packs`` packs spread evenly over the trace (pack ``i`` of ``P`` is the
``round((i + 0.5) * 183 / P)``-th pack of 200 jobs; in quick mode only its first ``jobs`` jobs). The random
draws (moldable jobs, clusters, replaced jobs) are seeded with the pack number: everything but CPU times is
deterministic.

Measured, per run, for CooRM:

* ``computed_configurations``: the simulator's count -- the distinct inputs (views) on which a launcher ran
  its selection (memoised), summed over moldable and CEM launchers; rigid launchers select nothing;
* ``sched_cpu_s``: the scheduling CPU the brief asks for, ``cores_cpu_s + launcher_cpu_s``: the policy and
  allocator cores (``Result.scheduling_cpu``) plus every launcher callback (``on_views``, ``on_timer``, ...,
  i.e. the resource selections), timed with ``time.process_time`` around each call;
* ``sim_cpu_s``: the CPU time of the whole simulation (``Simulation.run``), the paper's "simulation time". It
  also holds the views the RMS computes for every waiting application at every pass (``np_view`` in the
  engine, not counted in ``Result.scheduling_cpu``), the CDR sizing and the event loop (``other_cpu_s``);
* ``bytes``, ``messages``: the simulator's total, messages encoded like CORBA's CDR (``coorm.simulator.cdr``),
  the cluster-info queries each launcher makes when it starts and their replies included;
  ``bytes_per_app`` divides by the number of applications.

OAR-SIM (W0 only) is not a second simulation: the CooRM run *is* its schedule (the same CBF policy and the
same earliest-completion choice among the same configurations), and only what OAR would have computed and sent
differs. "OARSIM: applications enumerate all the possible configurations and let the RMS choose" (§IV-A), so
at every scheduling pass, OAR evaluates the whole list of every waiting moldable job:

* ``computed_configurations`` = sum over moldable jobs of ``len(oar_configs) x passes``, ``passes`` being the
  scheduling passes from the first one that saw the job (the one that sent it its first view) to the one that
  started it, both included (recorded from the policy core's pass counter). Rigid jobs are not counted, as
  for CooRM (they have one configuration and select nothing);
* ``sched_cpu_s`` = ``sim_cpu_s`` = ``cores_cpu_s`` of the run (the CBF passes) + sum over moldable jobs of
  ``passes x`` the measured CPU time of one full enumeration of its configurations (``earliest_fit`` of
  every configuration, no pruning) on the view of its first selection. That one timing per job is done
  outside the CooRM timings (it is subtracted from them), and its result is checked against the CooRM choice
  (``enumeration_mismatches`` must be 0: the pruned choice is the exhaustive one);
* ``bytes`` / ``messages``: per job a subscribe, one submission listing all its configurations (each a
  cluster id, a host count and a walltime; a rigid job: one), its startNotify with its node IDs, a done and
  a close, sized with the same CDR rules (:func:`oar_request`) -- no views.

W3 (200 CEM applications, all with the same model, one per second) does not depend on the trace: it is run
once per ``nC`` (its ``packs`` column says 1).
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from coorm.experiments.common import ATLAS, md_table, quartiles, save, write_csv
from coorm.launchers.base import ClusterProps, Launcher
from coorm.launchers.cem import CEMLauncher, paper_platform
from coorm.launchers.moldable import SERIAL_FRACTION, MoldableLauncher, amdahl_seq_time, oar_configs
from coorm.launchers.rigid import RigidLauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared.stepfn import INF
from coorm.simulator import cdr
from coorm.simulator.engine import Simulation
from coorm.simulator.trace import TraceJob, read_swf

NAME = "coorm-fig6"

PACK = 200  # jobs per pack (§IV-A)
# the trace the packs come from: a catalogue name (found by coorm.simulator.traces.locate) or a path; the
# tests replay the shipped sample (3,000 Atlas jobs) so that they need no download
TRACE: str | Path = ATLAS
MOLDABLE_FRACTION = 0.2
W2_CEM_FRACTION = 0.5
FAIR_START = 5.0  # §IV-A
REPOLICY = 1.0  # §IV-A
HOSTS = 128

WORKLOADS = ("W0", "W1", "W2", "W3")
FULL = dict(clusters=tuple(range(1, 9)), packs=3, jobs=PACK)
QUICK = dict(clusters=(1, 2, 4), packs=2, jobs=50)


# ======================================================================================================
# the trace and the workloads (shared with Fig. 7)
# ======================================================================================================
def require_trace() -> Path:
    from coorm.simulator.traces import TraceError, locate

    if isinstance(TRACE, Path):
        if not TRACE.exists():
            raise FileNotFoundError(f"CooRM Fig. 6/7 need the LLNL Atlas trace, not found at {TRACE}")
        return TRACE
    try:
        return locate(TRACE)
    except TraceError as e:
        raise FileNotFoundError(f"CooRM Fig. 6/7 need the LLNL Atlas trace: {e}") from None


_JOBS: dict[Path, list[TraceJob]] = {}


def trace_jobs() -> list[TraceJob]:
    path = require_trace()
    if path not in _JOBS:
        _JOBS[path], _ = read_swf(path)
    return _JOBS[path]


def pack_numbers(packs: int) -> list[int]:
    """``packs`` pack numbers spread evenly over the trace's packs of 200 jobs (183 in the Atlas trace)."""
    total = len(trace_jobs()) // PACK
    return [min(total - 1, round((i + 0.5) * total / packs)) for i in range(packs)]


def pack_seed(number: int) -> int:
    """The seed of a pack's random draws: its number in the Atlas log, also when it is read from the
    shipped sample, so that a run on the sample replays exactly what it replays on the whole log."""
    from coorm.simulator.traces import SAMPLE, SAMPLE_PACKS

    return SAMPLE_PACKS[number] if require_trace() == SAMPLE else number


def pack_jobs(number: int, jobs: int) -> list[TraceJob]:
    all_jobs = trace_jobs()
    start = number * PACK
    return all_jobs[start : start + jobs]


def platform(n_clusters: int) -> tuple[dict[str, int], ClusterProps]:
    props = paper_platform(n_clusters, hosts=HOSTS)
    return dict(props.nodes), props


def build_workload(
    jobs: Sequence[TraceJob],
    props: ClusterProps,
    workload: str,
    seed: int,
    *,
    cem_position: int | None = None,
    cem_delay: float = 0.0,
    moldable_cls: type[MoldableLauncher] = MoldableLauncher,
) -> list[Launcher]:
    """The launchers of one workload, in arrival order (one arrival per second). W1's CEM is ``"cem"``,
    inserted before job ``cem_position`` (default: the middle), with ``cem_delay`` as adaptation delay."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; one of {WORKLOADS}")
    names = sorted(props.nodes)
    clusters = dict(props.nodes)
    n = len(jobs)
    rng = random.Random(seed)
    moldable = set(rng.sample(range(n), round(MOLDABLE_FRACTION * n)))
    where = [rng.choice(names) for _ in range(n)]
    replaced: set[int] = set()
    if workload == "W2":
        replaced = set(random.Random(f"W2-{seed}").sample(range(n), round(W2_CEM_FRACTION * n)))
    elif workload == "W3":
        replaced = set(range(n))
    out: list[Launcher] = []
    for k, job in enumerate(jobs):
        app = f"a{k + 1}"
        nodes = min(job.nodes, max(clusters.values()))
        if k in replaced:
            out.append(CEMLauncher(app))
        elif k in moldable:
            seq = amdahl_seq_time(nodes, job.runtime, SERIAL_FRACTION)
            configs = oar_configs(clusters, seq, SERIAL_FRACTION, speeds=props.speed)
            out.append(moldable_cls(app, None, configs))
        else:
            c = where[k]
            s = props.speed_of(c)
            walltime, runtime = max(math.ceil(job.walltime / s), 1), max(job.runtime / s, 1.0)
            out.append(RigidLauncher(app, c, nodes, walltime, runtime))
    if workload == "W1":
        pos = n // 2 if cem_position is None else cem_position
        out.insert(pos, CEMLauncher("cem", adaptation_delay=cem_delay))
    return out


def new_simulation(props: ClusterProps, fair_start: float = FAIR_START) -> Simulation:
    settings = PolicySettings(fair_start=fair_start, reschedule_interval=REPOLICY)
    return Simulation(dict(props.nodes), settings, props)


# ======================================================================================================
# instrumentation
# ======================================================================================================
class LauncherClock:
    """Process CPU time spent inside launcher callbacks (their resource selections)."""

    CALLBACKS = ("on_open", "on_views", "on_timer", "on_start", "on_end")

    def __init__(self) -> None:
        self.cpu = 0.0

    def wrap(self, launcher: Launcher) -> None:
        for name in self.CALLBACKS:
            setattr(launcher, name, self._timed(getattr(launcher, name)))

    def _timed(self, fn):
        def timed(*args):
            t0 = time.process_time()
            try:
                return fn(*args)
            finally:
                self.cpu += time.process_time() - t0

        return timed


class OarTrackedMoldable(MoldableLauncher):
    """A CooRM moldable launcher that also records what OAR-SIM would have computed for the same job: the
    scheduling passes it waited through, and the CPU time of one full enumeration of its configurations."""

    sim: Simulation | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.first_pass: int | None = None
        self.start_pass: int | None = None
        self.enumeration_cpu: float | None = None
        self.enumeration_mismatch = False

    def _epoch(self) -> int:
        assert self.sim is not None
        return self.sim.cores.policy.epoch

    def on_views(self, views):
        if self.first_pass is None and self.started_at is None:
            self.first_pass = self._epoch()
        return super().on_views(views)

    def on_start(self, now, request, nodes):
        out = super().on_start(now, request, nodes)
        if self.started_at is not None and self.start_pass is None:
            self.start_pass = self._epoch()
        return out

    def select(self, views, now):
        choice = super().select(views, now)
        if self.enumeration_cpu is None:
            t0 = time.process_time()
            best = full_enumeration(self.configs, views, now)
            self.enumeration_cpu = time.process_time() - t0
            self.enumeration_mismatch = best != choice.config
        return choice

    @property
    def oar_passes(self) -> int:
        if self.first_pass is None or self.start_pass is None:
            return 0
        return self.start_pass - self.first_pass + 1


def full_enumeration(configs, views, now: float):
    """OAR's choice, the exhaustive way: every configuration's completion, the earliest (same ties as the
    launcher: fewer nodes, then the cluster's name)."""
    best = None
    for c, n, d in configs:
        view = views.get(c)
        start = INF if view is None else view.earliest_fit(n, d, now)
        rank = (start + d, n, c, d)
        if best is None or rank < best[0]:
            best = (rank, (c, n, d))
    return best[1]


def oar_request(app: str, configs: Sequence[tuple[str, int, float]]) -> int:
    """An OAR-SIM submission: the application and its list of configurations, each (cluster id, long hosts,
    double walltime), CDR-aligned."""
    body = sum(cdr._align(cdr.string(c) + 4, 8) + 8 for c, _, _ in configs)
    return cdr.HEADER + cdr.string(app) + 4 + body


def oar_messages(sim_result, launchers: Sequence[Launcher]) -> tuple[int, int]:
    """(messages, bytes) OAR-SIM exchanges for the same schedule: per job a subscribe, one submission with
    every configuration (a rigid job: its one), startNotify with its node IDs, done, close; no views."""
    started = {}
    for r in sim_result.requests:
        if r.type != "pre-allocation" and r.app not in started:
            started[r.app] = r
    messages = total = 0
    for lau in launchers:
        rec = started[lau.app]
        configs = getattr(lau, "configs", None) or [(rec.cluster, rec.nodes, 1.0)]
        node_ids = [f"{rec.cluster}n{i}" for i in range(rec.nodes)]
        rid = f"{lau.app}.1"
        total += (cdr.subscribe(lau.app) + oar_request(lau.app, configs) + cdr.start_notify(rid, node_ids)
                  + cdr.done(lau.app, rid, 0) + cdr.close(lau.app))
        messages += 5
    return messages, total


# ======================================================================================================
# one run
# ======================================================================================================
@dataclass(frozen=True)
class Task:
    workload: str
    clusters: int
    pack: int
    jobs: tuple[TraceJob, ...]


def run_one(task: Task) -> dict:
    _, props = platform(task.clusters)
    sim = new_simulation(props)
    launchers = build_workload(task.jobs, props, task.workload, seed=pack_seed(task.pack),
                               moldable_cls=OarTrackedMoldable)
    clock = LauncherClock()
    for k, lau in enumerate(launchers):
        if isinstance(lau, OarTrackedMoldable):
            lau.sim = sim
        clock.wrap(lau)
        sim.add(float(k), lau)
    t0 = time.process_time()
    result = sim.run()
    sim_cpu = time.process_time() - t0
    moldables = [lau for lau in launchers if isinstance(lau, OarTrackedMoldable)]
    sample = sum(m.enumeration_cpu or 0.0 for m in moldables)  # OAR timing, not CooRM's
    ends = [rec.ended for rec in result.apps.values()]
    if any(e is None for e in ends):
        raise RuntimeError(f"{task}: some application never ended")
    row = {
        "workload": task.workload,
        "clusters": task.clusters,
        "pack": task.pack,
        "apps": len(launchers),
        "cem_apps": sum(isinstance(lau, CEMLauncher) for lau in launchers),
        "moldable_apps": len(moldables),
        "computed_configurations": result.computed_configurations,
        "cores_cpu_s": result.scheduling_cpu,
        "launcher_cpu_s": clock.cpu - sample,
        "sched_cpu_s": result.scheduling_cpu + clock.cpu - sample,
        "sim_cpu_s": sim_cpu - sample,
        "other_cpu_s": sim_cpu - clock.cpu - result.scheduling_cpu,
        "messages": result.messages,
        "bytes": result.bytes,
        "bytes_per_app": result.bytes / len(launchers),
        "passes": result.passes,
        "makespan": max(ends),
    }
    if task.workload == "W0":
        oar_cc = sum(len(m.configs) * m.oar_passes for m in moldables)
        oar_cpu = result.scheduling_cpu + sum(m.oar_passes * (m.enumeration_cpu or 0.0) for m in moldables)
        msgs, size = oar_messages(result, launchers)
        row.update({
            "oar_computed_configurations": oar_cc,
            "oar_cpu_s": oar_cpu,
            "oar_messages": msgs,
            "oar_bytes": size,
            "oar_bytes_per_app": size / len(launchers),
            "oar_mean_passes_waited": sum(m.oar_passes for m in moldables) / max(len(moldables), 1),
            "enumeration_mismatches": sum(m.enumeration_mismatch for m in moldables),
            "enumeration_cpu_s": sample,
        })
    return row


def w2_traffic(task: Task) -> dict:
    """Where one W2 run's bytes go: the same simulation as :func:`run_one` (plain moldable launchers: the
    OAR-SIM bookkeeping changes no choice), with what each application was told (views, starts, ends) and how
    long the applications waited, summed over the run's records."""
    _, props = platform(task.clusters)
    sim = new_simulation(props)
    launchers = build_workload(task.jobs, props, task.workload, seed=pack_seed(task.pack))
    for k, lau in enumerate(launchers):
        sim.add(float(k), lau)
    result = sim.run()
    records = list(result.apps.values())
    if any(r.started is None or r.ended is None for r in records):
        raise RuntimeError(f"{task}: some application never started or ended")
    cems = {lau.app for lau in launchers if isinstance(lau, CEMLauncher)}
    return {
        "workload": task.workload,
        "clusters": task.clusters,
        "pack": task.pack,
        "apps": len(launchers),
        "cem_apps": len(cems),
        "bytes": result.bytes,
        "messages": result.messages,
        "notification_bytes": sum(r.notification_bytes for r in records),
        "cem_notification_bytes": sum(r.notification_bytes for a, r in result.apps.items() if a in cems),
        "app_seconds_waited": sum(r.started - r.submitted for r in records),  # type: ignore[operator]
        "makespan": max(r.ended for r in records),  # type: ignore[type-var]
    }


def workers(n_tasks: int) -> int:
    env = os.environ.get("COORM_EXPERIMENT_WORKERS")
    n = int(env) if env else (os.cpu_count() or 1)
    return max(1, min(n, n_tasks))


def run_tasks(fn, tasks: list) -> list:
    """``fn`` over ``tasks`` on a process pool (one process per core), results in task order."""
    n = workers(len(tasks))
    if n == 1:
        return [fn(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=n) as pool:
        return list(pool.map(fn, tasks))


# ======================================================================================================
# the figure
# ======================================================================================================
COST = {"W2": 0, "W0": 1, "W1": 2, "W3": 3}  # most expensive first, for load balancing
METRICS = (
    ("computed_configurations", "computed configurations"),
    ("sched_cpu_s", "scheduling CPU (s): cores + launchers"),
    ("sim_cpu_s", "simulation CPU (s)"),
    ("bytes", "total message size (bytes)"),
    ("bytes_per_app", "message size per application (bytes)"),
    ("messages", "messages"),
)
OAR_KEYS = {
    "computed_configurations": "oar_computed_configurations",
    "sched_cpu_s": "oar_cpu_s",
    "sim_cpu_s": "oar_cpu_s",
    "bytes": "oar_bytes",
    "bytes_per_app": "oar_bytes_per_app",
    "messages": "oar_messages",
}


def aggregate(runs: list[dict], clusters: Sequence[int]) -> list[dict]:
    rows: list[dict] = []
    series = [("OAR-SIM", "W0")] + [("CooRM", w) for w in WORKLOADS]
    for system, w in series:
        for nc in clusters:
            sel = [r for r in runs if r["workload"] == w and r["clusters"] == nc]
            if not sel:
                continue
            for metric, _ in METRICS:
                key = OAR_KEYS[metric] if system == "OAR-SIM" else metric
                q = quartiles([float(r[key]) for r in sel])
                rows.append({"system": system, "workload": w, "clusters": nc, "metric": metric, **q,
                             "mean": sum(float(r[key]) for r in sel) / len(sel), "packs": len(sel),
                             "apps": sel[0]["apps"]})
    return rows


def _num(metric: str, v: float) -> str:
    if metric == "computed_configurations":
        return f"{v / 1e6:.2f}M" if v >= 1e5 else f"{v:.0f}"
    if metric == "bytes":
        return f"{v / 1e6:.2f}"
    if metric == "bytes_per_app":
        return f"{v / 1e3:.1f}"
    return f"{v:.2f}"


MD_TABLES = (
    ("computed_configurations", "Computed configurations"),
    ("sched_cpu_s", "Scheduling CPU (s): the cores, the views they send, and the launchers (OAR-SIM: cores, "
                    "views and enumerations)"),
    ("sim_cpu_s", "Simulation CPU (s), the whole run, plotted in the PNG"),
    ("bytes", "Total message size (MB)"),
    ("bytes_per_app", "Per application (KB)"),
)


def pack_values(row: dict) -> list[float] | None:
    """A row's value in each of its runs, when its quartiles determine them: up to 3 packs, the minimum, the
    median and the maximum are the runs themselves (``None`` with more packs). Which pack gave which value
    is not stored, so these count runs, they do not pair them across series."""
    if row["packs"] == 1:
        return [row["median"]]
    if row["packs"] == 2:
        return [row["min"], row["max"]]
    if row["packs"] == 3:
        return [row["min"], row["median"], row["max"]]
    return None


def _times(v: float) -> str:
    return f"{v:.0f}×" if v >= 100 else f"{v:.1f}×" if v >= 10 else f"{v:.2f}×"


def _span(values: Sequence[float], fmt) -> str:
    return f"{fmt(min(values))} to {fmt(max(values))} (median {fmt(statistics.median(values))})"


def _every(flags: Sequence[bool]) -> str:
    """The verdict of a rule that must hold at every nC, and at how many it holds."""
    return f"{'yes' if all(flags) else 'no'} ({sum(flags)} of {len(flags)})"


def paper_table(by: dict, clusters: Sequence[int]) -> str:
    """Every quantitative statement of CooRM §IV-B on Fig. 6 next to what the rows say about it. A verdict
    appears only where a rule decides it (a bound held, an order at every nC), and states its rule; whether
    ours is "the same order" as the paper's averages, or W1 "not significantly" different from W0, is
    judgment and left to the prose."""

    def over(w: str, metric: str, stat: str, system: str = "CooRM") -> list[float]:
        return [by[(system, w, nc, metric)][stat] for nc in clusters]

    def ratio(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b, strict=True)]

    def above(a: list[float], b: list[float]) -> list[bool]:
        return [x > y for x, y in zip(a, b, strict=True)]

    def runs(w: str, metric: str) -> list[float] | None:
        values = [pack_values(by[("CooRM", w, nc, metric)]) for nc in clusters]
        return None if any(v is None for v in values) else [x for v in values for x in v or ()]

    def where_max(w: str, metric: str) -> int:
        return max(clusters, key=lambda nc: by[("CooRM", w, nc, metric)]["max"])

    def mean_per_app(w: str) -> float:
        return statistics.fmean(over(w, "bytes_per_app", "mean"))

    def pct(v: float) -> str:
        return f"{100 * (v - 1):+.0f}%"

    def bound(value: float, limit: float, unit: str, scale: float) -> str:
        return f"{'yes' if value < limit else 'no'}: the maximum is {'below' if value < limit else 'above'} " \
               f"{limit / scale:g} {unit}"

    cc = "computed_configurations"
    out = [(
        "W0: CooRM outperforms OAR-SIM in computed configurations",
        "OAR-SIM / CooRM, medians per nC: "
        f"{_span(ratio(over('W0', cc, 'median', 'OAR-SIM'), over('W0', cc, 'median')), _times)}; "
        f"every run at least {_times(min(ratio(over('W0', cc, 'min', 'OAR-SIM'), over('W0', cc, 'max'))))} "
        "(OAR-SIM's minimum over CooRM's maximum)",
        "OAR-SIM's minimum above CooRM's maximum at every nC: "
        + _every(above(over("W0", cc, "min", "OAR-SIM"), over("W0", cc, "max"))))]
    cpu = {m: (over("W0", m, "median", "OAR-SIM"), over("W0", m, "median")) for m in ("sched_cpu_s", "sim_cpu_s")}
    out.append((
        "W0: CooRM outperforms OAR-SIM in simulation time",
        f"OAR-SIM / CooRM, medians per nC: scheduling CPU {_span(ratio(*cpu['sched_cpu_s']), _times)}, "
        f"whole-simulation CPU {_span(ratio(*cpu['sim_cpu_s']), _times)}; CPU of a shared machine",
        f"OAR-SIM's median above CooRM's at every nC: scheduling CPU {_every(above(*cpu['sched_cpu_s']))}, "
        f"whole-simulation CPU {_every(above(*cpu['sim_cpu_s']))}"))
    out.append((
        "W0: CooRM transfers more data than OAR-SIM",
        "CooRM / OAR-SIM, medians per nC: "
        f"{_span(ratio(over('W0', 'bytes', 'median'), over('W0', 'bytes', 'median', 'OAR-SIM')), _times)}; "
        f"every run at least {_times(min(ratio(over('W0', 'bytes', 'min'), over('W0', 'bytes', 'max', 'OAR-SIM'))))} "
        "(CooRM's minimum over OAR-SIM's maximum)",
        "CooRM's minimum above OAR-SIM's maximum at every nC: "
        + _every(above(over("W0", "bytes", "min"), over("W0", "bytes", "max", "OAR-SIM")))))
    w0_max = max(over("W0", "bytes", "max"))
    out.append((
        "W0: total message size below 35 MB for 200 applications",
        f"max {w0_max / 1e6:.1f} MB (nC = {where_max('W0', 'bytes')}), {35e6 / w0_max:.1f}× below",
        bound(w0_max, 35e6, "MB", 1e6)))
    out.append((
        "W0: on average 175 KB per application",
        f"mean {mean_per_app('W0') / 1e3:.1f} KB ({175e3 / mean_per_app('W0'):.1f}× lower), max "
        f"{max(over('W0', 'bytes_per_app', 'max')) / 1e3:.0f} KB (nC = {where_max('W0', 'bytes_per_app')})",
        "in the prose"))
    out.append((
        "W1: one CEM \"does not significantly influence the metrics\"",
        "W1 / W0, medians per nC: "
        + "; ".join(f"{label} {_span(ratio(over('W1', m, 'median'), over('W0', m, 'median')), pct)}"
                    for m, label in ((cc, "computed configurations"), ("bytes", "bytes"),
                                     ("sched_cpu_s", "scheduling CPU"))),
        "in the prose"))
    w2_max = max(over("W2", "bytes", "max"))
    w2_runs = runs("W2", "bytes")
    where = [str(nc) for nc in clusters if by[("CooRM", "W2", nc, "bytes")]["max"] > 60e6]
    heavy = "" if w2_runs is None else (f"; {sum(v > 60e6 for v in w2_runs)} of {len(w2_runs)} runs above 60 MB"
                                        + (f", at nC = {', '.join(where)}" if where else ""))
    out.append((
        "W2: below 60 MB",
        f"max {w2_max / 1e6:.1f} MB (nC = {where_max('W2', 'bytes')}), {abs(100 * (w2_max / 60e6 - 1)):.0f}% "
        f"{'above' if w2_max > 60e6 else 'below'} it{heavy}; the packs' maximum over their minimum "
        f"{_times(min(ratio(over('W2', 'bytes', 'max'), over('W2', 'bytes', 'min'))))} to "
        f"{_times(max(ratio(over('W2', 'bytes', 'max'), over('W2', 'bytes', 'min'))))} per nC",
        bound(w2_max, 60e6, "MB", 1e6)))
    out.append((
        "W2: on average 300 KB per application",
        f"mean {mean_per_app('W2') / 1e3:.0f} KB, max {max(over('W2', 'bytes_per_app', 'max')) / 1e3:.0f} KB "
        f"(nC = {where_max('W2', 'bytes_per_app')})",
        "in the prose"))
    w2_cpu = {m: (max(over("W2", m, "max")), runs("W2", m)) for m in ("sched_cpu_s", "sim_cpu_s")}

    def below_100(m: str) -> str:
        v = w2_cpu[m][1]
        return "" if v is None else f", {sum(x < 100 for x in v)} of {len(v)} runs below 100 s"

    usually = [v is not None and sum(x < 100 for x in v) > len(v) / 2 for _, v in w2_cpu.values()]
    out.append((
        "W2: scheduling \"below 400 s, usually below 100 s\", CEM selection included (Opteron 250, 2.4 GHz)",
        f"scheduling CPU max {w2_cpu['sched_cpu_s'][0]:.1f} s{below_100('sched_cpu_s')}; simulation CPU max "
        f"{w2_cpu['sim_cpu_s'][0]:.1f} s{below_100('sim_cpu_s')}, medians per nC "
        f"{min(over('W2', 'sim_cpu_s', 'median')):.0f}–{max(over('W2', 'sim_cpu_s', 'median')):.0f} s; CPU of a "
        "shared machine",
        f"below 400 s: {'yes' if all(c < 400 for c, _ in w2_cpu.values()) else 'no'} (both maxima); usually below "
        f"100 s: {'yes' if all(usually) else 'no'} (more than half of the runs, both)"))
    w3 = {m: over("W3", m, "median") for m in (cc, "bytes", "sched_cpu_s")}
    w2 = {m: over("W2", m, "median") for m in w3}
    out.append((
        "W3: \"metrics tend to have smaller values [...] number of computed configurations significantly "
        "reduced\"",
        f"computed configurations {min(w3[cc]):.0f}–{max(w3[cc]):.0f} (W2's medians {min(w2[cc]):.0f}–"
        f"{max(w2[cc]):.0f}); bytes {min(w3['bytes']) / 1e6:.2f}–{max(w3['bytes']) / 1e6:.2f} MB (W2's medians "
        f"{min(w2['bytes']) / 1e6:.1f}–{max(w2['bytes']) / 1e6:.1f} MB); scheduling CPU "
        f"{min(w3['sched_cpu_s']):.1f}–{max(w3['sched_cpu_s']):.1f} s (W2's medians {min(w2['sched_cpu_s']):.1f}–"
        f"{max(w2['sched_cpu_s']):.1f} s), above W0's median at "
        f"{sum(above(w3['sched_cpu_s'], over('W0', 'sched_cpu_s', 'median')))} of {len(clusters)} nC",
        "W3 below W2's median at every nC: "
        + ", ".join(f"{label} {_every(above(w2[m], w3[m]))}"
                    for m, label in ((cc, "configurations"), ("bytes", "bytes"), ("sched_cpu_s", "scheduling CPU")))))
    return md_table(("the paper says", "ours", "agrees? (the rule)"), out)


def markdown(rows: list[dict]) -> dict[str, str]:
    """EXPERIMENTS.md's Fig. 6 tables (median [min–max] over packs; W3 is one run) and the paper's numbers
    next to ours."""
    clusters = sorted({r["clusters"] for r in rows})
    series = list(dict.fromkeys((r["system"], r["workload"]) for r in rows))
    by = {(r["system"], r["workload"], r["clusters"], r["metric"]): r for r in rows}
    parts = []
    for metric, title in MD_TABLES:
        def cell(r: dict, metric: str = metric) -> str:
            if r["packs"] == 1 or r["min"] == r["max"]:
                return _num(metric, r["median"])
            return f"{_num(metric, r['median'])} [{_num(metric, r['min'])}–{_num(metric, r['max'])}]"

        body = [(f"{sy} {w}", *(cell(by[(sy, w, nc, metric)]) for nc in clusters)) for sy, w in series
                if metric != "bytes_per_app" or w != "W1"]
        parts.append(f"{title}:\n\n" + md_table(("series", *(f"nC={nc}" for nc in clusters)), body))

    paper = paper_table(by, clusters)
    packs = max(r["packs"] for r in rows)
    return {"coorm-fig6": f"Median [min–max] over {packs} packs; W3 is a single run.\n\n" + "\n\n".join(parts),
            "coorm-fig6-paper": paper}


def plot(path: Path, rows: list[dict], jobs: int) -> None:
    import matplotlib.pyplot as plt

    panels = (("computed_configurations", "computed configurations"),
              ("sim_cpu_s", "simulation CPU time (s)"),
              ("bytes", "total size of messages (bytes)"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    series = [("OAR-SIM", "W0")] + [("CooRM", w) for w in WORKLOADS]
    for ax, (metric, label) in zip(axes, panels, strict=True):
        for i, (system, w) in enumerate(series):
            pts = sorted((r for r in rows
                          if r["system"] == system and r["workload"] == w and r["metric"] == metric),
                         key=lambda r: r["clusters"])
            if not pts:
                continue
            x = [r["clusters"] + (i - 2) * 0.08 for r in pts]
            med = [r["median"] for r in pts]
            ax.errorbar(x, med, yerr=[[m - r["min"] for m, r in zip(med, pts, strict=True)],
                                      [r["max"] - m for m, r in zip(med, pts, strict=True)]],
                        marker="o", ms=4, capsize=3, label=f"{system} {w}",
                        linestyle="-" if system == "CooRM" else "--")
            ax.fill_between(x, [r["q1"] for r in pts], [r["q3"] for r in pts], alpha=0.15)
        ax.set_yscale("log")
        ax.set_xlabel("clusters (nC)")
        ax.set_title(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"CooRM Fig. 6: packs of {jobs} Atlas jobs (median, q1-q3 band, min-max bars)")
    save(fig, path)


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    require_trace()
    numbers = pack_numbers(cfg["packs"])
    packs = {p: tuple(pack_jobs(p, cfg["jobs"])) for p in numbers}
    # W3 (only CEM applications, all alike, one per second) does not depend on the pack: one run per nC
    tasks = [Task(w, nc, p, packs[p]) for w in WORKLOADS for nc in cfg["clusters"]
             for p in (numbers[:1] if w == "W3" else numbers)]
    tasks.sort(key=lambda t: (COST[t.workload], -t.clusters, t.pack))
    runs = run_tasks(run_one, tasks)
    runs.sort(key=lambda r: (WORKLOADS.index(r["workload"]), r["clusters"], r["pack"]))
    out = Path(out)
    write_csv(out / f"{NAME}-runs.csv", runs)
    rows = aggregate(runs, cfg["clusters"])
    write_csv(out / f"{NAME}.csv", rows)
    plot(out / f"{NAME}.png", rows, cfg["jobs"])
    return rows
