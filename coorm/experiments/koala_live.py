"""KOALA's experiments live (``coorm experiment koala-pra --live``, ``koala-pwa --live``): the same launcher
objects as the simulated runs (:class:`~coorm.experiments.koala.KoalaMalleable` and
:class:`~coorm.experiments.koala.PlacedRigid`, placed by the RMS by worst-fit), each through
:class:`~coorm.launchers.live.LiveRunner` over ``coorm up`` (nats-server, valkey, every service, one node
agent per cluster starting a real ``sleep`` on each node a job holds), under ``COORM_MALLEABLE_POLICY``,
``COORM_PRECEDENCE`` and ``COORM_LOCAL_THRESHOLD`` as the simulated runs set them.

At a reduced size: DAS3's five clusters at an eighth of their nodes (:data:`CLUSTERS`), one node of each
kept for local users, the applications' times divided by :data:`SPEED` (GADGET 2 runs 600 / 20 = 30 s on
2 nodes), ``JOBS`` jobs, one seed, the inter-arrival time divided by ``SPEED`` too. The metrics are the
simulated runs' (:func:`coorm.experiments.koala.simulate`), in the launchers' own clock (wall time).
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections import Counter
from dataclasses import replace
from pathlib import Path

from coorm.experiments import common, koala

CLUSTERS = {"vu": 11, "uva": 5, "delft": 8, "multimedian": 6, "leiden": 4}  # DAS3 / 8 (rounded)
SPEED = 20.0
THRESHOLD = 1
JOBS, QUICK_JOBS = 12, 6
LONG = ["sleep", "3600"]  # a job's process on each of its nodes (killed when the node goes back)


PASS = 0.2  # seconds between the live passes (COORM_RESCHEDULE_INTERVAL): the simulated runs' 1 s
GRACE = 3.0  # a mandatory shrink's (COORM_PREEMPT_GRACE)


def env(policy: str, precedence: str, interval: float = PASS) -> dict[str, str]:
    """The system's settings; ``interval`` above :data:`PASS`: KOALA's polling (koala-pwa-growth), one pass at
    most in so many seconds (no burst of passes within an interval, as in the simulated runs); a mandatory
    shrink's grace stays :data:`GRACE`, shorter than such an interval, as the simulated polls keep theirs."""
    polling = interval > PASS
    return {"COORM_MALLEABLE_POLICY": policy, "COORM_PRECEDENCE": precedence,
            "COORM_LOCAL_THRESHOLD": str(THRESHOLD), "COORM_RESCHEDULE_INTERVAL": f"{interval:g}",
            **({"COORM_PASS_BURST": "1"} if polling else {}),
            "COORM_FAIR_START": "0", "COORM_PREEMPT_GRACE": f"{GRACE:g}",
            "COORM_KILL_GRACE": "1", "COORM_LOG_LEVEL": "WARNING", "COORM_SESSION_TIMEOUT": "60"}


def run_live(name: str, precedence: str, interarrival: float, out: Path, quick: bool = False,
             policies: tuple[str, ...] = koala.POLICIES, workload: str = "Wmr",
             loads: tuple[float, ...] = (0.0,), intervals: tuple[float, ...] = (PASS,)) -> list[dict]:
    """One live run per other users' load, pass interval and policy (workload ``Wmr``: malleable and rigid
    jobs; ``Wm``: all malleable), each on a system started for it."""
    from coorm.cli.up import Up

    rows = []
    for load in loads:
        for interval in intervals:
            for policy in policies:
                up = Up(CLUSTERS, env=env(policy, precedence, interval), write_connection=False, accounting=False)
                try:
                    settings = up.start(180)
                    row = asyncio.run(_run(settings, policy, precedence, interarrival / SPEED,
                                           QUICK_JOBS if quick else JOBS, workload=workload, background=load))
                finally:
                    up.stop()
                rows.append(row | {"poll_s": interval})
    common.write_csv(out / f"{name}-live.csv", rows)
    return rows


# other users' rigid jobs at the reduced size (``background``): 1-2 nodes (clusters of 4-11), their run times
# divided by SPEED as the applications' are
BACKGROUND_SIZES = (1, 2)
BACKGROUND_RUN = (koala.BACKGROUND_RUN[0] / SPEED, koala.BACKGROUND_RUN[1] / SPEED, koala.BACKGROUND_RUN[2] / SPEED)


