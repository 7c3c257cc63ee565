"""What ``coorm status``, ``apps`` and ``requests`` show: a read of the cores' state, no change to it."""

from __future__ import annotations

from dataclasses import dataclass, field

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.core import PolicyCore
from coorm.services.policy_engine.state import Request, RequestState
from coorm.shared.protocol import AppStatus, ClusterStatus, RequestStatus, StatusReply
from coorm.shared.stepfn import INF


def _t(x: float) -> float | None:
    return None if x == INF else x


def status_of(cores: CoupledCores, sessions: dict[str, dict], leader: str, offset: int = 0,
              limit: int | None = None, only: set[str] | None = None) -> StatusReply:
    """The status; of the applications and requests (``only`` these applications' when given), those from
    ``offset`` (``limit`` of each at most), in a fixed order (applications by priority, requests by
    submission). The counts are the whole system's."""
    policy, alloc = cores.policy, cores.allocator
    requests: list[RequestStatus] = []
    use = _Use()
    per_app: dict[str, list[int]] = {}
    waiting = total = 0
    for r in policy.requests.values():
        if r.state is RequestState.ENDED:
            continue
        started = r.state is RequestState.STARTED
        ids = list(alloc.nodes_of(r.id)) if started else []
        counts = per_app.setdefault(r.app, [0, 0, 0])
        counts[1 if started else 0] += 1
        counts[2] += len(ids)
        if started:
            use.add(r, len(ids))
        total += 1
        waiting += not started
        if only is not None and r.app not in only:
            continue
        requests.append(RequestStatus(
            app=r.app, request=r.id, type=r.type.value, cluster=r.cluster or None, nodes=r.nodes,
            state=r.state.value, submitted=r.submitted_at, start=_t(r.start), end=_t(r.end) if started else None,
            related_to=r.related_to, related_how=r.related_how.value, blocked=r.blocked, node_ids=ids,
            placement=r.placement))
    clusters = use.clusters(policy)
    apps = []
    for a in policy.apps.values():
        if only is not None and a.id not in only:
            continue
        s = sessions.get(a.id, {})
        w, running, n = per_app.get(a.id, [0, 0, 0])
        apps.append(AppStatus(app=a.id, user=s.get("user", a.user), name=s.get("name", a.name),
                              kind=s.get("kind", a.kind), opened=a.opened_at, waiting=w, running=running, nodes=n))
    end = None if limit is None else offset + limit
    return StatusReply(now=cores.now, epoch=policy.epoch, leader=leader, clusters=clusters, apps=apps[offset:end],
                       requests=requests[offset:end], total_apps=len(apps), total_requests=len(requests),
                       waiting=waiting, running=total - waiting)


@dataclass(slots=True)
class _Use:
    """What the started requests do with their nodes, per cluster: the partition a cluster's status shows."""

    running_np: dict[str, int] = field(default_factory=dict)
    preemptible: dict[str, int] = field(default_factory=dict)
    pa_size: dict[str, int] = field(default_factory=dict)
    pa_used: dict[str, int] = field(default_factory=dict)

    def add(self, r: Request, allocated: int) -> None:
        c = r.cluster
        if r.is_preallocation:
            self.pa_size[c] = self.pa_size.get(c, 0) + r.nodes
        elif r.preemptible:
            self.preemptible[c] = self.preemptible.get(c, 0) + allocated
        else:
            self.running_np[c] = self.running_np.get(c, 0) + allocated
            if r.container is not None:
                self.pa_used[c] = self.pa_used.get(c, 0) + r.nodes

    def clusters(self, policy: PolicyCore) -> list[ClusterStatus]:
        out = []
        for c, up in sorted(policy.clusters.items()):
            # a partition of the up nodes: what runs (non-preemptively, preemptibly), what fair-start holds,
            # and of the rest, what started pre-allocations keep for their application (preemptible work
            # may run on pre-allocated nodes too: those count as preemptible)
            np_ = self.running_np.get(c, 0)
            pre = self.preemptible.get(c, 0)
            held = min(sum(h.nodes for h in policy.holds if h.cluster == c and h.physical),
                       max(up - np_ - pre, 0))
            rest = max(up - np_ - pre - held, 0)
            reserved = min(rest, max(self.pa_size.get(c, 0) - self.pa_used.get(c, 0), 0))
            out.append(ClusterStatus(cluster=c, up=up, non_preemptible=np_, pre_allocated_unused=reserved,
                                     preemptible=pre, held=held, idle=rest - reserved))
        return out


@dataclass(slots=True)
class Counts:
    """What the engine's gauges show, counted in one read of the cores. The engine reads it every second:
    building a status (a model per application and per request) took most of an idle engine's time with a
    thousand sessions open, in one block of the event loop."""

    clusters: list[ClusterStatus]
    sessions: dict[str, int]  # kind -> open sessions
    running: dict[tuple[str, str], int]  # (cluster, type) -> started requests
    waiting: dict[tuple[str, str], int]  # (cluster or "unplaced", type) -> waiting requests
    app_nodes: dict[tuple[str, str], int]  # (kind, type) -> nodes held by started requests
    waits: dict[str, list[float]]  # cluster -> seconds from now to each waiting request's planned start


def counts_of(cores: CoupledCores, sessions: dict[str, dict]) -> Counts:
    policy, alloc = cores.policy, cores.allocator
    kind = {a.id: sessions.get(a.id, {}).get("kind", a.kind) or "unknown" for a in policy.apps.values()}
    per_kind: dict[str, int] = {}
    for k in kind.values():
        per_kind[k] = per_kind.get(k, 0) + 1
    use = _Use()
    running: dict[tuple[str, str], int] = {}
    app_nodes: dict[tuple[str, str], int] = {}
    for r in policy.started.values():
        n = len(alloc.nodes_of(r.id))
        use.add(r, n)
        t = r.type.value
        running[r.cluster, t] = running.get((r.cluster, t), 0) + 1
        key = (kind.get(r.app, "unknown"), t)
        app_nodes[key] = app_nodes.get(key, 0) + n
    waiting: dict[tuple[str, str], int] = {}
    waits: dict[str, list[float]] = {}
    started, now = policy.started, cores.now
    for r in policy.requests.values():
        if r.id in started:
            continue
        cluster = r.cluster or "unplaced"  # (left to the RMS, which has not chosen its cluster yet)
        waiting[cluster, r.type.value] = waiting.get((cluster, r.type.value), 0) + 1
        if r.start != INF:
            waits.setdefault(cluster, []).append(max(0.0, r.start - now))
    return Counts(use.clusters(policy), per_kind, running, waiting, app_nodes, waits)
