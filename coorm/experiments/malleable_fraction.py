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

Two models of a malleable job: ``psa`` as above (``coorm simulate --malleable-fraction``), and
``negotiating``: the shipped negotiating launcher (``coorm launch malleable``), its minimum a quarter of the
job's nodes (rounded up; non-preemptible), growing by negotiation up to the job's nodes with preemptible
requests (any size), its work the job's node-seconds done at the rate of the nodes it holds -- nothing is
lost when it shrinks (whole growth requests go back; the work goes on on the rest). Its replays cost some
five times the PSA's (a negotiation round per growth, views per offer): its full run has fewer seeds and
fractions (``FULL``).

Metrics (:mod:`coorm.simulator.metrics`): mean wait (submit to first start: a malleable job starts as soon
as one node is free), mean turnaround (submit to end), makespan and utilisation over the run.

What a 2026 ElastiSim study reports for the best strategy (Cori, Eagle, Theta workloads, malleable jobs
with speed-up models): turnaround -37 to -67 %, wait -73 to -99 %. Our malleable jobs have no speed-up
beyond linear (a job never runs faster than the rigid job on its ``n`` nodes, only earlier, and narrower),
which bounds what they can gain; EXPERIMENTS.md says where we stand and why.
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
# each model's full run: seeds and fractions (the negotiating replays cost some 5x the PSA's: fewer of them)
FULL = {"psa": (SEEDS, FRACTIONS), "negotiating": ((1, 2), (0.0, 0.5, 1.0))}
POLICIES = ("filling", "strict", "fpsma", "egs")
PAPER = ("ElastiSim (2026), Cori/Eagle/Theta workloads, the best strategy against all-rigid: turnaround "
         "-37 to -67 %, wait -73 to -99 %.")
METRICS = ("turnaround_mean", "wait_mean", "makespan", "utilisation")
MODELS = ("psa", "negotiating")


def scenario(policy: str, jobs: int = JOBS):
    from coorm.simulator.scenario import Scenario
    from coorm.simulator.traces import locate

    return Scenario.model_validate({
        "clusters": {"c0": NODES}, "policy": {"preemptible": policy, "precedence": "waiting"},
        "trace": {"file": str(locate(TRACE)), "jobs": jobs, "skip": SKIP, "arrival_interval": None, "seed": 1}})


def run(out: Path, quick: bool = False, models: tuple[str, ...] = MODELS) -> list[dict]:
    """The rows of every (model, policy, fraction, seed), and the all-rigid replay's (``models``: a part of
    them, e.g. to run the two models in two processes)."""
    from coorm.simulator.run import read_trace

    plans = {m: (SEEDS[:1], (0.0, 0.5, 1.0)) if quick else FULL[m] for m in models}
    policies = ("filling", "egs") if quick else POLICIES
    jobs_n = 100 if quick else JOBS
    trace = read_trace(scenario("filling", jobs_n))
    rigid: dict[int, dict] = {}
    rows = []
    for seed in sorted({s for seeds, _ in plans.values() for s in seeds}):
        t0 = time.perf_counter()  # the all-rigid replay: no preemptible request, the policy plays no part
        rigid[seed] = simulate(scenario("filling", jobs_n), 0.0, seed, "psa", trace)
        rows.append(_row("rigid", "-", 0.0, seed, rigid[seed], rigid[seed], time.perf_counter() - t0, jobs_n))
    for model in models:
        seeds, fractions = plans[model]
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
                        m = simulate(sc, f, seed, model, trace)
                    first = first or m
                    rows.append(_row(policy, model, f, seed, m, rigid[seed], time.perf_counter() - t0, jobs_n))
    common.write_csv(out / f"{NAME}.csv", rows)
    return rows


def simulate(sc, fraction: float, seed: int, model: str, trace) -> dict:
    """One replay's metrics: the simulator's plan of the workload (``--malleable-fraction``), its malleable
    jobs as ``model`` makes them, through the simulator (the policy core the live system runs)."""
    from coorm.simulator.engine import Simulation
    from coorm.simulator.metrics import compute
    from coorm.simulator.replay import ReplayOptions, plan
    from coorm.simulator.summary import job_records

    planned = plan(sc, ReplayOptions(seed=seed, malleable_fraction=fraction, malleable_model=model), trace)
    sim = Simulation(sc.sizes, sc.policy, sc.props())
    for p in planned:
        if p.launcher is not None:
            sim.add(p.at, p.launcher, p.name)
    result = sim.run()
    return compute(job_records(result, planned), NODES)