async def _run(settings, policy: str, precedence: str, interarrival: float, jobs: int, seed: int = 0,
               workload: str = "Wmr", background: float = 0.0) -> dict:
    import time

    from coorm.launchers.live import LiveRunner
    from coorm.launchers.rigid import RigidLauncher
    from coorm.launchers.sdk import Session

    rng = random.Random(seed)
    curves = {c.name: replace(c, t2=c.t2 / SPEED, best=c.best / SPEED) for c in (koala.GADGET2, koala.FT)}
    # other users' jobs over KOALA's arrivals, on their own clusters (koala.background_jobs, reduced)
    others = koala.background_jobs(CLUSTERS, background, jobs * interarrival, seed, BACKGROUND_SIZES,
                                   BACKGROUND_RUN) if background else []
    arrivals = sorted([(i * interarrival, i, None) for i in range(jobs)]
                      + [(at, jobs + k, b) for k, (at, b) in enumerate(others)], key=lambda a: (a[0], a[1]))
    t0 = time.time()
    malleable: list[tuple[koala.KoalaMalleable, float]] = []
    tasks = []
    for offset, i, other in arrivals:
        at = t0 + offset
        await asyncio.sleep(max(0.0, at - time.time()))  # the workload's arrival times (not a synchronisation)
        if other is not None:
            s = await Session.open(settings, kind="rigid", name=f"b{i}", preemptive_views=False)
            bg = RigidLauncher(s.app, other.cluster, other.nodes, other.duration, other.runtime)
            tasks.append(asyncio.create_task(LiveRunner(s, bg, command=LONG).run()))
            continue
        curve = curves[rng.choice((koala.GADGET2, koala.FT)).name]
        if workload == "Wmr" and rng.random() < 0.5:
            t = curve.time(koala.MIN_NODES)
            s = await Session.open(settings, kind="rigid", name=f"r{i}", preemptive_views=False)
            launcher: object = koala.PlacedRigid(s.app, koala.PLACEMENT, koala.MIN_NODES, t * 1.1, t)
        else:
            s = await Session.open(settings, kind="malleable", name=f"m{i}")
            job = koala.KoalaMalleable(s.app, koala.PLACEMENT, curve)
            malleable.append((job, at))
            launcher = job
        tasks.append(asyncio.create_task(LiveRunner(s, launcher, command=LONG).run()))  # type: ignore[arg-type]
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30 * 60)
    done = [(j, at) for j, at in malleable if j.started is not None and j.ended is not None]
    return {
        "policy": policy, "precedence": precedence, "workload": workload, "placement": koala.PLACEMENT,
        "background": background, "background_jobs": len(others),
        "nodes": sum(CLUSTERS.values()), "speed": SPEED, "jobs": jobs, "malleable": len(malleable),
        "finished": len(done), "failed": sum(1 for r in results if r.exit_code != 0),
        "exec_mean_s": statistics.fmean(j.ended - j.started for j, _ in done) if done else float("nan"),  # type: ignore[operator]
        "response_mean_s": statistics.fmean(j.ended - at for j, at in done) if done else float("nan"),  # type: ignore[operator]
        "wait_mean_s": statistics.fmean(j.started - at for j, at in done) if done else float("nan"),  # type: ignore[operator]
        "avg_size": statistics.fmean(j.area / (j.ended - j.started) for j, _ in done) if done else 0.0,  # type: ignore[operator]
        "max_size_mean": statistics.fmean(j.max_size for j, _ in done) if done else 0.0,
        "stuck_at_min_pct": 100.0 * sum(j.max_size <= koala.MIN_NODES for j, _ in done) / max(len(done), 1),
        "grows": sum(j.grows for j, _ in malleable), "shrinks": sum(j.shrinks for j, _ in malleable),
        "busiest_cluster_pct": 100.0 * max(Counter(j.cluster for j, _ in malleable).values(), default=0)
        / max(len(malleable), 1),
    }


def table(rows: list[dict]) -> str:
    return common.md_table(
        ("policy", "precedence", "jobs (malleable)", "finished", "failed", "exec. time (s)", "response time (s)",
         "avg size", "max size", "grows", "shrinks", "busiest cluster (%)"),
        [(r["policy"].upper(), r["precedence"], f"{r['jobs']} ({r['malleable']})", r["finished"], r["failed"],
          f"{r['exec_mean_s']:.1f}", f"{r['response_mean_s']:.1f}", f"{r['avg_size']:.1f}",
          f"{r['max_size_mean']:.1f}", r["grows"], r["shrinks"], f"{r['busiest_cluster_pct']:.0f}") for r in rows])



def load_table(rows: list[dict]) -> str:
    """koala-pwa-load's live rows: other users' load beside each policy's."""
    return common.md_table(
        ("other users' load (jobs)", "policy", "jobs (malleable)", "finished", "failed", "exec. time (s)",
         "response time (s)", "avg size", "max size", "stuck at 2 (%)", "grows", "shrinks"),
        [(f"{100 * r['background']:.0f} % ({r['background_jobs']})", r["policy"].upper(),
          f"{r['jobs']} ({r['malleable']})", r["finished"], r["failed"], f"{r['exec_mean_s']:.1f}",
          f"{r['response_mean_s']:.1f}", f"{r['avg_size']:.1f}", f"{r['max_size_mean']:.1f}",
          f"{r['stuck_at_min_pct']:.0f}", r["grows"], r["shrinks"]) for r in rows])


def growth_table(rows: list[dict]) -> str:
    """koala-pwa-growth's live rows: other users' load and the pass interval beside each policy's."""
    return common.md_table(
        ("other users' load (jobs)", "poll (s)", "policy", "jobs (malleable)", "finished", "failed",
         "exec. time (s)", "response time (s)", "wait (s)", "avg size", "max size", "stuck at 2 (%)", "grows",
         "shrinks"),
        [(f"{100 * r['background']:.0f} % ({r['background_jobs']})", f"{r['poll_s']:g}", r["policy"].upper(),
          f"{r['jobs']} ({r['malleable']})", r["finished"], r["failed"], f"{r['exec_mean_s']:.1f}",
          f"{r['response_mean_s']:.1f}", f"{r['wait_mean_s']:.1f}", f"{r['avg_size']:.1f}",
          f"{r['max_size_mean']:.1f}", f"{r['stuck_at_min_pct']:.0f}", r["grows"], r["shrinks"]) for r in rows])
