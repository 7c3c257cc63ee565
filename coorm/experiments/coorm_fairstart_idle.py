"""CooRM §IV-C: the idle time the fair-start causes -- node-time left idle because nodes freed by an early
``done`` are held for ``fair_start`` seconds.

The paper estimates it, without a run: "the traces used in the experiments have an average job runtime
of 1.5 h. Thus, 0.5% of the resources would be wasted, for a fair-start delay of 30 s [...] if the average
job runtime were 5 min, 10% of the resources [would be wasted]" -- i.e. ``fair_start / mean runtime``, as
if every job's end left all its nodes idle for the whole fair-start.

We measure it with the real policy and allocator cores: workloads W0 of Fig. 6
(:func:`coorm.experiments.coorm_fig6.build_workload`: packs of 200 Atlas jobs, 20% simple-moldable, one
arrival per second) on ``nC`` = 4 clusters of the paper's platform, re-policy interval 1 s, fair-start 0,
5 (the paper's setting) and 30 s; once with the trace's runtimes and walltimes (mean runtime 1.7 h over
the whole log) and once with both scaled, per pack, so that the pack's mean runtime is 5 minutes. Per run:

* **held**: the node-seconds the allocator kept nodes in its ``held`` state (integrated between the
  simulation's events) over the platform's node-seconds until the last job ended (hosts x makespan) --
  the idle time the holds cause directly (a held node runs nothing);
* **held / work**: the same node-seconds over the node-seconds allocated to jobs: what the paper's
  ``fair_start / mean runtime`` estimates;
* **makespan increase** and **utilisation loss**: against the same pack with fair-start 0 -- what the
  holds cost the schedule, once other jobs backfilled around them.

Our core holds less than the paper's estimate assumes, by design (``PolicyCore._hold_on_done``): only
nodes freed *before* the request's planned end (a job that reaches its walltime frees nothing early), never
beyond that planned end, only while some adaptive application waits, and only until each of those has
answered. Averages over packs with a seeded bootstrap 95% interval.

Full mode: 6 packs spread over the trace x 2 runtime scales x 3 fair-starts = 36 simulations (about 4 min
on our 2 cores). Quick mode: one pack of 100 jobs, fair-start 0 and 30 s, both scales.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from coorm.experiments.common import bootstrap_ci, md_table, save, write_csv
from coorm.experiments.coorm_fig6 import (
    build_workload,
    new_simulation,
    pack_jobs,
    pack_numbers,
    pack_seed,
    platform,
    require_trace,
    run_tasks,
)
from coorm.services.node_allocator.core import ALLOCATED, HELD
from coorm.simulator.engine import Simulation
from coorm.simulator.trace import TraceJob

NAME = "fairstart-idle"

FIVE_MINUTES = 300.0
FULL: dict = dict(clusters=4, spread=6, packs=(0, 1, 2, 3, 4, 5), jobs=200, fair_starts=(0.0, 5.0, 30.0),
            runtimes=(None, FIVE_MINUTES))
QUICK: dict = dict(clusters=4, spread=4, packs=(1,), jobs=100, fair_starts=(0.0, 30.0), runtimes=(None, FIVE_MINUTES))
# the paper's statements (§IV-C): (mean runtime in s, fair-start in s) -> the share of resources wasted
PAPER = {(5400.0, 30.0): 0.5, (FIVE_MINUTES, 30.0): 10.0}


@dataclass(frozen=True)
class Task:
    clusters: int
    pack: int
    fair_start: float
    mean_runtime: float | None  # None: the trace's runtimes
    jobs: tuple[TraceJob, ...]


def scaled(jobs: tuple[TraceJob, ...], mean_runtime: float | None) -> tuple[TraceJob, ...]:
    """The jobs with runtimes and walltimes multiplied so that their mean runtime is ``mean_runtime``."""
    if mean_runtime is None:
        return jobs
    k = mean_runtime / statistics.fmean(j.runtime for j in jobs)
    return tuple(dataclasses.replace(j, runtime=j.runtime * k, walltime=j.walltime * k) for j in jobs)


class _NodeMeter:
    """``progress`` hook: integrates the allocator's held and allocated node counts between events."""

    def __init__(self) -> None:
        self.t = 0.0
        self.held = self.allocated = 0
        self.held_s = self.allocated_s = 0.0

    def __call__(self, sim: Simulation) -> None:
        dt = sim.now - self.t
        if dt > 0:
            self.held_s += self.held * dt
            self.allocated_s += self.allocated * dt
            self.t = sim.now
        states = [n.state for n in sim.cores.allocator.nodes.values()]
        self.held, self.allocated = states.count(HELD), states.count(ALLOCATED)


def run_one(task: Task) -> dict:
    _, props = platform(task.clusters)
    jobs = scaled(task.jobs, task.mean_runtime)
    sim = new_simulation(props, fair_start=task.fair_start)
    for k, lau in enumerate(build_workload(jobs, props, "W0", seed=pack_seed(task.pack))):
        sim.add(float(k), lau)
    meter = _NodeMeter()
    result = sim.run(progress=meter)
    meter(sim)
    if result.rejections:
        raise RuntimeError(f"{task.pack}: commands refused: {result.rejections[:3]}")
    hosts = sum(props.nodes.values())
    capacity = hosts * sim.now
    return {
        "pack": task.pack,
        "jobs": len(jobs),
        "fair_start": task.fair_start,
        "runtime_scale": "trace" if task.mean_runtime is None else f"{task.mean_runtime:g} s",
        "mean_runtime_s": statistics.fmean(j.runtime for j in jobs),
        "early_ends": sum(j.runtime < j.walltime for j in jobs),
        "makespan_s": sim.now,
        "held_node_s": meter.held_s,
        "allocated_node_s": meter.allocated_s,
        "held_pct": 100.0 * meter.held_s / capacity,
        "held_per_work_pct": 100.0 * meter.held_s / meter.allocated_s,
        "utilisation_pct": 100.0 * meter.allocated_s / capacity,
    }


