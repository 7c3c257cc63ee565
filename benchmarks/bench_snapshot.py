"""The snapshot's size and its write and read times, JSON of the schema against the pickle it replaced. A
script, not a test:

    .venv/bin/python benchmarks/bench_snapshot.py [--requests 10000] [--apps 1000] [--repeat 5]

The state: the coupled cores (policy and allocator) with 8 clusters of 128 registered nodes and
``--requests`` requests of ``--apps`` applications (benchmarks/bench_policy.py's workload: rigid requests
of 1 to 128 nodes, a few pre-allocations, preemptible requests and NEXT/COALLOC pairs) after one pass: what
fits runs, the rest -- nearly all -- waits, placed in the schedule. Write: ``Snapshot.of`` (what the
leader does every ``COORM_SNAPSHOT_EVERY`` events, in its event loop); read: ``Snapshot.cores()`` (what
a new leader does once). The pickle is the former format: base64 of ``pickle.dumps(cores)``. Medians of
``--repeat`` runs, wall time; the size is of the text stored in Redis.
"""

from __future__ import annotations

import argparse
import base64
import gc
import pickle
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_policy as bp  # noqa: E402

from coorm.services.coupled import CoupledCores  # noqa: E402
from coorm.services.policy_engine.core import PolicySettings  # noqa: E402
from coorm.services.policy_engine.snapshot import Snapshot  # noqa: E402
from coorm.shared.events import OpenSession, RegisterNodes, Submit, Tick  # noqa: E402


def build(requests: int, apps: int, clusters: int = 8, seed: int = 1) -> CoupledCores:
    names = [f"c{i}" for i in range(clusters)]
    cores = CoupledCores(PolicySettings(reschedule_interval=bp.INTERVAL))
    for c in names:
        cores.handle(RegisterNodes(at=0.0, cluster=c, nodes=tuple(f"{c}n{i}" for i in range(bp.NODES))))
    wl = bp.Workload(names, seed)
    rng = random.Random(seed + 1)
    ids = [f"a{i}" for i in range(apps)]
    counts = [0] * apps
    for _ in range(requests):
        counts[rng.randrange(apps)] += 1
    for a in ids:
        cores.handle(OpenSession(at=0.0, app=a), pass_now=False)
    for a, n in zip(ids, counts, strict=True):
        for batch in bp._batches(wl.specs(a, n), bp.BATCH) if n else []:
            cores.handle(Submit(at=0.0, app=a, requests=batch), pass_now=False)
    cores.handle(Tick(at=bp.INTERVAL))
    return cores


def _median(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--apps", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cores = build(args.requests, args.apps)
    policy = cores.policy
    print(f"state: {len(policy.apps):,} applications, {len(policy.waiting()):,} waiting and "
          f"{len(policy.running()):,} running requests, {len(cores.allocator.nodes):,} nodes")

    snap = Snapshot.of(cores, "1-0", 0)
    pickled = base64.b64encode(pickle.dumps(cores, protocol=pickle.HIGHEST_PROTOCOL)).decode()
    rows = [
        ("JSON, schema v" + snap.format, len(snap.state),
         _median(lambda: Snapshot.of(cores, "1-0", 0), args.repeat), _median(snap.cores, args.repeat)),
        ("pickle (base64), before", len(pickled),
         _median(lambda: base64.b64encode(pickle.dumps(cores, protocol=pickle.HIGHEST_PROTOCOL)).decode(),
                 args.repeat),
         _median(lambda: pickle.loads(base64.b64decode(pickled)), args.repeat)),
    ]
    print(f"{'':26} {'size':>12} {'write ms':>9} {'read ms':>9}")
    for name, size, w, r in rows:
        print(f"{name:26} {size:>12,} {w * 1e3:>9.0f} {r * 1e3:>9.0f}")
    per = len(snap.state) / max(1, len(policy.requests))
    print(f"JSON per live request: {per:.0f} bytes")


if __name__ == "__main__":
    main()
