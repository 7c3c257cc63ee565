"""What the cores keep is bounded: 100,000 requests go through them (sessions of rigid, preemptible and
NEXT-updated requests, done, cancelled, closed); each time nothing is live, the state's size in memory and
as a snapshot is measured. It must stay flat: a year of a busy cluster is millions of requests."""

from __future__ import annotations

import gc
import random
import tracemalloc

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import ENDED_STORIES, PolicySettings
from coorm.services.policy_engine.snapshot import Snapshot
from coorm.shared.events import CloseSession, Done, OpenSession, RegisterNodes, Submit, Tick
from coorm.shared.requests import RequestSpec

TOTAL = 100_000
PER_SESSION = 20
CONCURRENT = 10  # sessions live at once, then all of them close: a quiet moment to measure


def _wave(cores: CoupledCores, rng: random.Random, first_app: int, t: float) -> tuple[int, float]:
    """CONCURRENT sessions of PER_SESSION requests each, from open to close; the requests they made."""
    apps = [f"u.a{first_app + i}" for i in range(CONCURRENT)]
    made = 0
    for app in apps:
        cores.handle(OpenSession(at=t, app=app, user="u", adapts=rng.random() < 0.5))
    for k in range(PER_SESSION // 2):
        for app in apps:
            t += rng.uniform(0.0, 0.1)
            a, b = f"{app}.{2 * k}", f"{app}.{2 * k + 1}"
            kind = "preemptible" if rng.random() < 0.2 else "non-preemptible"
            specs = [RequestSpec(id=a, type=kind, cluster=rng.choice(("c0", "c1")), nodes=rng.randint(1, 4),
                                 duration=float(rng.randint(5, 60)))]
            specs.append(RequestSpec(id=b, type=kind, cluster=specs[0].cluster, nodes=rng.randint(1, 4),
                                     duration=float(rng.randint(5, 60)), related_to=a, related_how="NEXT"))
            cores.handle(Submit(at=t, app=app, requests=specs))
            made += 2
            t += rng.uniform(0.0, 0.3)
            cores.handle(Done(at=t, app=app, request=a))  # the update: b takes a's nodes over
            if rng.random() < 0.5:
                cores.handle(Done(at=t, app=app, request=b))
        while (w := cores.next_wakeup()) is not None and w < t:
            cores.handle(Tick(at=max(w, cores.now)))
    for app in apps:
        t += 1.0
        cores.handle(CloseSession(at=t, app=app))
    t += 120.0  # past every fair-start hold and walltime
    cores.handle(Tick(at=t))
    while (w := cores.next_wakeup()) is not None and w <= t:
        cores.handle(Tick(at=max(w, cores.now)))
    return made, t


def _sizes(cores: CoupledCores) -> tuple[int, int]:
    gc.collect()
    return tracemalloc.get_traced_memory()[0], len(Snapshot.of(cores, "1-0", 0).state)


def test_memory_and_snapshot_stay_flat_over_100k_requests():
    rng = random.Random(7)
    cores = CoupledCores(PolicySettings(fair_start=5.0, reschedule_interval=1.0, preempt_grace=5.0))
    for c in ("c0", "c1"):
        cores.handle(RegisterNodes(at=0.0, cluster=c, nodes=tuple(f"{c}n{i}" for i in range(16))))
    tracemalloc.start()
    try:
        done, t, app, measured = 0, 0.0, 0, {}
        while done < TOTAL:
            made, t = _wave(cores, rng, app, t)
            done, app = done + made, app + CONCURRENT
            assert not cores.policy.apps and not cores.policy.requests  # nothing live
            if done >= 2 * ENDED_STORIES and "early" not in measured:
                measured["early"] = (done, *_sizes(cores))
        measured["late"] = (done, *_sizes(cores))
    finally:
        tracemalloc.stop()
    (n0, mem0, snap0), (n1, mem1, snap1) = measured["early"], measured["late"]
    assert n1 >= TOTAL and n1 >= 4 * n0
    assert not cores.policy.ended and not cores.allocator.allocations
    assert len(cores.policy.stories) <= ENDED_STORIES
    # flat: what grows is counters' digits, not per-request records
    assert snap1 <= snap0 * 1.02, (snap0, snap1)
    assert mem1 <= mem0 * 1.05 + 64 * 1024, (mem0, mem1)