def summarize(runs: list[dict]) -> list[dict]:
    """Per runtime scale and fair-start: means over packs, with the change from fair-start 0 (same pack)."""
    base = {(r["runtime_scale"], r["pack"]): r for r in runs if r["fair_start"] == 0}
    rows = []
    for scale in dict.fromkeys(r["runtime_scale"] for r in runs):
        for fs in sorted({r["fair_start"] for r in runs if r["runtime_scale"] == scale}):
            mine = [r for r in runs if (r["runtime_scale"], r["fair_start"]) == (scale, fs)]
            mean_runtime = statistics.fmean(r["mean_runtime_s"] for r in mine)
            row: dict = {"runtime_scale": scale, "fair_start": fs, "packs": len(mine), "jobs": mine[0]["jobs"],
                         "mean_runtime_s": mean_runtime,
                         "estimate_pct": 100.0 * fs / mean_runtime,  # the paper's fair_start / mean runtime
                         "paper_pct": PAPER.get((FIVE_MINUTES if scale != "trace" else 5400.0, fs))}
            for key in ("held_pct", "held_per_work_pct", "utilisation_pct"):
                values = [r[key] for r in mine]
                row[key] = statistics.fmean(values)
                row[f"{key}_ci_lo"], row[f"{key}_ci_hi"] = bootstrap_ci(values, seed=int(fs))
            incr = [100.0 * (r["makespan_s"] / base[(scale, r["pack"])]["makespan_s"] - 1) for r in mine]
            loss = [base[(scale, r["pack"])]["utilisation_pct"] - r["utilisation_pct"] for r in mine]
            row["makespan_increase_pct"] = statistics.fmean(incr)
            row["makespan_increase_pct_ci_lo"], row["makespan_increase_pct_ci_hi"] = bootstrap_ci(incr, seed=1)
            row["utilisation_loss_pts"] = statistics.fmean(loss)
            row["utilisation_loss_pts_ci_lo"], row["utilisation_loss_pts_ci_hi"] = bootstrap_ci(loss, seed=2)
            rows.append(row)
    return rows


def _ci(row: dict, key: str, digits: int = 2) -> str:
    return f"{row[key]:.{digits}f} [{row[f'{key}_ci_lo']:.{digits}f}–{row[f'{key}_ci_hi']:.{digits}f}]"


def markdown(rows: list[dict]) -> dict[str, str]:
    table = md_table(
        ("mean runtime", "fair-start (s)", "paper: wasted %", "fair-start / mean runtime %", "held % of node-time",
         "held % of the jobs' node-time", "makespan increase %", "utilisation loss (points)"),
        [(f"{r['mean_runtime_s'] / 3600:.2f} h" if r["runtime_scale"] == "trace"
          else f"{r['mean_runtime_s'] / 60:.0f} min",
          f"{r['fair_start']:g}", "—" if r["paper_pct"] is None else f"{r['paper_pct']:g}",
          f"{r['estimate_pct']:.2f}", _ci(r, "held_pct"), _ci(r, "held_per_work_pct"),
          _ci(r, "makespan_increase_pct"), _ci(r, "utilisation_loss_pts"))
         for r in rows])
    packs, jobs = rows[0]["packs"], rows[0]["jobs"]
    return {NAME: f"W0, nC = 4, {packs} packs of {jobs} jobs; means over packs [seeded bootstrap 95% interval]; "
                  "the increase and the loss against fair-start 0 in the same pack.\n\n" + table}


def plot(path: Path, rows: list[dict]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for scale in dict.fromkeys(r["runtime_scale"] for r in rows):
        mine = [r for r in rows if r["runtime_scale"] == scale]
        x = [r["fair_start"] for r in mine]
        ax.plot(x, [r["held_pct"] for r in mine], marker="o", label=f"held, runtimes {scale}")
        ax.plot(x, [r["estimate_pct"] for r in mine], ls="--", label=f"fair-start / mean runtime, {scale}")
    ax.set_xlabel("fair-start (s)")
    ax.set_ylabel("% of node-time")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_title("CooRM §IV-C: node-time idle because of fair-start holds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    require_trace()
    spread = pack_numbers(cfg["spread"])
    tasks = [Task(cfg["clusters"], spread[i], fs, mr, tuple(pack_jobs(spread[i], cfg["jobs"])))
             for i in cfg["packs"] for mr in cfg["runtimes"] for fs in cfg["fair_starts"]]
    runs = run_tasks(run_one, tasks)
    out = Path(out)
    write_csv(out / f"{NAME}-runs.csv", runs)
    rows = summarize(runs)
    write_csv(out / f"{NAME}.csv", rows)
    plot(out / f"{NAME}.png", rows)
    return rows
