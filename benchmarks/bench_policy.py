"""Benchmarks of the policy core (DESIGN §4) on 128-node clusters. A script, not a test:

    .venv/bin/python benchmarks/bench_policy.py [--quick] [--profile [--size R,A,C]]

(a) the time of one full pass, and the pass time per waiting request, as a function of the number of
    waiting requests (apps and clusters fixed), of applications (requests and clusters fixed) and of
    clusters (requests and applications fixed), with the growth ratio between sizes set beside the growth
    of n log n;
(c) a pass run by one event (a submission, a cancel, an early end) with no time passing, on two cores loaded
    alike, one placing everything at every pass, the other keeping the placements the event cannot have changed
    (services/policy_engine/reuse.py): their times and decisions side by side;
(b) events per second through the core: a stream of open/submit/done events with a 1 s re-scheduling
    interval in simulated time, many events coalesced per pass as in live operation; total events over
    the total wall time, the passes included, for three arrival rates (events per simulated second).

The state is built by feeding real events (NodesChanged per cluster, OpenSession per application, Submit
batches of rigid requests, 1..128 nodes in powers of two skewed small, a minute to a day; about 1 % of
pre-allocations with requests sized to run inside them, 1 % preemptible, 0.5 % COALLOC/NEXT pairs), all
within one re-scheduling interval so that no pass runs while loading. A warm-up pass starts what fits;
then each timed pass is the ``handle`` of one more Submit once a pass is due: the core is dirty and
recomputes everything (profiles, placements, views' signatures and preemptible shares are rebuilt from
the state; ``core.reuse`` is off: nothing is kept from the last pass). Between passes, launchers give
preemptible nodes back when told to, as well-behaved ones do (a violation would end a session and make the
pass run twice). Wall-clock medians are the figures; the CPU time of the process is shown beside them
because a shared machine inflates wall time, and the growth ratios are computed on it.

Targets (issue 16): a pass over 10,000 waiting requests from 1,000 applications on 8 clusters under 50 ms
and over 100,000 under 500 ms, growing no worse than n log n; at least 20,000 events/s. The targets table sets
both the full pass (a) and the passes after one event (c) beside them. ``--quick`` leaves out 100,000
requests and runs shorter streams (well under a minute); the full run takes about a minute and a half on a
2-core machine.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import math
import pstats
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from coorm.services.policy_engine.core import PolicyCore, PolicySettings  # noqa: E402
from coorm.shared.events import (  # noqa: E402
    Done,
    EndRequest,
    NodesChanged,
    OpenSession,
    PassDone,
    PreemptionDeadline,
    Rejected,
    SessionEnded,
    StartRequest,
    Submit,
    Tick,
)
from coorm.shared.requests import Relation, RequestSpec, RequestType  # noqa: E402

NODES = 128
SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
# skewed small, like real traces: ~88 % of requests ask for 32 nodes or fewer
SIZE_WEIGHTS = (22, 18, 15, 13, 11, 9, 7, 5)
MIN_DURATION, MAX_DURATION = 60.0, 86_400.0
INTERVAL = 60.0  # re-scheduling interval of section (a): loading takes < 1 s of simulated time
BATCH = 50  # requests per Submit while loading

console = Console(width=150)

# issue 16: (requests, applications, clusters) -> the longest a pass over them may take
PASS_TARGETS_MS = {(10_000, 1_000, 8): 50.0, (100_000, 1_000, 8): 500.0}


# ------------------------------------------------------------------------------------------------
# workload
# ------------------------------------------------------------------------------------------------
def _size(rng: random.Random) -> int:
    return rng.choices(SIZES, SIZE_WEIGHTS)[0]


def _duration(rng: random.Random) -> float:
    """Log-uniform between a minute and a day, rounded to the second."""
    return float(round(math.exp(rng.uniform(math.log(MIN_DURATION), math.log(MAX_DURATION)))))


class Workload:
    """Random request specs for one application: mostly rigid non-preemptible requests; a few
    applications also hold a pre-allocation (with requests that fit inside it), preemptible requests,
    or a COALLOC / NEXT pair, so that every placement path runs."""

    def __init__(self, clusters: list[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.clusters = clusters
        self.n = 0

    def _id(self, app: str) -> str:
        self.n += 1
        return f"{app}.r{self.n}"

    def rigid(self, app: str) -> RequestSpec:
        rng = self.rng
        return RequestSpec(
            id=self._id(app), cluster=rng.choice(self.clusters), nodes=_size(rng), duration=_duration(rng)
        )

    def specs(self, app: str, count: int) -> list[RequestSpec]:
        """``count`` requests of one application (a few of them special, see the class doc)."""
        rng = self.rng
        out: list[RequestSpec] = []
        while len(out) < count:
            left = count - len(out)
            roll = rng.random()
            cluster = rng.choice(self.clusters)
            if roll < 0.01 and left >= 3:  # a pre-allocation and two requests meant to run inside it
                pre = RequestSpec(
                    id=self._id(app),
                    type=RequestType.PRE_ALLOCATION,
                    cluster=cluster,
                    nodes=rng.choice((16, 32, 64)),
                    duration=float(rng.choice((21_600, 43_200, 86_400))),
                )
                out.append(pre)
                for _ in range(2):
                    out.append(
                        RequestSpec(
                            id=self._id(app),
                            cluster=cluster,
                            nodes=rng.choice((1, 2, 4, 8)),
                            duration=float(rng.choice((600, 1_800, 3_600))),
                        )
                    )
            elif roll < 0.02:  # preemptible (unbounded or not)
                out.append(
                    RequestSpec(
                        id=self._id(app),
                        type=RequestType.PREEMPTIBLE,
                        cluster=cluster,
                        nodes=rng.choice((1, 2, 4, 8)),
                        duration=None if rng.random() < 0.5 else _duration(rng),
                    )
                )
            elif roll < 0.025 and left >= 2:  # a NEXT or COALLOC pair
                first = self.rigid(app)
                out.append(first)
                how = Relation.NEXT if rng.random() < 0.5 else Relation.COALLOC
                out.append(
                    RequestSpec(
                        id=self._id(app),
                        cluster=first.cluster if how is Relation.NEXT else cluster,
                        nodes=_size(rng),
                        duration=_duration(rng),
                        related_to=first.id,
                        related_how=how,
                    )
                )
            else:
                out.append(self.rigid(app))
        return out


def _batches(specs: list[RequestSpec], size: int) -> list[list[RequestSpec]]:
    """Cut into Submit batches without separating a request from the one it is related to."""
    out: list[list[RequestSpec]] = []
    cur: list[RequestSpec] = []
    for s in specs:
        if len(cur) >= size and s.related_to is None:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


class Launchers:
    """What the applications' launchers do with the decisions: remember their running preemptible
    requests and give nodes back (done) when told to by a preemption deadline, so that nobody is killed
    for a protocol violation (which would end a session and re-run the pass). Any rejection or session
    end means the benchmark fed a wrong event: it stops."""

    def __init__(self) -> None:
        self.preemptible: dict[tuple[str, str], dict[str, int]] = {}
        self.to_release: list[tuple[str, str]] = []  # (app, request) to end at the next event time
        self.ended: set[str] = set()

    def see(self, decisions: list) -> None:
        for d in decisions:
            if isinstance(d, StartRequest):
                if d.type is RequestType.PREEMPTIBLE:
                    self.preemptible.setdefault((d.app, d.cluster), {})[d.request] = d.nodes
            elif isinstance(d, EndRequest):
                self.ended.add(d.request)
                self.preemptible.get((d.app, d.cluster), {}).pop(d.request, None)
            elif isinstance(d, PreemptionDeadline):
                held = self.preemptible.get((d.app, d.cluster), {})
                excess = d.held - d.allowed
                for rid, nodes in list(held.items()):
                    if excess <= 0:
                        break
                    self.to_release.append((d.app, rid))
                    del held[rid]
                    excess -= nodes
            elif isinstance(d, (Rejected, SessionEnded)):
                raise RuntimeError(f"the benchmark went wrong: {d!r}")

    def next_release(self, at: float) -> Done | None:
        while self.to_release:
            app, rid = self.to_release.pop()
            if rid not in self.ended:
                return Done(at=at, app=app, request=rid)
        return None


def _check(decisions: list) -> None:
    Launchers().see(decisions)


# ------------------------------------------------------------------------------------------------
# (a) one pass
# ------------------------------------------------------------------------------------------------
@dataclass
class PassFigures:
    requests: int
    apps: int
    clusters: int
    waiting: int
    median_s: float
    runs: list[float]
    cpu_s: float  # median CPU time of this process: what the pass costs when the machine is shared
    load_s: float


def build(requests: int, apps: int, clusters: int, seed: int = 1) -> tuple[PolicyCore, Workload, list[str]]:
    """A core loaded with ``requests`` requests of ``apps`` applications on ``clusters`` clusters, no pass
    run since the first event."""
    names = [f"c{i}" for i in range(clusters)]
    core = PolicyCore(PolicySettings(reschedule_interval=INTERVAL))
    wl = Workload(names, seed)
    rng = random.Random(seed + 1)
    app_ids = [f"a{i}" for i in range(apps)]
    counts = [0] * apps
    for _ in range(requests):
        counts[rng.randrange(apps)] += 1
    events: list = [NodesChanged(at=0.0, cluster=c, up=NODES) for c in names]
    events += [OpenSession(at=0.0, app=a) for a in app_ids]
    submits = [
        Submit(at=0.0, app=a, requests=batch)
        for a, n in zip(app_ids, counts, strict=True)
        if n
        for batch in _batches(wl.specs(a, n), BATCH)
    ]
    rng.shuffle(submits)
    events += submits
    dt = 0.5 / len(events)
    for i, ev in enumerate(events):
        ev = ev.model_copy(update={"at": i * dt}) if i else ev
        _check(core.handle(ev))
    assert core.epoch == 1, "a pass ran while loading"
    return core, wl, app_ids


def time_pass(requests: int, apps: int, clusters: int, repeats: int, seed: int = 1) -> PassFigures:
    t0 = time.perf_counter()
    core, wl, app_ids = build(requests, apps, clusters, seed)
    core.reuse = False  # (a) is the full pass: every placement made again (section (c) keeps what it can)
    load = time.perf_counter() - t0
    launchers = Launchers()
    now = INTERVAL
    launchers.see(core.handle(Tick(at=now)))  # warm-up: the first pass starts what fits now
    runs: list[float] = []
    cpu: list[float] = []
    waiting = 0
    for k in range(repeats):
        # preemptible holders give back what they were told to, before the next pass is due
        while (done := launchers.next_release(now)) is not None:
            out = core.handle(done)
            assert not any(isinstance(d, PassDone) for d in out), "a pass ran between timed passes"
            launchers.see(out)
        gc.collect()
        now += INTERVAL
        app = app_ids[k % len(app_ids)]
        ev = Submit(at=now, app=app, requests=[wl.rigid(app)])
        c = time.process_time()
        t = time.perf_counter()
        out = core.handle(ev)
        runs.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        launchers.see(out)
        done = [d for d in out if isinstance(d, PassDone)]
        assert len(done) == 1, "the timed event did not run a pass"
        waiting = done[0].waiting
    return PassFigures(
        requests, apps, clusters, waiting, statistics.median(runs), runs, statistics.median(cpu), load
    )


def _nlogn(n: float) -> float:
    return n * math.log2(max(n, 2))


def pass_table(title: str, swept: str, rows: list[PassFigures]) -> Table:
    table = Table(title=title)
    for col in (
        "requests",
        "apps",
        "clusters",
        "waiting",
        "pass ms (median)",
        "min..max ms",
        "CPU ms",
        "µs / waiting",
        "× CPU time",
        f"× n·log n ({swept})",
        "load s",
    ):
        table.add_column(col, justify="right")
    prev = None
    for f in rows:
        n = getattr(f, swept)
        ratio = growth = "—"
        if prev is not None:
            pn = getattr(prev, swept)
            ratio = f"{f.cpu_s / prev.cpu_s:.1f}"
            growth = f"{_nlogn(n) / _nlogn(pn):.1f}"
        table.add_row(
            f"{f.requests:,}",
            f"{f.apps:,}",
            f"{f.clusters}",
            f"{f.waiting:,}",
            f"{f.median_s * 1e3:.1f}",
            f"{min(f.runs) * 1e3:.1f}..{max(f.runs) * 1e3:.1f}",
            f"{f.cpu_s * 1e3:.1f}",
            f"{f.median_s / max(f.waiting, 1) * 1e6:.2f}",
            ratio,
            growth,
            f"{f.load_s:.1f}",
        )
        prev = f
    return table


# ------------------------------------------------------------------------------------------------
# (b) events per second
# ------------------------------------------------------------------------------------------------
@dataclass
class StreamFigures:
    rate: int
    events: int
    passes: int
    wall_s: float
    core_s: float
    pass_s: float
    cpu_s: float  # the process's CPU time over the whole loop: what a shared machine does not inflate
    waiting_start: int
    waiting_end: int
    by_kind: dict[str, int]


class _Live:
    """The requests the stream may end: a list with O(1) random pick and removal."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []
        self.pos: dict[str, int] = {}

    def add(self, app: str, rid: str) -> None:
        self.pos[rid] = len(self.items)
        self.items.append((app, rid))

    def discard(self, rid: str) -> None:
        i = self.pos.pop(rid, None)
        if i is None:
            return
        last = self.items.pop()
        if i < len(self.items):
            self.items[i] = last
            self.pos[last[1]] = i

    def pick(self, rng: random.Random) -> tuple[str, str]:
        return self.items[rng.randrange(len(self.items))]


