"""Issue 15's malleable-fraction study: a real PWA trace with 0 to 100 % of its jobs made malleable, under each
malleability policy, against the all-rigid replay.

The workload: ``JOBS`` consecutive jobs of the Parallel Workloads Archive's cleaned SDSC SP2 log (128
nodes, one cluster; from job ``SKIP`` on, past the log's first days), replayed at their own submit times
(``coorm simulate``'s ``--arrivals trace``). A fraction F of the jobs, drawn with the seed among the rigid
ones (the simulator's ``--malleable-fraction F``, :mod:`coorm.simulator.replay`), become malleable: the
job's ``n`` nodes for its run time become ``n`` single-node tasks of that run time, run by the shipped
malleable launcher (the PSA) on however many nodes the policy lends it -- never more than ``n``, from one
node on; a task a shrink kills runs again. The policy core the live system runs shares the preemptible
capacity: ``filling`` and ``strict`` (CooRMv2), ``fpsma`` and ``egs`` (KOALA), under precedence to waiting
requests (a waiting rigid job makes malleable ones shrink). Seeds: ``SEEDS``, the same trace slice each
time, the draw of which jobs are malleable moving with the seed; each seed's figures are compared with the
all-rigid replay of the same slice (paired).

Metrics (:mod:`coorm.simulator.metrics`): mean wait (submit to first start: a malleable job starts as soon
as one node is free), mean turnaround (submit to end), makespan and utilisation over the run.

What a 2026 ElastiSim study reports for the best strategy (Cori, Eagle, Theta workloads, malleable jobs
with speed-up models): turnaround -37 to -67 %, wait -73 to -99 %. Our malleable jobs have no speed-up
model beyond their tasks (a job never runs faster than rigid, only earlier and narrower), which bounds
what they can gain.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from coorm.experiments import common

NAME = "malleable-fraction"
TRACE = "SDSC-SP2-1998-4.2-cln"  # found by name (coorm trace list: the cache, COORM_TRACES, ../shared/workloads)
NODES = 128
JOBS, SKIP = 200, 1000
SEEDS = (1, 2, 3)
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
POLICIES = ("filling", "strict", "fpsma", "egs")
PAPER = ("ElastiSim (2026), Cori/Eagle/Theta workloads, the best strategy against all-rigid: turnaround "
         "-37 to -67 %, wait -73 to -99 %.")
METRICS = ("turnaround_mean", "wait_mean", "makespan", "utilisation")


def scenario(policy: str, jobs: int = JOBS):
    from coorm.simulator.scenario import Scenario
    from coorm.simulator.traces import locate

    return Scenario.model_validate({
        "clusters": {"c0": NODES}, "policy": {"preemptible": policy, "precedence": "waiting"},
        "trace": {"file": str(locate(TRACE)), "jobs": jobs, "skip": SKIP, "arrival_interval": None, "seed": 1}})


def run(out: Path, quick: bool = False) -> list[dict]:
    from coorm.simulator.replay import ReplayOptions
    from coorm.simulator.run import read_trace, run_once

    seeds = SEEDS[:1] if quick else SEEDS
    fractions = (0.0, 0.5, 1.0) if quick else FRACTIONS
    policies = ("filling", "egs") if quick else POLICIES
    jobs_n = 100 if quick else JOBS
    trace = read_trace(scenario("filling", jobs_n))
    rigid: dict[int, dict] = {}
    rows = []
    for seed in seeds:  # the all-rigid replay: no preemptible request, the policy plays no part
        t0 = time.perf_counter()
        rigid[seed] = run_once(scenario("filling", jobs_n), ReplayOptions(seed=seed), jobs=trace).metrics
        rows.append(_row("rigid", 0.0, seed, rigid[seed], rigid[seed], time.perf_counter() - t0, jobs_n))
    for policy in policies:
        sc = scenario(policy, jobs_n)
        for f in fractions:
            if f == 0.0:
                continue
            first = None
            for seed in seeds:
                t0 = time.perf_counter()
                if f == 1.0 and first is not None:
                    m = first  # every job malleable: the seed draws nothing that differs (the run is the same)
                else:
                    m = run_once(sc, ReplayOptions(seed=seed, malleable_fraction=f), jobs=trace).metrics
                first = first or m
                rows.append(_row(policy, f, seed, m, rigid[seed], time.perf_counter() - t0, jobs_n))
    common.write_csv(out / f"{NAME}.csv", rows)
    return rows


def _row(policy: str, fraction: float, seed: int, m: dict, base: dict, wall: float, jobs: int) -> dict:
    row: dict = {"policy": policy, "fraction": fraction, "seed": seed, "jobs": jobs,
                 "unfinished": m["unfinished"], "wall_s": round(wall, 2)}
    for k in METRICS:
        row[k] = round(m[k], 4)
        row[f"{k}_vs_rigid_pct"] = round(100.0 * (m[k] - base[k]) / base[k], 2) if base[k] else None
    return row


def summary(rows: list[dict]) -> list[dict]:
    """Per policy and fraction: the mean over seeds of each metric and of its change against the all-rigid
    replay of the same seed."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["fraction"]), []).append(r)
    out = []
    for (policy, f), rs in groups.items():
        s: dict = {"policy": policy, "fraction": f, "seeds": len(rs)}
        for k in METRICS:
            s[k] = statistics.fmean(r[k] for r in rs)
            s[f"{k}_pct"] = statistics.fmean(r[f"{k}_vs_rigid_pct"] for r in rs)
        out.append(s)
    return out


def markdown(rows: list[dict]) -> dict[str, str]:
    s = summary(rows)
    table = common.md_table(
        ["policy", "malleable", "turnaround (s)", "vs rigid", "wait (s)", "vs rigid", "makespan (h)", "vs rigid",
         "utilisation (%)"],
        [[r["policy"], f"{100 * r['fraction']:.0f} %", f"{r['turnaround_mean']:,.0f}",
          f"{r['turnaround_mean_pct']:+.1f} %" if r["policy"] != "rigid" else "—", f"{r['wait_mean']:,.0f}",
          f"{r['wait_mean_pct']:+.1f} %" if r["policy"] != "rigid" else "—", f"{r['makespan'] / 3600:,.1f}",
          f"{r['makespan_pct']:+.1f} %" if r["policy"] != "rigid" else "—", f"{100 * r['utilisation']:.1f}"]
         for r in s])
    best = min((r for r in s if r["policy"] != "rigid"), key=lambda r: r["turnaround_mean_pct"])
    jobs = rows[0]["jobs"]
    seeds = max(r["seeds"] for r in s)
    unfinished = sum(r["unfinished"] for r in rows)
    return {NAME: f"**2026 study:** {PAPER}\n\nOurs: {jobs} jobs of SDSC SP2 (from job {SKIP + 1}) at their own submit "
                  f"times on {NODES} nodes, means over {seeds} seeds, each against the all-rigid replay of the same "
                  f"seed; {unfinished} job(s) unfinished.\n\n" + table + "\n\n"
                  f"Best turnaround: {best['policy']} at {100 * best['fraction']:.0f} % malleable, "
                  f"{best['turnaround_mean_pct']:+.1f} % (wait {best['wait_mean_pct']:+.1f} %)."}
