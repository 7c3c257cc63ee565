"""KOALA's malleability experiments (Buisson et al., KOALA + DYNACO, §VI-VII): FPSMA against EGS, under
precedence to running applications (PRA, Fig. 7) and to waiting ones (PWA, Fig. 8), through the policy
core that the live system runs (``COORM_MALLEABLE_POLICY``, ``COORM_PRECEDENCE``,
``COORM_LOCAL_THRESHOLD``).

The workload, as §VI-C describes it: jobs of two applications drawn uniformly, GADGET 2 (10 min on 2
processors, best 4 min) and NAS FT (2 min on 2, best 1 min; powers of two only), malleable between 2 and
46 (GADGET 2) or 32 (FT) nodes; ``Wm`` all malleable, ``Wmr`` half of them rigid jobs of 2 nodes; a fixed
inter-arrival time, 2 min for PRA and 30 s for PWA (W'm, W'mr). What we cannot reproduce, and how we stand
in for it:

* the speed-up curves are read off Fig. 6 only at its two ends: we model T(n) = a + b/n + c*n through
  T(2) and a minimum (4 min at 24 nodes for GADGET 2, 1 min at 16 for FT: "the maximum sizes ... are
  greater than the sizes for which we have observed the minimum execution times");
* DAS3's five clusters (Table I: 85, 41, 68, 46 and 32 nodes), each job placed by KOALA's worst-fit
  (``placement``, :mod:`coorm.shared.cluster_choice`: the cluster with the most idle nodes where its
  minimum starts first). The job asks for its minimum with no cluster and the rule, and the policy core
  places it at its first pass on the application's non-preemptive views less the threshold (as KOALA
  places the jobs it manages under its threshold); a malleable job grows on the cluster its start names,
  only there. (Until 2026-11-26 each job applied the rule itself to its first views: the tables moved by
  a few tenths, EXPERIMENTS.md says how much);
  ``threshold`` nodes of each cluster kept for local users; no background load in koala-pra and koala-pwa
  (the paper's concurrent users: ``background``, :func:`background_jobs`, which koala-pwa-load runs).
  ``--placement single``
  keeps the first runs' set-up: Delft's 68 nodes alone (where Fig. 6 was measured);
* a malleable job is CooRMv2's: a non-preemptible request of its minimum (never shrunk) and preemptible
  requests for what it grows into, each asked as its preemptive view allows (FT only to a power of two,
  as its DYNACO side accepts); a mandatory shrink gives back whole growth requests, latest first;
* KOALA polls its information service; our scheduling passes run at most once a second.

Metrics (the paper's Fig. 7 and 8): average execution and response times of the malleable jobs, their
average and maximum sizes, the share of them that never grew past their minimum, the platform's
utilisation, and the malleability manager's activity (grow and shrink operations).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from coorm.experiments.common import md_table, write_csv
from coorm.launchers.base import ClusterProps, Command, Launcher, Timer, Views
from coorm.launchers.rigid import RigidLauncher
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared.cluster_choice import RULES, WORST_FIT
from coorm.shared.requests import RequestSpec, RequestType
from coorm.shared.stepfn import StepFunction
from coorm.simulator.engine import Simulation

CLUSTER = "delft"
NODES = 68
DAS3 = {"vu": 85, "uva": 41, "delft": 68, "multimedian": 46, "leiden": 32}  # the paper's Table I
PLACEMENT = WORST_FIT  # KOALA's, in its experiments
THRESHOLD = 4
POLICIES = ("fpsma", "egs")
WORKLOADS = ("Wm", "Wmr")


@dataclass(frozen=True)
class Curve:
    """An application's execution time on n nodes, T(n) = a + b/n + c*n, through T(2) and its minimum."""

    name: str
    t2: float
    best: float
    best_at: int
    max_nodes: int
    pow2: bool

    def time(self, n: int) -> float:
        # b = c * best_at**2 (the minimum), and a + 2*c*best_at = best, a + c*(best_at**2 / 2 + 2) = t2
        c = (self.t2 - self.best) / (self.best_at ** 2 / 2 + 2 - 2 * self.best_at)
        a = self.best - 2 * c * self.best_at
        return a + c * self.best_at ** 2 / n + c * n