def stream(
    events: int, rate: int, clusters: int = 8, apps: int = 200, backlog: int = 2_000, seed: int = 7
) -> StreamFigures:
    """``events`` events arriving at ``rate`` per simulated second (so about ``rate`` events are coalesced
    into each pass, the re-scheduling interval being 1 s), over a core that starts with ``backlog``
    waiting requests of ``apps`` applications: 2 % open a session, 47 % submit (one request, sometimes
    two), 51 % end a live request (done if it runs, cancel if it waits), so that the queue stays about
    the same size; launchers told to give preemptible nodes back do so at once (done)."""
    names = [f"c{i}" for i in range(clusters)]
    core = PolicyCore(PolicySettings(reschedule_interval=1.0))
    wl = Workload(names, seed)
    rng = random.Random(seed)
    live = _Live()
    launchers = Launchers()
    app_ids: list[str] = []

    def feed(ev) -> list:
        out = core.handle(ev)
        launchers.see(out)
        for d in out:
            if isinstance(d, EndRequest):
                live.discard(d.request)
        return out

    for c in names:
        feed(NodesChanged(at=0.0, cluster=c, up=NODES))
    for i in range(apps):
        app_ids.append(f"a{i}")
        feed(OpenSession(at=0.0, app=app_ids[-1]))
    per_app = backlog // apps
    for a in app_ids:
        for batch in _batches(wl.specs(a, per_app), BATCH):
            feed(Submit(at=0.0, app=a, requests=batch))
            for spec in batch:
                live.add(a, spec.id)
    feed(Tick(at=1.0))
    waiting_start = sum(1 for r in core.requests.values() if r.state.value == "waiting")
    # the requests to submit, made in advance so that the loop times the core, not the workload
    pool = [wl.rigid("s") for _ in range(events)]

    dt = 1.0 / rate
    now = 1.0
    core_s = pass_s = 0.0
    passes = 0
    by_kind = {"open": 0, "submit": 0, "done": 0}
    gc.collect()
    wall0 = time.perf_counter()
    cpu0 = time.process_time()
    for _ in range(events):
        now += dt
        roll = rng.random()
        ev = launchers.next_release(now)  # a launcher giving preemptible nodes back before its deadline
        if ev is not None:
            live.discard(ev.request)
            kind = "done"
        elif roll < 0.02:
            app_ids.append(f"n{len(app_ids)}")
            ev = OpenSession(at=now, app=app_ids[-1])
            kind = "open"
        elif roll < 0.49 or not live.items:
            app = rng.choice(app_ids)
            specs = [pool.pop() for _ in range(1 if roll < 0.46 else 2)]
            ev = Submit(at=now, app=app, requests=specs)
            kind = "submit"
        else:
            app, rid = live.pick(rng)
            ev = Done(at=now, app=app, request=rid)
            live.discard(rid)
            kind = "done"
        t = time.perf_counter()
        out = feed(ev)
        el = time.perf_counter() - t
        core_s += el
        by_kind[kind] += 1
        if kind == "submit":
            for spec in ev.requests:
                live.add(ev.app, spec.id)
        if out and isinstance(out[-1], PassDone):
            passes += 1
            pass_s += el
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    waiting_end = sum(1 for r in core.requests.values() if r.state.value == "waiting")
    return StreamFigures(rate, events, passes, wall, core_s, pass_s, cpu, waiting_start, waiting_end, by_kind)


