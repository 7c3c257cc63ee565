"""What ``coorm status``, ``apps`` and ``requests`` show: a read of the cores' state, no change to it."""

from __future__ import annotations

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine.state import RequestState
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
    running_np: dict[str, int] = {}
    preemptible: dict[str, int] = {}
    pa_size: dict[str, int] = {}
    pa_used: dict[str, int] = {}
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
            if r.is_preallocation:
                pa_size[r.cluster] = pa_size.get(r.cluster, 0) + r.nodes
            elif r.preemptible:
                preemptible[r.cluster] = preemptible.get(r.cluster, 0) + len(ids)
            else:
                running_np[r.cluster] = running_np.get(r.cluster, 0) + len(ids)
                if r.container is not None:
                    pa_used[r.cluster] = pa_used.get(r.cluster, 0) + r.nodes
        total += 1
        waiting += not started
        if only is not None and r.app not in only:
            continue
        requests.append(RequestStatus(
            app=r.app, request=r.id, type=r.type.value, cluster=r.cluster or None, nodes=r.nodes,
            state=r.state.value, submitted=r.submitted_at, start=_t(r.start), end=_t(r.end) if started else None,
            related_to=r.related_to, related_how=r.related_how.value, blocked=r.blocked, node_ids=ids,
            placement=r.placement))
    clusters = []
    for c, up in sorted(policy.clusters.items()):
        # a partition of the up nodes: what runs (non-preemptibly, preemptibly), what fair-start holds, and
        # of the rest, what started pre-allocations keep for their application (preemptible work may run
        # on pre-allocated nodes too: those count as preemptible)
        np_ = running_np.get(c, 0)
        pre = preemptible.get(c, 0)
        held = min(sum(h.nodes for h in policy.holds if h.cluster == c and h.physical), max(up - np_ - pre, 0))
        rest = max(up - np_ - pre - held, 0)
        reserved = min(rest, max(pa_size.get(c, 0) - pa_used.get(c, 0), 0))
        clusters.append(ClusterStatus(cluster=c, up=up, non_preemptible=np_, pre_allocated_unused=reserved,
                                      preemptible=pre, held=held, idle=rest - reserved))
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