GADGET2 = Curve("GADGET 2", t2=600.0, best=240.0, best_at=24, max_nodes=46, pow2=False)
FT = Curve("FT", t2=120.0, best=60.0, best_at=16, max_nodes=32, pow2=True)
MIN_NODES = 2


class KoalaMalleable(Launcher):
    """A malleable job of KOALA's experiments: ``min_nodes`` non-preemptible nodes, then as many more
    (up to its maximum, FT to a power of two) as its preemptive view allows; its work progresses at
    1/T(n) per second on n nodes."""

    kind = "malleable"
    wants_preemptive = True
    views_after_start = True

    def __init__(self, app: str, cluster: str, curve: Curve, min_nodes: int = MIN_NODES) -> None:
        super().__init__(app)
        # a placement rule (worst-fit...): the RMS chooses the cluster, which its start names
        self.cluster, self.curve, self.min_nodes = cluster, curve, min_nodes
        self.base: str | None = None  # the non-preemptible request of its minimum
        self.extra: dict[str, int] = {}  # started growth requests, oldest first -> nodes
        self.asked: tuple[str, int] | None = None  # a growth request waiting
        self.view: StepFunction | None = None
        self.started: float | None = None
        self.ended: float | None = None
        self.progress = 0.0
        self.size = 0
        self.since = 0.0
        self.area = 0.0  # node-seconds held while running
        self.max_size = 0
        self.grows = self.shrinks = 0
        self._epoch = 0

    def usable(self, n: int) -> int:
        n = min(n, self.curve.max_nodes)
        if self.curve.pow2:
            p = 1
            while p * 2 <= n:
                p *= 2
            n = p
        return max(n, self.min_nodes)

    # -- events -------------------------------------------------------------------------------------
    def walltime(self) -> float:
        return self.curve.time(self.min_nodes) * 1.1  # it only ever runs faster than on its minimum

    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        self.base = self.new_id()
        return [self.submit(_minimum(self.base, self.cluster, self.min_nodes, self.walltime()))]

    def on_views(self, views: Views) -> list[Command]:
        if self.cluster in RULES:  # not placed yet: the RMS places its minimum at its first pass
            return []
        self.view = views.preemptive.get(self.cluster)
        return self._adapt(views.now)

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        super().on_start(now, request, nodes)
        if request == self.base:
            self.started = now
            self.cluster = self.placed.get(request, self.cluster)  # the RMS's choice: it grows there
        elif self.asked is not None and request == self.asked[0]:
            self.extra[request] = self.asked[1]
            self.asked = None
            self.grows += 1
        return self._resize(now) + self._adapt(now)

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        super().on_end(now, request, reason)
        if self.asked is not None and request == self.asked[0]:
            self.asked = None
        if request in self.extra:
            del self.extra[request]
            return self._resize(now)
        if request == self.base and self.ended is None:  # its walltime (never, by construction) or a kill
            self.ended = now
            return self._stop(now)
        return []

    def on_timer(self, now: float, key: str) -> list[Command]:
        if key != f"end{self._epoch}" or self.ended is not None:
            return []
        self._account(now)
        self.ended = now
        return self._stop(now)

    # -- decisions ----------------------------------------------------------------------------------
    def _adapt(self, now: float) -> list[Command]:
        if self.started is None or self.ended is not None or self.view is None:
            return []
        # the view at now only, as KOALA grows: its scheduler offers a job what is idle at a poll -- under PWA
        # even while a waiting job cannot be placed -- and takes it back by a mandatory shrink once that job
        # can be (§V-B); KOALA places nothing in the future, so there is no later start to leave room for
        allowed = max(self.view.value_at(now), 0)
        held = sum(self.extra.values())
        want = self.usable(self.min_nodes + allowed) - self.min_nodes
        out: list[Command] = []
        if self.asked is not None and held + self.asked[1] > allowed:
            out.append(self.cancel(self.asked[0]))  # the view no longer holds it
            self.asked = None
        if held > allowed:  # a mandatory shrink: whole growth requests, latest first
            while self.extra and sum(self.extra.values()) > want:
                rid = next(reversed(self.extra))
                del self.extra[rid]
                out.append(self.finish(rid))
            self.shrinks += 1
            return out + self._resize(now)
        if want > held and self.asked is None:
            rid = self.new_id()
            self.asked = (rid, want - held)
            out.append(self.submit(RequestSpec(id=rid, type=RequestType.PREEMPTIBLE, cluster=self.cluster,
                                               nodes=want - held)))
        return out

    def _account(self, now: float) -> None:
        if self.size:
            self.progress += (now - self.since) / self.curve.time(self.size)
            self.area += (now - self.since) * self.size
        self.since = now

    def _resize(self, now: float) -> list[Command]:
        """Its size changed (or it started): the work done so far at the old size, the end at the new."""
        if self.started is None or self.ended is not None:
            return []
        self._account(now)
        self.size = self.min_nodes + sum(self.extra.values())
        self.max_size = max(self.max_size, self.size)
        self._epoch += 1
        left = max(1.0 - self.progress, 0.0) * self.curve.time(self.size)
        return [Timer(now + left, f"end{self._epoch}")]

    def _stop(self, now: float) -> list[Command]:
        out: list[Command] = [self.finish(rid) for rid in list(self.running)]
        if self.asked is not None:
            out.append(self.cancel(self.asked[0]))
            self.asked = None
        self.extra.clear()
        return out + self.close()