def stream_table(rows: list[StreamFigures]) -> Table:
    table = Table(title="(b) events per second through the core (1 s re-scheduling interval, 8 clusters)")
    for col in (
        "arrival rate (ev/sim. s)",
        "events",
        "open/submit/done",
        "passes",
        "waiting start→end",
        "events/s (wall)",
        "events/s (CPU)",
        "events/s (in handle)",
        "in passes s",
        "wall s",
    ):
        table.add_column(col, justify="right")
    for f in rows:
        k = f.by_kind
        table.add_row(
            f"{f.rate:,}",
            f"{f.events:,}",
            f"{k['open']:,}/{k['submit']:,}/{k['done']:,}",
            f"{f.passes:,}",
            f"{f.waiting_start:,}→{f.waiting_end:,}",
            f"{f.events / f.wall_s:,.0f}",
            f"{f.events / f.cpu_s:,.0f}",
            f"{f.events / f.core_s:,.0f}",
            f"{f.pass_s:.2f}",
            f"{f.wall_s:.2f}",
        )
    return table


# ------------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------------
# (c) a pass after one event, keeping the placements it cannot have changed
# ------------------------------------------------------------------------------------------------
KINDS = ("submit", "cancel", "end early")


@dataclass
class EventFigures:
    requests: int
    kind: str
    waiting: int
    full_s: list[float]  # wall time of the passes that placed everything
    full_cpu: list[float]
    kept_s: list[float]  # and of those that kept what they could
    kept_cpu: list[float]
    placed: list[int]  # units placed anew in the latter (an application's waiting requests on a cluster)
    units: list[int]


