"""The complex-moldable, multi-cluster CEM application of CooRM §II, and its launcher.

**The application.** A Computational ElectroMagnetics solver: a finite-element method iterating over a
mesh, ported to run on several clusters (MPI inside a cluster, TCP between clusters). Its parameters are
the number of hosts on each cluster, so it has ``(nH + 1)^nC - 1`` configurations; its speed-up depends on
the hosts' speed, the number of hosts, and the WAN latency and bandwidth between the clusters used
(CooRM Fig. 1). Our performance model, for ``h_c`` hosts on each cluster ``c`` of a set ``S`` of ``k``
clusters:

    runtime(h)   = ceil(iterations * t_iter(h))                                     (seconds)
    t_iter(h)    = work / P  +  per_host * H  +  wan(S)
    P            = sum_c h_c * speed_c         (computing power, in speed-1 hosts)
    H            = sum_c h_c
    wan(S)       = 0                                                        if k == 1
                 = (k - 1) * (per_cluster + 8 * wan_volume_mb / B_min)
                   + wan_messages * L_max / 1000                            if k >= 2

``work / P`` is the perfectly parallel part of an iteration; ``per_host * H`` the collective operations
(dot products of the iterative solver, halo bookkeeping) whose cost grows with the number of processes;
``wan`` the inter-cluster coupling: a fixed TCP coupling cost and a halo exchange of ``wan_volume_mb`` per
extra cluster over the slowest link used (``B_min``, Mbit/s), and ``wan_messages`` latency-bound
exchanges over the longest link used (``L_max``, ms, from ``listInterClusterInfo``).

Constants (:class:`CEMModel`): ``iterations = 10_000``, ``work = 20`` host-seconds per iteration (a
speed-1 host), ``per_host = 1e-4`` s, ``per_cluster = 0.02`` s, ``wan_volume_mb = 1``,
``wan_messages = 2``, ``B_min`` defaults to 1000 Mbit/s. On the paper's platform (:func:`paper_platform`:
clusters of 128 hosts, the i-th 1 + 0.1 (i - 1) times faster, hierarchical WAN latencies of 2.5, 5, 10...
ms) one whole slow cluster runs it in 1691 s (t_iter = 0.169 s). The best single-cluster size would be
``sqrt(work * speed / per_host)`` ~ 447 hosts, beyond a cluster, so a second cluster pays off -- but only
when enough of its hosts are free: adding 128 hosts of the 1.1x sibling cluster cuts t_iter to 0.126 s,
adding 16 makes it worse (0.178 s); the break-even is ~28 hosts. With many free clusters the optimum is a
subset of them, since the per-host term and the WAN costs grow with the set (as in Fig. 1): with 8 free
clusters, the two fastest (988 s, against 1048 s for the fastest alone and more for three).

**The selection heuristic.** Minimise completion time from the non-preemptive views, without enumerating
the configurations:

1. Candidate start times: now, then the breakpoints of the views where some cluster's availability
   *increases* (only there can a better start open up), the first ``max_starts`` of them, plus the views'
   horizon (after their last breakpoint nothing changes, so a selection is found there if any host
   exists). Candidates are visited in time order; the search stops at the first one from which even the
   run chosen with every cluster at its peak availability (the shortest the heuristic would find) would
   not end before the best completion found.
2. At a candidate ``t``, each cluster's cap is the view's value at ``t``. A greedy choice under caps: for
   each seed cluster, its best host count alone; then, while one does, add the cluster (with its best host
   count given the set so far) that lowers ``t_iter`` most -- candidates taken in decreasing available
   computing power (cap x speed), which breaks ties; then one pass re-optimising each chosen cluster's
   count given the others. A cluster's best host count is closed-form: ``f(n) = work / (P + s n) +
   per_host * n`` is convex with its real minimum at ``n* = (sqrt(work * s / per_host) - P) / s``, clipped
   to ``[1, cap]``. The best seed wins (ties: fewer hosts, then fewer clusters). Choices are memoised per
   caps vector.
3. Duration/hosts fixpoint: with the chosen hosts the run lasts ``D``; if some cluster's view offers fewer
   hosts than chosen somewhere in ``[t, t + D)``, its cap becomes that minimum and step 2 runs again (caps
   only go down, so ``D`` only grows), at most ``fixpoint_rounds`` times; a candidate that does not settle
   is dropped. What is kept therefore fits in every cluster's view over its whole run from ``t``: the
   launcher never asks for more hosts than its view offers.

Complexity per selection, for ``nC`` clusters of which ``k`` end up chosen: ``K = max_starts + 2``
candidates, ``F = fixpoint_rounds`` rounds each; a round costs ``nC`` seeds x ``k + 1`` growth steps x
``nC`` candidate clusters x ``O(k)`` to update the WAN maximum and minimum, plus ``nC`` ``min_over``
look-ups of ``O(log B)`` (``B`` breakpoints): ``O(K F nC^2 k^2)`` model steps, ``O(K F nC^4)`` at worst,
and independent of the number of hosts -- instead of the ``(nH + 1)^nC - 1 ~ 7.7e16`` configurations of 8
clusters of 128 hosts. Measured: on 8 clusters whose views have 100 random breakpoints each, at most
~55 000 model steps and ~30 ms per selection; on small platforms (2-4 clusters of 8 hosts, random caps and
model constants) it found the exhaustive optimum in 1000 random cases out of 1000.

**The launcher.** Until started, on every view it selects (after ``adaptation_delay``, CooRM §IV-C: every
view arms a timer ``now + delay``, and the selection runs when it fires, on the latest view received; with
no delay, at once in ``on_views``; with a ``start_lag``, a new choice made on a view where the hosts
it waits with are gone -- maybe its own start, not heard yet -- waits that long for the start: see
:class:`~coorm.launchers.base.SelectingLauncher`). The selection runs once per distinct input -- the views seen from the
time it selects -- and is memoised (``computed_configurations``). A new selection (other clusters or host
counts) is submitted as one request per cluster, the first FREE and the others COALLOC to it, in place of
the previous requests, cancelled in the same step (one atomic replace: the request's ``replaces``; if one
of them had started, the RMS refuses it and the launcher keeps that group). The requests start together;
when the last has started, a timer at ``start + runtime * runtime_fraction`` ends the run: ``done`` on
every request, then close.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coorm.launchers.base import ClusterProps, Command, SelectingLauncher, Timer, Views
from coorm.shared.requests import Relation, RequestSpec
from coorm.shared.stepfn import INF, StepFunction


# ------------------------------------------------------------------------------------------------
# the performance model
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CEMModel:
    iterations: int = 10_000
    work: float = 20.0  # host-seconds per iteration on a speed-1 host
    per_host: float = 1e-4  # seconds per iteration per host (collectives)
    per_cluster: float = 0.02  # seconds per iteration per extra cluster (TCP coupling)
    wan_volume_mb: float = 1.0  # MB exchanged per iteration per extra cluster
    wan_messages: int = 2  # latency-bound WAN exchanges per iteration
    default_bandwidth_mbps: float = 1000.0

    def wan(self, k: int, latency_ms: float, bandwidth_mbps: float) -> float:
        if k <= 1:
            return 0.0
        return (k - 1) * (self.per_cluster + 8.0 * self.wan_volume_mb / bandwidth_mbps) + (
            self.wan_messages * latency_ms / 1000.0
        )

    def iteration_time(self, hosts: dict[str, int], props: ClusterProps) -> float:
        used = sorted(c for c, n in hosts.items() if n > 0)
        if not used:
            return INF
        power = sum(hosts[c] * props.speed_of(c) for c in used)
        total = sum(hosts[c] for c in used)
        lat, bw = 0.0, INF
        for i, a in enumerate(used):
            for b in used[i + 1 :]:
                lat = max(lat, props.latency(a, b))
                bw = min(bw, bandwidth(props, a, b, self.default_bandwidth_mbps))
        return self.work / power + self.per_host * total + self.wan(len(used), lat, bw)

    def runtime(self, hosts: dict[str, int], props: ClusterProps) -> float:
        """Seconds, rounded up to a whole second (what the launcher requests)."""
        t = self.iteration_time(hosts, props)
        return INF if t == INF else max(1.0, float(math.ceil(self.iterations * t - 1e-9)))

    def best_count(self, speed: float, power: float, cap: int) -> int:
        """The host count in ``[1, cap]`` minimising ``work / (power + speed n) + per_host n`` (convex in n:
        its real minimum ``(sqrt(work speed / per_host) - power) / speed``, clipped, then rounded the better
        way)."""
        if cap <= 1:
            return 1
        if self.per_host <= 0:
            return cap
        x = (math.sqrt(self.work * speed / self.per_host) - power) / speed
        if x <= 1:
            return 1
        if x >= cap:
            return cap
        lo = int(x)
        hi = lo + 1
        f_lo = self.work / (power + speed * lo) + self.per_host * lo
        f_hi = self.work / (power + speed * hi) + self.per_host * hi
        return lo if f_lo <= f_hi else hi


def bandwidth(props: ClusterProps, a: str, b: str, default: float) -> float:
    return props.bandwidth_mbps.get((a, b), props.bandwidth_mbps.get((b, a), default))


def paper_platform(n_clusters: int, hosts: int = 128, base_latency_ms: float = 2.5) -> ClusterProps:
    """CooRM §IV-A's resources: ``n_clusters`` clusters ``c0 .. c{n-1}`` of ``hosts`` hosts, the i-th (from
    1) ``1 + 0.1 (i - 1)`` times faster than the first, joined by a hierarchical WAN: clusters ``i`` and
    ``j`` (from 0) meet at level ``L = bit_length(i xor j)`` of a binary tree, with latency
    ``base * 2^(L-1)`` ms (2.5 between siblings, 5, 10, 20...) and bandwidth ``10 / 2^(L-1)`` Gbit/s."""
    names = [f"c{i}" for i in range(n_clusters)]
    lat: dict[tuple[str, str], float] = {}
    bw: dict[tuple[str, str], float] = {}
    for i in range(n_clusters):
        for j in range(i + 1, n_clusters):
            level = (i ^ j).bit_length()
            lat[(names[i], names[j])] = base_latency_ms * 2 ** (level - 1)
            bw[(names[i], names[j])] = 10_000.0 / 2 ** (level - 1)
    return ClusterProps(
        nodes={c: hosts for c in names},
        speed={c: 1.0 + 0.1 * i for i, c in enumerate(names)},
        latency_ms=lat,
        bandwidth_mbps=bw,
    )


# ------------------------------------------------------------------------------------------------
# the selection
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Selection:
    hosts: tuple[tuple[str, int], ...]  # (cluster, hosts), seed first
    start: float  # expected, from the views it was made on
    duration: float

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def config(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(self.hosts))

    @property
    def total_hosts(self) -> int:
        return sum(n for _, n in self.hosts)


class Selector:
    """The heuristic of the module docstring, over fixed cluster properties and model. One selector may
    serve many selections: what it learns (pair metrics, greedy choices per caps) depends on nothing else.
    """

    def __init__(
        self, model: CEMModel, props: ClusterProps, *, max_starts: int = 32, fixpoint_rounds: int = 4
    ) -> None:
        self.model = model
        self.props = props
        self.max_starts = max_starts
        self.fixpoint_rounds = fixpoint_rounds
        self.evaluations = 0  # model steps, for the complexity claim
        self._pairs: dict[tuple[str, str], tuple[float, float]] = {}  # latency, bandwidth
        self._cache: dict[tuple, dict[str, int] | None] = {}  # caps -> greedy choice

    def _pair(self, a: str, b: str) -> tuple[float, float]:
        v = self._pairs.get((a, b))
        if v is None:
            v = (self.props.latency(a, b), bandwidth(self.props, a, b, self.model.default_bandwidth_mbps))
            self._pairs[(a, b)] = self._pairs[(b, a)] = v
        return v

    def _greedy(self, caps: dict[str, int], order: list[str]) -> dict[str, int] | None:
        key = tuple(caps.get(c, 0) for c in order)
        if key not in self._cache:
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[key] = self._greedy_uncached(caps, order)
        hosts = self._cache[key]
        return None if hosts is None else dict(hosts)

    def _greedy_uncached(self, caps: dict[str, int], order: list[str]) -> dict[str, int] | None:
        m = self.model
        work, per_host = m.work, m.per_host
        speed = {c: self.props.speed_of(c) for c in order}
        # candidates in decreasing computing power available (cap x speed): ties go to the first
        usable = sorted((c for c in order if caps.get(c, 0) >= 1), key=lambda c: -caps[c] * speed[c])
        best: tuple | None = None
        for seed in usable:
            n = m.best_count(speed[seed], 0.0, caps[seed])
            hosts = {seed: n}
            power, total, lat, bw = n * speed[seed], n, 0.0, INF
            t = work / power + per_host * total
            while True:  # add the cluster that lowers t_iter most, while one does
                step: tuple | None = None
                for c in usable:
                    if c in hosts:
                        continue
                    n = m.best_count(speed[c], power, caps[c])
                    lat2, bw2 = lat, bw
                    for d in hosts:
                        pl, pb = self._pair(c, d)
                        lat2 = pl if pl > lat2 else lat2
                        bw2 = pb if pb < bw2 else bw2
                    self.evaluations += 1 + len(hosts)
                    t2 = work / (power + n * speed[c]) + per_host * (total + n) + m.wan(len(hosts) + 1, lat2,
                                                                                        bw2)
                    if t2 < (t if step is None else step[0]):
                        step = (t2, c, n, lat2, bw2)
                if step is None:
                    break
                t, c, n, lat, bw = step
                hosts[c] = n
                power += n * speed[c]
                total += n
            # one pass of re-optimising each count given the others (the WAN term does not depend on it)
            for c in list(hosts):
                self.evaluations += 1
                rest = power - hosts[c] * speed[c]
                n = m.best_count(speed[c], rest, caps[c])
                t2 = (work / (rest + n * speed[c]) + per_host * (total - hosts[c] + n)
                      + m.wan(len(hosts), lat, bw))
                if n != hosts[c] and t2 < t:
                    power, total, t = rest + n * speed[c], total - hosts[c] + n, t2
                    hosts[c] = n
            rank = (t, total, len(hosts))
            if best is None or rank < best[0]:
                best = (rank, hosts)
        return None if best is None else best[1]

    def candidates(self, views: dict[str, StepFunction], now: float) -> list[float]:
        rises: set[float] = set()
        horizon = now
        for f in views.values():
            horizon = max(horizon, f.times[-1])
            for i in range(1, len(f.times)):
                if f.values[i] > f.values[i - 1] and f.times[i] > now:
                    rises.add(f.times[i])
        out = [now] + sorted(rises)[: self.max_starts]
        if horizon > out[-1]:
            out.append(horizon)
        return out

    def at(self, t: float, views: dict[str, StepFunction], order: list[str]) -> Selection | None:
        """The greedy choice starting at ``t``, settled by the duration/hosts fixpoint, or None."""
        caps = {c: views[c].value_at(t) for c in order}
        for _ in range(self.fixpoint_rounds):
            hosts = self._greedy(caps, order)
            if hosts is None:
                return None
            duration = self.model.runtime(hosts, self.props)
            fits = True
            for c, n in hosts.items():
                avail = views[c].min_over(t, t + duration)
                if avail < n:
                    caps[c] = avail
                    fits = False
            if fits:
                ordered = tuple((c, hosts[c]) for c in hosts)  # seed first (insertion order)
                return Selection(ordered, t, duration)
        return None

    def select(self, views: dict[str, StepFunction], now: float) -> Selection | None:
        order = sorted(views, key=lambda c: (-self.props.speed_of(c), c))
        # the run chosen with every cluster at its peak availability: the shortest the heuristic finds
        peak = self._greedy({c: views[c].clip(now).max_value() for c in order}, order)
        if peak is None:
            return None
        shortest = self.model.runtime(peak, self.props)
        best: Selection | None = None
        for t in self.candidates(views, now):
            if best is not None and t + shortest >= best.end:
                break
            sel = self.at(t, views, order)
            if sel is not None and (
                best is None or (sel.end, sel.total_hosts, len(sel.hosts)) < (best.end, best.total_hosts,
                                                                              len(best.hosts))
            ):
                best = sel
        return best


# ------------------------------------------------------------------------------------------------
# the launcher
# ------------------------------------------------------------------------------------------------
class CEMLauncher(SelectingLauncher):
    kind = "cem"

    def __init__(
        self,
        app: str,
        *,
        model: CEMModel | None = None,
        clusters: tuple[str, ...] | None = None,
        runtime_fraction: float = 1.0,
        adaptation_delay: float = 0.0,
        max_starts: int = 32,
        fixpoint_rounds: int = 4,
        start_lag: float | None = None,
    ) -> None:
        super().__init__(app, adaptation_delay, start_lag)
        if not 0 < runtime_fraction <= 1.0:
            raise ValueError("runtime_fraction must be in (0, 1]: a run longer than its walltime is killed")
        self.model = model or CEMModel()
        self.only = clusters  # the FILTER: clusters it may use (None: every cluster it sees)
        self.runtime_fraction = runtime_fraction
        self.max_starts = max_starts
        self.fixpoint_rounds = fixpoint_rounds
        self.props: ClusterProps | None = None
        self.selection: Selection | None = None
        self.group: tuple[str, ...] = ()  # the current requests, first the FREE one
        self.started_members: set[str] = set()
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.runtime: float | None = None
        self.resubmissions = 0
        self._memo: dict[tuple, Selection | None] = {}
        self._selector: Selector | None = None

    # -- selection ------------------------------------------------------------------------------------
    def _props(self, views: Views) -> ClusterProps:
        if self.props is None:  # no listClustersInfo answer: assume equal, speed-1 clusters
            self.props = ClusterProps(nodes={c: f.max_value() for c, f in views.non_preemptive.items()})
        return self.props

    def _reselect(self, now: float) -> list[Command]:
        if self.started_members or self.closed or self._latest is None or self._answer_pending():
            return []  # once a request of the group has started, the group is committed
        views = self._latest
        props = self._props(views)
        seen = {
            c: f.clip(now)
            for c, f in sorted(views.non_preemptive.items())
            if self.only is None or c in self.only
        }
        key = tuple((c, f.times, f.values) for c, f in seen.items())
        if key in self._memo:
            sel = self._memo[key]
        else:
            self.count_configuration(key)
            if self._selector is None or self._selector.props is not props:
                self._selector = self.new_selector(props)
            sel = self._memo[key] = self._selector.select(seen, now)
        if sel is None:
            return []  # no host anywhere: wait for a view that has some
        if self.selection is not None and sel.config == self.selection.config:
            self.selection = sel  # same configuration: the RMS moves the requests itself
            self._held_since = None
            return []
        if self.selection is not None and self.group:
            held = self.hold_back(now, self._still_fits(seen, now))
            if held is not None:
                return held
        specs: list[RequestSpec] = []
        for c, n in sel.hosts:
            rid = self.new_id()
            if specs:
                specs.append(RequestSpec(id=rid, cluster=c, nodes=n, duration=sel.duration,
                                         related_to=specs[0].id, related_how=Relation.COALLOC))
            else:
                specs.append(RequestSpec(id=rid, cluster=c, nodes=n, duration=sel.duration))
        out: list[Command]
        if self.group:  # the new group in place of the old, in one step
            self.resubmissions += 1
            out = [self._replace(self.group, (self.group, self.selection), *specs)]
        else:
            out = [self.submit(*specs)]
        self.group = tuple(s.id for s in specs)
        self.selection = sel
        return out

    def new_selector(self, props: ClusterProps) -> Selector:
        """The heuristic over these clusters' properties (a subclass may choose otherwise: the twin's
        simulator held to a live run's choices)."""
        return Selector(self.model, props, max_starts=self.max_starts, fixpoint_rounds=self.fixpoint_rounds)

    def _restore(self, saved: object) -> None:
        self.group, self.selection = saved if isinstance(saved, tuple) else ((), None)

    def _still_fits(self, views: dict[str, StepFunction], now: float) -> bool:
        """The hosts waited with are still there, in ``views``, over the run from when it was expected to
        start (or now): on every cluster of the group."""
        sel = self.selection
        assert sel is not None
        t = max(sel.start, now)
        return all(c in views and views[c].min_over(t, t + sel.duration) >= n for c, n in sel.hosts)

    # -- events ---------------------------------------------------------------------------------------
    def on_open(self, now: float, props: ClusterProps) -> list[Command]:
        self.props = props
        return []

    def selecting(self) -> bool:
        return not self.started_members and not self.closed

    def on_timer(self, now: float, key: str) -> list[Command]:
        if key == "select":
            return self._reselect(now)
        if key == "end" and self.started_at is not None and not self.closed:
            self.ended_at = now
            return [self.finish(r) for r in self.group if r in self.running] + self.close()
        return []

    def on_start(self, now: float, request: str, nodes: tuple[str, ...]) -> list[Command]:
        self._start_of_replaced(request)  # (a replace of its group not answered yet is refused: it is kept)
        if request not in self.group or request in self.started_members:
            return []
        super().on_start(now, request, nodes)
        self.started_members.add(request)
        if len(self.started_members) < len(self.group):
            return []
        assert self.selection is not None
        self.started_at = now
        self.runtime = self.selection.duration * self.runtime_fraction
        return [Timer(now + self.runtime, "end")]

    def on_end(self, now: float, request: str, reason: str) -> list[Command]:
        was_running = request in self.running
        super().on_end(now, request, reason)
        if request not in self.group or not was_running or self.closed:
            return []
        others = [r for r in self.group if r in self.running]
        if reason == "walltime" and others:
            return []  # they reach their walltime together: the others' ends follow
        # the run is over on every cluster (walltime, or a lost node that brings the coupled run down)
        self.ended_at = now
        return [self.finish(r) for r in others] + self.close()

    def stats(self) -> dict:
        sel = self.selection
        return {
            "clusters": dict(sel.hosts) if sel else {},
            "hosts": sel.total_hosts if sel else 0,
            "duration": sel.duration if sel else None,
            "start": self.started_at,
            "end": self.ended_at,
            "computed_configurations": self.computed_configurations,
            "resubmissions": self.resubmissions,
        }