def _minimum(rid: str, where: str, nodes: int, duration: float) -> RequestSpec:
    """A job's non-preemptible request: on ``where``, a cluster, or -- ``where`` a placement rule (worst-fit...)
    -- on the cluster the RMS picks by that rule at its first pass (KOALA's placement, in the policy core:
    the rule applied to the application's non-preemptive views, less the local threshold)."""
    if where in RULES:
        return RequestSpec(id=rid, placement=where, nodes=nodes, duration=duration)
    return RequestSpec(id=rid, cluster=where, nodes=nodes, duration=duration)


class PlacedRigid(RigidLauncher):
    """A rigid job whose cluster the RMS chooses by a placement rule (``cluster``: the rule's name)."""

    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        if self.cluster not in RULES:
            return super().on_open(now, props)
        self.request = self.new_id()
        return [self.submit(_minimum(self.request, self.cluster, self.nodes, self.duration))]

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        out = super().on_start(now, request, nodes)
        self.cluster = self.placed.get(request, self.cluster)
        return out


# ==================================================================================================
# one run
# ==================================================================================================
# other users' rigid jobs (``background``): sizes drawn uniformly in 1..8 nodes, run times exponential with a
# mean of 10 min (within 30 s and 1 h), a walltime a quarter above the run time
BACKGROUND_SIZES = (1, 8)
BACKGROUND_RUN = (600.0, 30.0, 3600.0)  # mean, least, most


def background_jobs(clusters: dict[str, int], load: float, span: float, seed: int,
                    sizes: tuple[int, int] = BACKGROUND_SIZES,
                    run_times: tuple[float, float, float] = BACKGROUND_RUN) -> list[tuple[float, RigidLauncher]]:
    """Other users' rigid jobs, submitted to each cluster directly (they bypass KOALA: no placement rule, no
    threshold), arriving as a Poisson process over ``span`` seconds at the rate that offers ``load`` of the
    cluster's nodes (nominal: the drawn jobs' offered load is in each row). A stream of its own, seeded
    apart, so that KOALA's jobs are drawn the same with and without it. ``sizes`` and ``run_times`` (mean,
    least, most): the live form's reduced ones."""
    rng = random.Random(f"background-{seed}")
    lo, hi = sizes
    mean_run, least, most = run_times
    out: list[tuple[float, RigidLauncher]] = []
    for cluster, nodes in clusters.items():
        rate = load * nodes / ((lo + hi) / 2 * mean_run)
        t = rng.expovariate(rate) if rate > 0 else span
        while t < span:
            size = rng.randint(lo, min(hi, nodes))
            run = min(max(rng.expovariate(1.0 / mean_run), least), most)
            out.append((t, RigidLauncher(f"b-{cluster}-{len(out)}", cluster, size, math.ceil(run * 1.25), run)))
            t += rng.expovariate(rate)
    return sorted(out, key=lambda x: x[0])