def time_events(requests: int, apps: int, clusters: int, repeats: int, seed: int = 1) -> list[EventFigures]:
    """Passes each run by one event, a submission, a cancel or an early end, with no time passing (nothing else
    becomes due), on two cores loaded alike: one places everything at every pass (``reuse`` False, each
    application's requests together, as before the pass kept anything), the other keeps what the event did not
    change. Both get the same events and make the same decisions (checked); which goes first alternates."""
    cores = []
    for reuse in (False, True):
        core, wl, app_ids = build(requests, apps, clusters, seed)
        core.reuse = reuse
        launchers = Launchers()
        launchers.see(core.handle(Tick(at=INTERVAL)))
        core.settings = core.settings.model_copy(update={"reschedule_interval": 0.0})  # a pass after every event
        cores.append((core, launchers))
    (full, full_l), (kept, kept_l) = cores
    rng = random.Random(seed + 2)
    walks: list = []
    walk = kept._walk

    def watched(last, whole=False):  # (how many units the pass placed anew)
        ctx = walk(last, whole=whole)
        walks.append(ctx)
        return ctx

    kept._walk = watched  # type: ignore[method-assign]
    now = INTERVAL
    figures = {k: EventFigures(requests, k, 0, [], [], [], [], [], []) for k in KINDS}
    for k in range(repeats * len(KINDS)):
        kind = KINDS[k % len(KINDS)]
        for core, launchers in cores:
            at = now
            while (done := launchers.next_release(at)) is not None:
                at += 0.001
                launchers.see(core.handle(done.model_copy(update={"at": at})))
        now += 0.01
        if kind == "submit":
            app = rng.choice(app_ids)
            ev = Submit(at=now, app=app, requests=[wl.rigid(app)])
        else:
            pool = kept.waiting() if kind == "cancel" else kept.running()
            pool = [r for r in pool if r.type is RequestType.NON_PREEMPTIBLE and r.container is None]
            r = rng.choice(pool)
            ev = Done(at=now, app=r.app, request=r.id)
        outs = {}
        for core, launchers in cores if k % 2 else cores[::-1]:
            gc.collect()
            walks.clear()
            c = time.process_time()
            t = time.perf_counter()
            out = core.handle(ev)
            wall = time.perf_counter() - t
            cpu = time.process_time() - c
            launchers.see(out)
            outs[core.reuse] = [d.model_dump(mode="json") for d in out]
            done_ = [d for d in out if isinstance(d, PassDone)]
            assert len(done_) == 1, "the timed event did not run one pass"
            f = figures[kind]
            f.waiting = done_[0].waiting
            if core.reuse:
                f.kept_s.append(wall)
                f.kept_cpu.append(cpu)
                f.placed.append(sum(w.placed_units for w in walks))
                f.units.append(sum(w.placed_units + w.kept_units for w in walks))
            else:
                f.full_s.append(wall)
                f.full_cpu.append(cpu)
        assert outs[True] == outs[False], f"keeping placements decided otherwise on {ev!r}"
    return list(figures.values())


