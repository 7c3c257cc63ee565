"""CooRM Fig. 7: unfairness caused by an insufficient fair-start -- the end-time increase of a CEM application
with a lengthy resource selection (adaptation delay), empirical CDF over workload instances.

Set-up (CooRM §IV-C): workloads W1 of Fig. 6 (:func:`coorm.experiments.coorm_fig6.build_workload`: a pack of
Atlas jobs, 20% simple-moldable, one arrival per second, and one CEM application inserted) on ``nC`` = 4
clusters of the paper's platform, re-policy interval 1 s, fair-start 5 s. The CEM launcher gets an
*adaptation delay*: every view it receives arms a timer, and it answers with a new request (computed on the
latest view) only when the timer expires (:class:`coorm.launchers.cem.CEMLauncher`, ``adaptation_delay``).

An *instance* is a pack and an insertion position of the CEM (a fraction of the pack: it arrives after that
many jobs, the later jobs one second later). For each instance and delay ``d`` we run the whole workload and
record the CEM's end time; the **end-time increase** is ``end(d) - end(0)``, the same instance with an instant
answer. The simulation is stopped once the CEM has finished (nothing after its end can change it). Plotted:
the empirical CDF of the increase per delay; the CSV holds per delay the quartiles, mean, 95th percentile,
the fraction of instances delayed at all (> 1 s), by more than 10 minutes and by more than an hour
(``NAME-runs.csv``: every run).

Full mode: 4 packs (those of :func:`coorm.experiments.coorm_fig6.pack_numbers`) x 3 positions (a quarter, half and
three quarters of the pack) = 12 instances, delays 0, 1, 2, 5, 10, 20, 30 s. Quick mode: one of those packs,
whole (200 jobs), its 3 positions, delays 0, 2, 10 s. It is the second pack, chosen because there, and not
in short packs, the CEM waits for nodes that other jobs release early: a delay longer than the fair-start
loses them (increases of minutes at 10 s), a shorter one does not (0), and with no fair-start at all even
the instant launcher loses them, so that the increase vanishes -- the quick result exercises the mechanism
the figure is about. In packs cut to 50 jobs the CEM hardly waits, and what increase there is comes from its
*first* selection: until it has sent a request, jobs arriving during its adaptation delay start before it
(the fair-start protects nodes released by ``done``, not a newcomer's first answer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from coorm.experiments.common import quartiles, save, write_csv
from coorm.experiments.coorm_fig6 import (
    FAIR_START,
    build_workload,
    new_simulation,
    pack_jobs,
    pack_numbers,
    pack_seed,
    platform,
    require_trace,
    run_tasks,
)
from coorm.launchers.cem import CEMLauncher
from coorm.simulator.trace import TraceJob

NAME = "coorm-fig7"

# packs: which of the 4 packs spread over the trace (fig6.pack_numbers(4)) are replayed
FULL = dict(clusters=4, delays=(0, 1, 2, 5, 10, 20, 30), packs=(0, 1, 2, 3), positions=(0.25, 0.5, 0.75),
            jobs=200)
# one pack of the full mode, whole: the second, where the fair-start decides (see the module docstring)
QUICK = dict(clusters=4, delays=(0, 2, 10), packs=(1,), positions=(0.25, 0.5, 0.75), jobs=200)
HOUR = 3600.0


class _CemFinished(Exception):
    pass


@dataclass(frozen=True)
class Task:
    clusters: int
    pack: int
    position: int
    delay: float
    jobs: tuple[TraceJob, ...]


def run_one(task: Task) -> dict:
    _, props = platform(task.clusters)
    sim = new_simulation(props, fair_start=FAIR_START)
    launchers = build_workload(task.jobs, props, "W1", seed=pack_seed(task.pack), cem_position=task.position,
                               cem_delay=task.delay)
    cem = next(lau for lau in launchers if isinstance(lau, CEMLauncher))
    for k, lau in enumerate(launchers):
        sim.add(float(k), lau)

    def stop_when_cem_ends(_sim) -> None:
        if cem.finished:
            raise _CemFinished

    t0 = time.process_time()
    try:
        sim.run(progress=stop_when_cem_ends)
    except _CemFinished:
        pass
    cpu = time.process_time() - t0
    if cem.ended_at is None:
        raise RuntimeError(f"{task}: the CEM application never ended")
    sel = cem.selection
    return {
        "clusters": task.clusters,
        "pack": task.pack,
        "position": task.position,
        "delay": task.delay,
        "cem_submitted": float(task.position),
        "cem_start": cem.started_at,
        "cem_end": cem.ended_at,
        "cem_hosts": sel.total_hosts if sel else 0,
        "cem_clusters": len(sel.hosts) if sel else 0,
        "cem_runtime": sel.duration if sel else None,
        "cem_resubmissions": cem.resubmissions,
        "cem_computed_configurations": cem.computed_configurations,
        "cpu_s": cpu,
    }


def increases(runs: list[dict]) -> list[dict]:
    """Each run with ``increase``: its CEM's end minus the end with delay 0 in the same instance."""
    base = {(r["pack"], r["position"]): r["cem_end"] for r in runs if r["delay"] == 0}
    for r in runs:
        r["increase"] = r["cem_end"] - base[(r["pack"], r["position"])]
    return runs


def summarize(runs: list[dict], delays) -> list[dict]:
    rows = []
    for d in delays:
        inc = sorted(r["increase"] for r in runs if r["delay"] == d)
        n = len(inc)
        rows.append({
            "delay": d,
            "fair_start": FAIR_START,
            "instances": n,
            **quartiles(inc),
            "mean": sum(inc) / n,
            "p95": inc[min(n - 1, int(0.95 * n))],
            "frac_delayed": sum(x > 1.0 for x in inc) / n,
            "frac_over_10min": sum(x > 600.0 for x in inc) / n,
            "frac_over_1h": sum(x > HOUR for x in inc) / n,
            "frac_earlier": sum(x < -1.0 for x in inc) / n,
        })
    return rows


def plot(path: Path, runs: list[dict], delays, clusters: int, jobs: int) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for d in delays:
        inc = sorted(r["increase"] for r in runs if r["delay"] == d)
        n = len(inc)
        ax.step([inc[0]] + inc, [0.0] + [(i + 1) / n for i in range(n)], where="post", label=f"delay {d:g} s")
    ax.set_xscale("symlog", linthresh=10)
    ax.axvline(HOUR, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("end-time increase of the CEM application (s)")
    ax.set_ylabel("empirical CDF")
    ax.set_title(f"CooRM Fig. 7: fair-start {FAIR_START:g} s, W1 ({jobs} jobs), {clusters} clusters")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    save(fig, path)


def run(out: Path, quick: bool = False) -> list[dict]:
    cfg = QUICK if quick else FULL
    require_trace()
    spread = pack_numbers(4)
    tasks = []
    for p in (spread[i] for i in cfg["packs"]):
        jobs = tuple(pack_jobs(p, cfg["jobs"]))
        for frac in cfg["positions"]:
            pos = round(frac * len(jobs))
            tasks.extend(Task(cfg["clusters"], p, pos, float(d), jobs) for d in cfg["delays"])
    runs = increases(run_tasks(run_one, tasks))
    out = Path(out)
    write_csv(out / f"{NAME}-runs.csv", runs)
    rows = summarize(runs, [float(d) for d in cfg["delays"]])
    write_csv(out / f"{NAME}.csv", rows)
    plot(out / f"{NAME}.png", runs, [float(d) for d in cfg["delays"]], cfg["clusters"], cfg["jobs"])
    return rows