def simulate(policy: str, precedence: str, workload: str, *, jobs: int, interarrival: float, seed: int,
             threshold: int = THRESHOLD, placement: str = PLACEMENT, background: float = 0.0,
             poll: float = 1.0, grace: float | None = None) -> dict:
    """One run; ``placement``: a rule of :mod:`coorm.shared.cluster_choice` over DAS3's clusters, or
    ``single`` (Delft's cluster alone); ``background``: the load other users' rigid jobs offer each cluster
    (:func:`background_jobs`) while KOALA's jobs arrive, 0 for none; ``poll``: at most one scheduling pass
    in so many seconds (KOALA's scheduler polls its information service; ours passes at most once a
    second), so that growth, shrinks and starts happen at polls; ``grace``: a mandatory shrink's
    (:data:`GRACE` unless given)."""
    rng = random.Random(seed)
    settings = PolicySettings(preemptible=policy, precedence=precedence, local_threshold=threshold,
                              fair_start=0.0, reschedule_interval=poll,
                              preempt_grace=GRACE if grace is None else grace)
    clusters = {CLUSTER: NODES} if placement == "single" else dict(DAS3)
    where = CLUSTER if placement == "single" else placement
    nodes = sum(clusters.values())
    sim = Simulation(clusters, settings)
    malleable: list[tuple[KoalaMalleable, float]] = []
    for i in range(jobs):
        at = i * interarrival
        curve = rng.choice((GADGET2, FT))
        rigid = workload == "Wmr" and rng.random() < 0.5
        if rigid:
            t = curve.time(MIN_NODES)
            sim.add(at, PlacedRigid(f"r{i}", where, MIN_NODES, t * 1.1, t))
        else:
            job = KoalaMalleable(f"m{i}", where, curve)
            sim.add(at, job)
            malleable.append((job, at))
    others = background_jobs(clusters, background, jobs * interarrival, seed) if background else []
    for at, launcher in others:
        sim.add(at, launcher)
    result = sim.run()
    done = [(j, at) for j, at in malleable if j.started is not None and j.ended is not None]
    execution = [j.ended - j.started for j, _ in done]  # type: ignore[operator]
    response = [j.ended - at for j, at in done]  # type: ignore[operator]
    end = max((r.end or result.now) for r in result.requests) if result.requests else 0.0
    used = sum(r.nodes * ((r.end or result.now) - r.start) for r in result.requests
               if r.type != "pre-allocation")
    return {
        "policy": policy, "precedence": precedence, "workload": workload, "placement": placement, "seed": seed,
        "jobs": jobs, "malleable": len(malleable), "finished": len(done),
        # how evenly worst-fit spread the malleable jobs: the largest share of them on one cluster
        "busiest_cluster_pct": 100.0 * max(Counter(j.cluster for j, _ in malleable).values(), default=0)
        / max(len(malleable), 1),
        "exec_mean_s": statistics.fmean(execution) if execution else float("nan"),
        "response_mean_s": statistics.fmean(response) if response else float("nan"),
        "avg_size": statistics.fmean(j.area / (j.ended - j.started) for j, _ in done) if done else 0.0,  # type: ignore[operator]
        "max_size_mean": statistics.fmean(j.max_size for j, _ in done) if done else 0.0,
        "stuck_at_min_pct": 100.0 * sum(j.max_size <= MIN_NODES for j, _ in done) / max(len(done), 1),
        **{f"stuck_{c.name.split()[0].lower()}_pct": _share([j.max_size <= MIN_NODES for j, _ in done if j.curve is c])
           for c in (GADGET2, FT)},
        # Fig. 8(a)'s reading of "stuck": the jobs whose size averaged over their run stays under MIN_NODES + 1
        "near_min_pct": _share([j.area / (j.ended - j.started) < MIN_NODES + 1 for j, _ in done]),  # type: ignore[operator]
        "utilisation_pct": 100.0 * used / (nodes * end) if end else 0.0,
        "grows": sum(j.grows for j, _ in malleable), "shrinks": sum(j.shrinks for j, _ in malleable),
        "makespan_s": end,
        # sessions the RMS ended for keeping nodes past a mandatory shrink's grace (none, by construction)
        "violators": sum("violation" in (a.end_reason or "") for a in result.apps.values()),
        **({"background_offered_pct": 100.0 * sum(b.nodes * b.runtime for _, b in others)
            / (nodes * jobs * interarrival)} if background else {}),
    }


