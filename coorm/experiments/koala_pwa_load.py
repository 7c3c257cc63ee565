"""KOALA Fig. 8 under other users' load: ``koala-pwa`` (FPSMA against EGS, precedence to waiting applications,
W'm and W'mr, 30 s between arrivals, DAS3 with worst-fit) with a background of rigid jobs from other users on
every cluster (:func:`coorm.experiments.koala.background_jobs`: Poisson arrivals offering a nominal share of
each cluster's nodes, 1-8 nodes, 10 min on average, bypassing KOALA's placement and threshold).

Why: ``koala-pwa`` finds three of the paper's trends opposite (EGS leaves fewer jobs at their minimum than
FPSMA; EGS's response time is not the worst), and EXPERIMENTS.md read that as the paper's overload coming
from DAS3's concurrent users, which koala-pwa does not model. This experiment models them and says whether
the trends appear under load. The rows without background are runs of koala-pwa's DAS3 rows (its first two
seeds).

``--live`` runs the same launchers over ``coorm up`` at koala-pra/pwa's reduced size
(:mod:`coorm.experiments.koala_live`), W'm, with other users' rigid jobs (1-2 nodes, times divided as the
applications') at 0 and 90 % nominal load."""

from __future__ import annotations

import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from coorm.experiments import koala
from coorm.experiments.common import md_table, write_csv

NAME = "koala-pwa-load"
LOADS = (0.0, 0.5, 0.9)  # other users' nominal load on each cluster
SEEDS = 2  # koala-pwa has 4; a run at 90 % load costs some ten times one without (a budget choice)
QUICK = (60, 1, (0.0, 0.9))  # jobs, seeds, loads
INTERARRIVAL = 30.0
KEYS = (*koala.KEYS, "background_offered_pct")


WORKERS = 2  # this machine's cores; every run is seeded, so the rows do not depend on it


def _one(args: tuple[str, str, str, float, float, int, int]) -> dict:
    policy, precedence, workload, load, interarrival, jobs, seed = args
    return koala.simulate(policy, precedence, workload, jobs=jobs, interarrival=interarrival, seed=seed,
                          background=load)


def run(out: Path, quick: bool = False, workers: int = WORKERS) -> list[dict]:
    jobs, seeds, loads = QUICK if quick else (koala.FULL[0], SEEDS, LOADS)
    return run_loads(NAME, "waiting", (INTERARRIVAL,), loads, jobs, seeds, out, workers)


def run_loads(name: str, precedence: str, interarrivals: tuple[float, ...], loads: tuple[float, ...], jobs: int,
              seeds: int, out: Path, workers: int = WORKERS) -> list[dict]:
    """KOALA's DAS3 runs (worst-fit, both workloads, both policies) at each inter-arrival and other users'
    load, ``seeds`` each, means per cell (koala-pwa-load's, and koala-pra-load's)."""
    cells = [(policy, workload, load, ia) for ia in interarrivals for load in loads for workload in koala.WORKLOADS
             for policy in koala.POLICIES]
    tasks = [(p, precedence, w, load, ia, jobs, s) for p, w, load, ia in cells for s in range(seeds)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(tasks, pool.map(_one, tasks), strict=True))
    rows = []
    for policy, workload, load, ia in cells:
        runs = [results[policy, precedence, workload, load, ia, jobs, s] for s in range(seeds)]
        row = {"background": load, "policy": policy, "precedence": precedence, "workload": workload,
               "placement": koala.PLACEMENT, "nodes": sum(koala.DAS3.values()),
               "interarrival_s": ia, "jobs": jobs, "seeds": len(runs),
               "unfinished": sum(r["malleable"] - r["finished"] for r in runs)}
        row |= {k: statistics.fmean(r.get(k, 0.0) for r in runs) for k in KEYS}
        row["wait_mean_s"] = row["response_mean_s"] - row["exec_mean_s"]
        rows.append(row)
    write_csv(out / f"{name}.csv", rows)
    return rows


def markdown(rows: list[dict]) -> dict[str, str]:
    table, checks = loads_markdown(rows, "waiting")
    r0 = rows[0]
    seeds = f"{r0['seeds']} seed{'s' if r0['seeds'] != 1 else ''}"
    return {NAME: f"Ours: {r0['jobs']} jobs, one inter-arrival of {r0['interarrival_s']:g} s, means over {seeds}"
                  f"; DAS3's five clusters ({r0['nodes']} nodes), each KOALA job placed by worst-fit, "
                  f"{koala.THRESHOLD} nodes of each cluster kept for local users; other users' rigid jobs on every "
                  "cluster at the nominal load shown (in brackets: what the drawn jobs offer, in node-seconds over "
                  "the arrival window). Utilisation counts every job, other users' too.\n\n" + table + "\n\n"
                  + checks}


def loads_markdown(rows: list[dict], precedence: str) -> tuple[str, str]:
    """The rows' table (an inter-arrival column when they have more than one) and the paper's statements
    checked at each inter-arrival and load."""
    several = len({r["interarrival_s"] for r in rows}) > 1
    table = md_table(
        (*(("inter-arrival (s)",) if several else ()), "other users' load (offered)", "workload", "policy",
         "exec. time (s)", "response time (s)", "wait (s)", "avg size", "max size", "stuck at 2 (%)",
         "utilisation (%)", "grows", "shrinks"),
        [(*((f"{r['interarrival_s']:g}",) if several else ()),
          f"{100 * r['background']:.0f} % ({r['background_offered_pct']:.0f} %)", r["workload"],
          r["policy"].upper(), f"{r['exec_mean_s']:.0f}", f"{r['response_mean_s']:.0f}", f"{r['wait_mean_s']:.0f}",
          f"{r['avg_size']:.1f}", f"{r['max_size_mean']:.1f}", f"{r['stuck_at_min_pct']:.0f}",
          f"{r['utilisation_pct']:.1f}", f"{r['grows']:.0f}", f"{r['shrinks']:.0f}") for r in rows])
    checks = []
    for ia in dict.fromkeys(r["interarrival_s"] for r in rows):
        for load in sorted({r["background"] for r in rows}):
            at = [r for r in rows if r["background"] == load and r["interarrival_s"] == ia]
            for statement, verdict in koala.trends(at, precedence):
                checks.append(f"- {f'{ia:g} s apart, ' if several else ''}{100 * load:.0f} % load: "
                              f"{verdict if verdict == 'holds' else f'**{verdict}**'}: {statement}")
    return table, "\n".join(checks)


LIVE_LOADS = (0.0, 0.9)


def run_live(out: Path, quick: bool = False) -> list[dict]:
    """The same launchers over ``coorm up``, at a reduced size, without and with other users' jobs (quick:
    EGS only)."""
    from coorm.experiments import koala_live

    policies = ("egs",) if quick else koala.POLICIES
    return koala_live.run_live(NAME, "waiting", INTERARRIVAL, out, quick, policies=policies, workload="Wm",
                               loads=LIVE_LOADS)


def live_markdown(rows: list[dict]) -> str:
    from coorm.experiments import koala_live

    return koala_live.load_table(rows)
