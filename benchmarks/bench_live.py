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
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coorm.cli.up import Up  # noqa: E402
from coorm.launchers.sdk import Session  # noqa: E402
from coorm.shared.requests import RequestSpec  # noqa: E402

INTERVAL = 0.01


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def latency_idle(settings, n: int, samples: int = 200, rate: float = 25.0) -> dict:
    """N launchers with open sessions (receiving their views); requests arrive at ``rate`` a second in all,
    each from a random launcher, and each is done once started: the time from request to start."""
    rng = random.Random(n)
    sessions = await asyncio.gather(*(Session.open(settings, kind="rigid", name=f"idle{i}", preemptive_views=False)
                                      for i in range(n)))
    await asyncio.gather(*(s.wait_views() for s in sessions))
    lat: list[float] = []

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
    await asyncio.gather(*(s.close() for s in sessions))
    return {"p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99)}


async def latency(settings, n: int, samples: int = 200) -> dict:
    """N launchers each ask for one node at the same moment; the time from each request to its start.
    Rounds repeat until there are ``samples`` measurements (a p99 of 10 is no p99)."""
    sessions = await asyncio.gather(*(Session.open(settings, kind="rigid", name=f"lat{i}", preemptive_views=False)
                                      for i in range(n)))
    await asyncio.gather(*(s.wait_views() for s in sessions))

    async def one(s: Session, k: int) -> float:
        t = time.perf_counter()
        (rid,) = await s.request(RequestSpec(id=s.rid(f"r{k}"), cluster="c0", nodes=1, duration=600))
        await s.wait_start(rid, 60)
        return time.perf_counter() - t

    lat: list[float] = []
    for k in range(max(1, -(-samples // n))):
        lat += await asyncio.gather(*(one(s, k) for s in sessions))
        await asyncio.gather(*(s.done(s.rid(f"r{k}")) for s in sessions))
        await asyncio.sleep(2 * INTERVAL)  # the next round starts on an idle cluster, after a pass
    await asyncio.gather(*(s.close() for s in sessions))
    return {"p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99)}


async def throughput(settings, n: int, jobs_per_launcher: int) -> dict:
    """N launchers, each running ``jobs_per_launcher`` rigid jobs one after the other."""
    sizes: list[int] = []

    async def launcher(i: int) -> int:
        done = 0
        for j in range(jobs_per_launcher):
            s = await Session.open(settings, kind="rigid", name=f"tp{i}.{j}", preemptive_views=False)
            (rid,) = await s.request(RequestSpec(id=s.rid("j"), cluster="c0", nodes=1, duration=600))
            start = await s.wait_start(rid, 120)
            await s.launch(rid, start.nodes[0], ["true"])
            (ex,) = await s.wait_exits(rid, 1, 120)
            await s.done(rid)
            await s.close()
            sizes.append(s.stats.notification_bytes)
            done += ex.code == 0
        return done

    t = time.perf_counter()
    completed = sum(await asyncio.gather(*(launcher(i) for i in range(n))))
    dt = time.perf_counter() - t
    total = n * jobs_per_launcher
    return {"jobs": total, "completed": completed, "seconds": dt, "completed_per_s": completed / dt,
            "submitted_per_s": total / dt, "bytes_per_app_mean": statistics.mean(sizes),
            "bytes_per_app_max": max(sizes)}


async def throughput_in_session(settings, n: int, jobs_per_launcher: int) -> dict:
    """N launchers (one session each, as a workflow manager or a job array's launcher), each running
    ``jobs_per_launcher`` rigid jobs one after the other: request one node, launch ``true``, wait for its
    exit, done."""
    sessions = await asyncio.gather(*(Session.open(settings, kind="rigid", name=f"ts{i}", preemptive_views=False)
                                      for i in range(n)))

    async def launcher(s: Session) -> int:
        done = 0
        for j in range(jobs_per_launcher):
            (rid,) = await s.request(RequestSpec(id=s.rid(f"j{j}"), cluster="c0", nodes=1, duration=600))
            start = await s.wait_start(rid, 120)
            await s.launch(rid, start.nodes[0], ["true"])
            (ex,) = await s.wait_exits(rid, 1, 120)
            await s.done(rid)
            done += ex.code == 0
        return done

    t = time.perf_counter()
    completed = sum(await asyncio.gather(*(launcher(s) for s in sessions)))
    dt = time.perf_counter() - t
    await asyncio.gather(*(s.close() for s in sessions))
    total = n * jobs_per_launcher
    return {"jobs": total, "completed": completed, "seconds": dt, "completed_per_s": completed / dt,
            "submitted_per_s": total / dt}


async def run(ns: list[int], nodes: int, jobs: int) -> None:
    env = {"COORM_RESCHEDULE_INTERVAL": str(INTERVAL), "COORM_FAIR_START": "0", "COORM_LOG_LEVEL": "WARNING",
           "COORM_SESSION_TIMEOUT": "120"}
    up = Up({"c0": nodes}, env=env, write_connection=False, accounting=False)
    settings = await asyncio.to_thread(up.start, 120)
    try:
        print(f"embedded system: 1 cluster of {nodes} emulated nodes, re-scheduling interval {INTERVAL * 1000:g} ms")
        print("done/s: a session per job (as coorm submit); in-session: N launchers' sessions, jobs one after "
              "the other in each")
        print("latency: one by one (25 requests/s in all) and burst (all N at once), p50/p99 in ms")
        print(f"{'N':>6} {'p50':>6} {'p99':>6} {'burst50':>8} {'burst99':>8} {'jobs':>6} {'done/s':>8} "
              f"{'submitted/s':>12} {'in-session/s':>13} {'bytes/app':>10} {'max':>8}")
        for n in ns:
            idle = await latency_idle(settings, n)
            lat = await latency(settings, n)
            tp = await throughput(settings, n, max(1, jobs // n))
            ts = await throughput_in_session(settings, n, max(1, jobs // n))
            print(f"{n:>6} {idle['p50_ms']:>6.1f} {idle['p99_ms']:>6.1f} {lat['p50_ms']:>8.1f} {lat['p99_ms']:>8.1f} "
                  f"{tp['jobs']:>6} {tp['completed_per_s']:>8.1f} {tp['submitted_per_s']:>12.1f} "
                  f"{ts['completed_per_s']:>13.1f} {tp['bytes_per_app_mean']:>10.0f} {tp['bytes_per_app_max']:>8}",
                  flush=True)
    finally:
        await asyncio.to_thread(up.stop)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10, 100, 1000], help="concurrent launchers")
    ap.add_argument("--nodes", type=int, default=1024, help="emulated nodes (>= the largest N)")
    ap.add_argument("--jobs", type=int, default=1000, help="rigid jobs per throughput run")
    args = ap.parse_args()
    asyncio.run(run(args.n, max(args.nodes, max(args.n)), args.jobs))


if __name__ == "__main__":
    main()