GRACE = 10.0  # seconds a malleable job has to give back what a mandatory shrink takes


def _share(flags: list[bool]) -> float:
    return 100.0 * sum(flags) / len(flags) if flags else 0.0


# ==================================================================================================
# the experiments
# ==================================================================================================
FULL = (300, 4)  # jobs, seeds: the paper's 300 jobs, 4 runs per combination
QUICK = (60, 2)
SAME = 0.02  # two means within 2 % of each other: no difference, not a trend
KEYS = ("exec_mean_s", "response_mean_s", "avg_size", "max_size_mean", "stuck_at_min_pct", "utilisation_pct",
        "grows", "shrinks", "busiest_cluster_pct")


PLACEMENTS = (PLACEMENT, "single")  # the paper's set-up, and the first runs' (one cluster) beside it


def run_precedence(name: str, precedence: str, interarrival: float, out: Path, quick: bool) -> list[dict]:
    jobs, seeds = QUICK if quick else FULL
    rows = []
    for placement in PLACEMENTS:
        rows += _rows(precedence, interarrival, placement, jobs, seeds)
    write_csv(out / f"{name}.csv", rows)
    return rows


def _rows(precedence: str, interarrival: float, placement: str, jobs: int, seeds: int) -> list[dict]:
    rows = []
    for workload in WORKLOADS:
        for policy in POLICIES:
            runs = [simulate(policy, precedence, workload, jobs=jobs, interarrival=interarrival, seed=s,
                             placement=placement) for s in range(seeds)]
            row = {"policy": policy, "precedence": precedence, "workload": workload, "placement": placement,
                   "nodes": NODES if placement == "single" else sum(DAS3.values()),
                   "interarrival_s": interarrival, "jobs": jobs, "seeds": len(runs),
                   "unfinished": sum(r["malleable"] - r["finished"] for r in runs)}
            row |= {k: statistics.fmean(r[k] for r in runs) for k in KEYS}
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    return md_table(
        ("placement", "workload", "policy", "exec. time (s)", "response time (s)", "avg size", "max size",
         "stuck at 2 (%)", "utilisation (%)", "grows", "shrinks", "busiest cluster (%)"),
        [(_where(r), r["workload"], r["policy"].upper(), f"{r['exec_mean_s']:.0f}",
          f"{r['response_mean_s']:.0f}", f"{r['avg_size']:.1f}", f"{r['max_size_mean']:.1f}",
          f"{r['stuck_at_min_pct']:.0f}", f"{r['utilisation_pct']:.1f}", f"{r['grows']:.0f}", f"{r['shrinks']:.0f}",
          f"{r['busiest_cluster_pct']:.0f}") for r in rows])


def _where(row: dict) -> str:
    return f"Delft alone ({NODES})" if row["placement"] == "single" else f"DAS3 {row['placement']} ({row['nodes']})"