def _row(policy: str, model: str, fraction: float, seed: int, m: dict, base: dict, wall: float, jobs: int) -> dict:
    row: dict = {"policy": policy, "model": model, "fraction": fraction, "seed": seed, "jobs": jobs,
                 "unfinished": m["unfinished"], "wall_s": round(wall, 2)}
    for k in METRICS:
        row[k] = round(m[k], 4)
        row[f"{k}_vs_rigid_pct"] = round(100.0 * (m[k] - base[k]) / base[k], 2) if base[k] else None
    return row


def summary(rows: list[dict]) -> list[dict]:
    """Per policy and fraction: the mean over seeds of each metric and of its change against the all-rigid
    replay of the same seed."""
    groups: dict[tuple[str, str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["policy"], r["fraction"]), []).append(r)
    out = []
    for (model, policy, f), rs in groups.items():
        s: dict = {"model": model, "policy": policy, "fraction": f, "seeds": len(rs)}
        for k in METRICS:
            s[k] = statistics.fmean(r[k] for r in rs)
            s[f"{k}_pct"] = statistics.fmean(r[f"{k}_vs_rigid_pct"] for r in rs)
        out.append(s)
    return out


def markdown(rows: list[dict]) -> dict[str, str]:
    s = summary(rows)
    table = common.md_table(
        ["model", "policy", "malleable", "turnaround (s)", "vs rigid", "wait (s)", "vs rigid", "makespan (h)",
         "vs rigid", "utilisation (%)"],
        [[r["model"], r["policy"], f"{100 * r['fraction']:.0f} %", f"{r['turnaround_mean']:,.0f}",
          f"{r['turnaround_mean_pct']:+.1f} %" if r["policy"] != "rigid" else "—", f"{r['wait_mean']:,.0f}",
          f"{r['wait_mean_pct']:+.1f} %" if r["policy"] != "rigid" else "—", f"{r['makespan'] / 3600:,.1f}",
          f"{r['makespan_pct']:+.1f} %" if r["policy"] != "rigid" else "—", f"{100 * r['utilisation']:.1f}"]
         for r in s])
    bests = []
    for model in MODELS:
        best = min((r for r in s if r["model"] == model), key=lambda r: r["turnaround_mean_pct"])
        bests.append(f"{model}: {best['policy']} at {100 * best['fraction']:.0f} % malleable, "
                     f"{best['turnaround_mean_pct']:+.1f} % (wait {best['wait_mean_pct']:+.1f} %)")
    jobs = rows[0]["jobs"]
    per_model = ", ".join(f"{m}: {max(r['seeds'] for r in s if r['model'] == m)}" for m in MODELS
                          if any(r["model"] == m for r in s))
    unfinished = sum(r["unfinished"] for r in rows)
    return {NAME: f"**2026 study:** {PAPER}\n\nOurs: {jobs} jobs of SDSC SP2 (from job {SKIP + 1}) at their own submit "
                  f"times on {NODES} nodes, means over seeds ({per_model}), each against the all-rigid replay of "
                  f"the same seed; {unfinished} job(s) unfinished.\n\n" + table + "\n\n"
                  "Best turnaround, " + "; ".join(bests) + f".\n\n{bound(rows)}"}


def run_live(out: Path, quick: bool = False, model: str = "psa") -> list[dict]:
    """The same launchers over ``coorm up``, at a reduced size (:mod:`coorm.experiments.malleable_fraction_live`),
    the malleable jobs ``model``'s (``psa`` or ``negotiating``)."""
    from coorm.experiments import malleable_fraction_live

    return malleable_fraction_live.run_live(out, quick, model=model)


def live_markdown(rows: list[dict]) -> str:
    from coorm.experiments import malleable_fraction_live

    return malleable_fraction_live.table(rows)


def bound(rows: list[dict]) -> str:
    """The most a malleable job that never runs faster than the rigid one can take off the mean turnaround:
    all of the rigid replay's wait (turnaround = wait + run)."""
    rigid = [r for r in rows if r["policy"] == "rigid"]
    cut = statistics.fmean(100.0 * r["wait_mean"] / r["turnaround_mean"] for r in rigid)
    return (f"The bound: in the all-rigid replay the wait is {cut:.1f} % of the mean turnaround (mean over its "
            f"{len(rigid)} seeds), so a malleable job that never runs faster than the rigid one on its nodes "
            f"takes at most {cut:.1f} % off it.")