def events_table(rows: list[EventFigures]) -> Table:
    table = Table(title="(c) a pass after one event (apps=1,000, clusters=8): placing everything, or keeping what "
                        "the event did not change")
    for col in ("requests", "event", "waiting", "full ms", "full CPU ms", "kept ms", "kept CPU ms", "× faster",
                "units placed / all"):
        table.add_column(col, justify="right")
    med = statistics.median
    for f in rows:
        table.add_row(
            f"{f.requests:,}", f.kind, f"{f.waiting:,}",
            f"{med(f.full_s) * 1e3:.1f}", f"{med(f.full_cpu) * 1e3:.1f}",
            f"{med(f.kept_s) * 1e3:.1f}", f"{med(f.kept_cpu) * 1e3:.1f}",
            f"{med(f.full_s) / med(f.kept_s):.1f}",
            f"{med(f.placed):,.0f} / {med(f.units):,.0f}",
        )
    return table


def profile_pass(requests: int, apps: int, clusters: int) -> None:
    core, wl, app_ids = build(requests, apps, clusters)
    core.handle(Tick(at=INTERVAL))
    ev = Submit(at=2 * INTERVAL, app=app_ids[0], requests=[wl.rigid(app_ids[0])])
    prof = cProfile.Profile()
    prof.enable()
    core.handle(ev)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (< 1 minute)")
    ap.add_argument("--profile", action="store_true", help="cProfile one pass (see --size) and stop")
    ap.add_argument("--size", default="10000,1000,8", help="requests,apps,clusters for --profile")
    args = ap.parse_args()
    if args.profile:
        profile_pass(*(int(x) for x in args.size.split(",")))
        return
    t0 = time.perf_counter()
    quick = args.quick
    repeats = 5 if quick else 7
    sweeps = [
        (
            "(a1) one pass vs waiting requests (apps=1,000, clusters=8)",
            "requests",
            [(1_000, 1_000, 8), (10_000, 1_000, 8)] + ([] if quick else [(100_000, 1_000, 8)]),
        ),
        (
            "(a2) one pass vs applications (requests=10k, clusters=8)",
            "apps",
            [(10_000, 100, 8), (10_000, 1_000, 8), (10_000, 10_000, 8)],
        ),
        (
            "(a3) one pass vs clusters (requests=10k, apps=1,000)",
            "clusters",
            [(10_000, 1_000, 1), (10_000, 1_000, 8), (10_000, 1_000, 64)],
        ),
    ]
    cache: dict[tuple[int, int, int], PassFigures] = {}
    for title, swept, sizes in sweeps:
        rows = []
        for size in sizes:
            if size not in cache:
                cache[size] = time_pass(*size, repeats=repeats if size[0] < 100_000 else 3)
            rows.append(cache[size])
        console.print(pass_table(title, swept, rows))
    one_event = [f for size in ([10_000] if quick else [10_000, 100_000])
                 for f in time_events(size, 1_000, 8, repeats if size < 100_000 else 3)]
    console.print(events_table(one_event))
    events = 20_000 if quick else 100_000
    streams = [stream(events, rate) for rate in (1_000, 5_000, 20_000)]
    console.print(stream_table(streams))
    console.print(targets_table(cache, streams, one_event))
    console.print(f"total {time.perf_counter() - t0:.1f} s ({'quick' if quick else 'full'} mode)")