def _cmp(a: float, b: float) -> str:
    """Whether ``a`` is above ``b``: "holds", "no difference" (within SAME) or "opposite"."""
    if abs(a - b) <= SAME * max(abs(a), abs(b)):
        return "no difference"
    return "holds" if a > b else "opposite"


def trends(rows: list[dict], precedence: str) -> list[tuple[str, str]]:
    """The paper's statements about its figures, each checked on our rows of its set-up (DAS3, worst-fit):
    (statement, verdict)."""
    rows = [r for r in rows if r.get("placement", PLACEMENT) == PLACEMENT]
    by = {(r["workload"], r["policy"]): r for r in rows}
    out = []
    if precedence == "running":
        for w in WORKLOADS:
            f, e = by[(w, "fpsma")], by[(w, "egs")]
            out.append((f"{w}: EGS gives malleable jobs more nodes than FPSMA, on average",
                        _cmp(e["avg_size"], f["avg_size"])))
            out.append((f"{w}: ... and at their maximum", _cmp(e["max_size_mean"], f["max_size_mean"])))
            out.append((f"{w}: EGS makes more grow operations than FPSMA", _cmp(e["grows"], f["grows"])))
            out.append((f"{w}: no job is shrunk (PRA)", "holds" if e["shrinks"] == f["shrinks"] == 0 else "opposite"))
        out.append(("Wm: EGS gives a higher utilisation than FPSMA",
                    _cmp(by[("Wm", "egs")]["utilisation_pct"], by[("Wm", "fpsma")]["utilisation_pct"])))
        for p in POLICIES:
            out.append((f"{p.upper()}: more grow operations when all jobs are malleable (Wm vs Wmr)",
                        _cmp(by[("Wm", p)]["grows"], by[("Wmr", p)]["grows"])))
    else:
        for w in WORKLOADS:
            f, e = by[(w, "fpsma")], by[(w, "egs")]
            out.append((f"{w}: more jobs stuck at their minimum with EGS than with FPSMA",
                        _cmp(e["stuck_at_min_pct"], f["stuck_at_min_pct"])))
            shrunk = e["shrinks"] > 0 and f["shrinks"] > 0
            out.append((f"{w}: jobs are shrunk (PWA)", "holds" if shrunk else "opposite"))
        worst = max(rows, key=lambda r: r["response_mean_s"])
        out.append(("W'm: the response time is worst with EGS",
                    "holds" if (worst["workload"], worst["policy"]) == ("Wm", "egs") else "opposite"))
    return out


def markdown_for(name: str, rows: list[dict], precedence: str, paper: str) -> dict[str, str]:
    checks = "\n".join(f"- {v if v == 'holds' else f'**{v}**'}: {s}" for s, v in trends(rows, precedence))
    r0 = rows[0]
    return {name: f"**Paper:** {paper}\n\nOurs: {r0['jobs']} jobs, one inter-arrival of {r0['interarrival_s']:g} s, "
                  f"means over {r0['seeds']} seeds; DAS3's five clusters ({sum(DAS3.values())} nodes), each job "
                  f"placed by worst-fit, and Delft's cluster alone beside it; {THRESHOLD} nodes of each cluster kept "
                  "for local users. The trends are checked on the DAS3 rows.\n\n"
                  + table(rows) + "\n\n" + checks}


def main(argv: list[str] | None = None) -> None:
    """``python -m coorm.experiments.koala koala-pra|koala-pwa [--quick] [--out DIR]``: the experiment's rows
    as a CSV in DIR and its table and trend checks on stdout (until ``coorm experiment`` lists them)."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser(prog="python -m coorm.experiments.koala")
    parser.add_argument("name", choices=("koala-pra", "koala-pwa"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("out/experiments"))
    args = parser.parse_args(argv)
    module = importlib.import_module("coorm.experiments." + args.name.replace("-", "_"))
    rows = module.run(args.out, quick=args.quick)
    print("\n\n".join(module.markdown(rows).values()))


if __name__ == "__main__":
    main()
