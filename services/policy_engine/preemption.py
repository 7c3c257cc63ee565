"""The preemptible part of a pass (CooRMv2 §III-A4, §III-B, §IV "malleable").

Rules:
* a preemptible request's earliest start is a lower bound from its relations (COALLOC: when the request it
  is tied to starts; NEXT: when its predecessor ends; an unbounded predecessor ends only by ``done``);
* it starts, in rank order (:mod:`.shares`: priority; under KOALA's FPSMA and EGS, the order the
  applications first started in) and submission order within an application, when the application's
  preemptive view at "now" covers what it already holds plus the request, and the nodes are free;
* a holder whose preemptive view at "now" is below what it holds gets a deadline ``now + preempt_grace``;
  if it still holds too much when the deadline passes it is a violator (the core kills it and ends its
  session); the deadline is lifted as soon as it holds no more than its view. This is KOALA's mandatory
  shrink; a drop announced for later is its voluntary one (a hint the application may follow early).
  Under precedence to running applications (PRA) waiting requests are placed after what is held
  preemptibly (:meth:`PolicyCore._base`), so only nodes going down, a pre-allocation's owner using its
  nodes or, under ``filling``/``strict``, another malleable application's share make a holder shrink.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coorm.services.policy_engine.schedule import PreemptibleDemand, Schedule, interval_hash, name_hash
from coorm.services.policy_engine.shares import INCREMENTAL, preemptive_share
from coorm.services.policy_engine.state import Request, RequestState
from coorm.shared.events import PreemptionDeadline
from coorm.shared.requests import Relation

if TYPE_CHECKING:
    from coorm.services.policy_engine.core import PolicyCore
from coorm.shared.stepfn import INF

STARTED, WAITING = RequestState.STARTED, RequestState.WAITING


def _lower_bound(core: PolicyCore, r: Request, lbs: dict[str, float]) -> float:
    now = core.now
    if not r.constrained or r.related_to is None:
        return now
    target = core.requests.get(r.related_to)
    if target is None:
        return now
    if r.related_how is Relation.NEXT:
        if target.state is STARTED:
            return max(now, target.end)
        base = lbs.get(target.id, INF) if target.preemptible else target.start
        return max(now, base + target.duration)
    if target.state is STARTED:
        return now
    return max(now, lbs.get(target.id, INF) if target.preemptible else target.start)


def collect_demands(core: PolicyCore, sched: Schedule) -> None:
    """Fill ``sched.demands`` (per cluster, rank order) and the waiting requests' lower bounds. The rank is
    the priority, or under KOALA's policies the order the applications first started in ("previously
    started"; one not started yet comes after, by priority), which the signature then carries with what
    each holds."""
    lbs: dict[str, float] = {}
    per_cluster: dict[str, list[PreemptibleDemand]] = {}
    sig = 0
    incremental = core.settings.preemptible in INCREMENTAL
    for app in core.priority_order():
        if not app.preemptible:
            continue
        mine: dict[str, list[tuple[float, float, int]]] = {}
        held: dict[str, list[tuple[float, float, int]]] = {}
        for r in app.preemptible.values():
            if r.state is STARTED:
                mine.setdefault(r.cluster, []).append((r.start, r.end, r.nodes))
                held.setdefault(r.cluster, []).append((r.start, r.end, r.nodes))
            else:
                lb = _lower_bound(core, r, lbs)
                lbs[r.id] = lb
                r.start = lb
                if lb < INF:
                    mine.setdefault(r.cluster, []).append((lb, lb + r.duration, r.nodes))
        rank = (app.started_at, app.seq) if incremental else app.priority
        for c, intervals in mine.items():
            per_cluster.setdefault(c, []).append(PreemptibleDemand(app.id, rank, intervals, held.get(c, [])))
            for item in intervals:
                sig += interval_hash(app.id + "@" + c, item)
            if incremental:
                sig += hash(rank) + hash((name_hash(app.id), len(held.get(c, ()))))
                for item in held.get(c, ()):
                    sig += interval_hash(app.id + "#" + c, item)
    if incremental:
        for ds in per_cluster.values():
            ds.sort(key=lambda d: d.priority)
    for c, items in sched.np_usage.items():
        for item in items:
            sig += interval_hash(c, item)
    if sched.threshold:
        sig += hash((-1, sched.threshold))
    sched.demands = per_cluster
    sched.p_signature = (sig + hash(tuple((name_hash(c), n) for c, n in sorted(sched.up.items())))) & ((1 << 64) - 1)


def _capacity_now(core: PolicyCore, sched: Schedule, cluster: str) -> int:
    used = sched.used_now.get(cluster)
    if used is None:  # once per pass and cluster: start_preemptible and enforce both ask
        now = core.now
        used = sched.used_now[cluster] = sum(n for b, e, n in sched.np_usage.get(cluster, ()) if b <= now < e)
    return core.clusters[cluster] - used


def _wants_now(core: PolicyCore, sched: Schedule, cluster: str) -> list[tuple[str, int, int]]:
    """(app, held, wanted) at now for each application with preemptible requests on ``cluster``, in rank
    order."""
    now = core.now
    out = []
    for demand in sched.demands.get(cluster, ()):
        app = core.apps.get(demand.app)
        if app is None:
            continue
        held = wanted = 0
        for r in app.preemptible.values():
            if r.cluster == cluster:
                if r.state is STARTED:
                    held += r.nodes
                    wanted += r.nodes
                elif r.start <= now:
                    wanted += r.nodes
        if wanted:
            out.append((app.id, held, wanted))
    return out


def _views_now(core: PolicyCore, sched: Schedule, cluster: str) -> list[tuple[str, int, int]]:
    """(app, held, preemptive view) at now, in rank order."""
    capacity = _capacity_now(core, sched, cluster)
    ranked = _wants_now(core, sched, cluster)
    wants = [w for _, _, w in ranked]
    holds = [h for _, h, _ in ranked]
    policy, threshold = sched.policy, sched.threshold
    return [(app_id, held, preemptive_share(capacity, wants, idx, policy, holds, threshold))
            for idx, (app_id, held, _) in enumerate(ranked)]


def within_view(core: PolicyCore, sched: Schedule, app_id: str, cluster: str) -> bool:
    """Whether ``app_id`` holds no more preemptibly on ``cluster`` than its preemptive view now, the capacity
    shared as the last pass shares it (one that wants nothing there any more holds nothing there)."""
    for app, held, view in _views_now(core, sched, cluster):
        if app == app_id:
            return held <= view
    return True


def due_preemptible(core: PolicyCore, sched: Schedule, free: dict[str, int]) -> list[Request]:
    """The waiting preemptible requests that start now: each fits in its application's preemptive view,
    in the nodes still free (taken from ``free``) and, with a threshold, in what preemptible work may hold
    on the cluster at all, in rank order. (Under ``filling`` and ``strict`` a view counts on the shrinks it
    causes: without the last check a request would start on the threshold's idle nodes while the holders
    above their views still had their grace.)"""
    starts: list[Request] = []
    for cluster in sched.demands:
        views = _views_now(core, sched, cluster)
        room = _capacity_now(core, sched, cluster) - sched.threshold - sum(held for _, held, _ in views) \
            if sched.threshold else INF
        for app_id, held, view in views:
            for r in list(core.apps[app_id].requests.values()):
                if not (r.preemptible and r.state is WAITING and r.cluster == cluster and r.start <= core.now):
                    continue
                if held + r.nodes > view or r.nodes > free[cluster] or r.nodes > room:
                    break
                held += r.nodes
                room -= r.nodes
                free[cluster] -= r.nodes
                starts.append(r)
    return starts


def enforce(core: PolicyCore, sched: Schedule, stimulus: str) -> tuple[list[PreemptionDeadline], list[str]]:
    """Deadlines for holders above their preemptive view; the applications past theirs."""
    decisions: list[PreemptionDeadline] = []
    violators: list[str] = []
    now = core.now
    grace = core.settings.preempt_grace
    holding: set[tuple[str, str]] = set()
    for cluster in sched.demands:
        for app_id, held, view in _views_now(core, sched, cluster):
            if held == 0:
                continue
            holding.add((app_id, cluster))
            app = core.apps[app_id]
            if held <= view or held <= app.shrink_to.get(cluster, -1):
                # within its view; or it gave back what its pending shrink asked: a view lower still is a new
                # shrink, told below with its own grace
                app.deadlines.pop(cluster, None)
                app.shrink_to.pop(cluster, None)
                if held <= view:
                    continue
            deadline = app.deadlines.get(cluster)
            if deadline is None:
                deadline = now + grace
                app.deadlines[cluster] = deadline
                app.shrink_to[cluster] = view
                decisions.append(
                    PreemptionDeadline(
                        stimulus_id=stimulus, app=app_id, cluster=cluster, held=held, allowed=view, deadline=deadline
                    )
                )
            elif deadline <= now and app_id not in violators:
                violators.append(app_id)
    for app in core.apps.values():
        if not app.deadlines:
            continue
        for cluster in [c for c in app.deadlines if (app.id, c) not in holding]:
            del app.deadlines[cluster]
            app.shrink_to.pop(cluster, None)
    return decisions, violators


def next_change(core: PolicyCore, sched: Schedule) -> float:
    """The earliest future time a waiting preemptible request may become startable."""
    t = INF
    for app in core.apps.values():
        for r in app.preemptible.values():
            if r.state is WAITING and core.now < r.start < t:
                t = r.start
    return t