def targets_table(passes: dict[tuple[int, int, int], PassFigures], streams: list[StreamFigures],
                  one_event: list[EventFigures]) -> Table:
    table = Table(title="targets")
    for col in ("target", "measured", "met"):
        table.add_column(col, justify="left" if col == "target" else "right")

    def row(target: str, measured: str, ok: bool) -> None:
        table.add_row(target, measured, "yes" if ok else "[bold red]no[/]")

    for (requests, apps, clusters), limit_ms in PASS_TARGETS_MS.items():
        f = passes.get((requests, apps, clusters))
        if f is None:
            continue  # (--quick: no 100,000)
        ms, cpu = f.median_s * 1e3, f.cpu_s * 1e3
        row(f"full pass over {requests:,} requests ({f.waiting:,} waiting; {apps:,} apps, {clusters} clusters) "
            f"< {limit_ms:g} ms", f"{ms:.1f} ms (CPU {cpu:.1f} ms, × {ms / limit_ms:.1f} the target)",
            ms < limit_ms)
        for e in one_event:
            if e.requests == requests:
                ms = statistics.median(e.kept_s) * 1e3
                row(f"pass after one event ({e.kind}) over {requests:,} requests, keeping what it can, "
                    f"< {limit_ms:g} ms", f"{ms:.1f} ms (CPU {statistics.median(e.kept_cpu) * 1e3:.1f} ms)",
                    ms < limit_ms)
    sizes = [passes[k] for k in sorted(passes) if k[1:] == (1_000, 8)]
    for small, big in zip(sizes, sizes[1:], strict=False):
        growth = big.cpu_s / small.cpu_s
        bound = _nlogn(big.requests) / _nlogn(small.requests)
        row(
            f"growth {small.requests:,} → {big.requests:,} requests ≤ n·log n (× {bound:.1f})",
            f"× {growth:.1f}",
            growth <= bound,
        )
    for f in streams:
        rate = f.events / f.wall_s
        row(f"≥ 20,000 events/s, arriving at {f.rate:,}/s", f"{rate:,.0f}/s (CPU: {f.events / f.cpu_s:,.0f}/s)",
            rate >= 20_000)
    return table


if __name__ == "__main__":
    main()
