"""Invariants of the policy core's state, checked after every event when ``validate`` is on (tests, the
simulator). Each check names what broke; a failure is a bug in the core, never in the input."""

from __future__ import annotations

from typing import TYPE_CHECKING

from coorm.services.policy_engine.state import RequestState

if TYPE_CHECKING:
    from coorm.services.policy_engine.core import PolicyCore

STARTED, WAITING = RequestState.STARTED, RequestState.WAITING


class InvariantError(AssertionError):
    pass


def check(core: PolicyCore) -> None:
    now = core.now
    used = {c: 0 for c in core.clusters}
    for rid, r in core.requests.items():
        if rid != r.id or core.apps.get(r.app) is None or core.apps[r.app].requests.get(rid) is not r:
            raise InvariantError(f"request {rid} is not filed under its application {r.app}")
        if r.state is STARTED:
            if not r.is_preallocation:
                used[r.cluster] += r.nodes
            if r.container is not None:
                p = core.requests.get(r.container)
                if p is None or p.state is not STARTED or p.app != r.app or p.cluster != r.cluster:
                    raise InvariantError(
                        f"request {rid} runs inside {r.container}, which is not its running pre-allocation")
                if not (p.start <= r.start and r.end <= p.end):
                    raise InvariantError(f"request {rid} [{r.start}, {r.end}) overflows its pre-allocation {p.id}")
        if r.state is WAITING and core.last_pass == now and r.start < now:
            raise InvariantError(f"waiting request {rid} has a start time {r.start} in the past")
    for h in core.holds:
        if h.physical and h.until > now:
            used[h.cluster] += h.nodes
    for c, n in used.items():
        if n > core.clusters[c]:
            raise InvariantError(f"cluster {c}: {n} nodes allocated or held, only {core.clusters[c]} up")
    for c in core.clusters:
        for p in core.requests.values():
            if p.is_preallocation and p.state is STARTED and p.cluster == c:
                inner = sum(i.nodes for i in core.requests.values()
                            if i.container == p.id and i.state is STARTED)
                if inner > p.nodes:
                    raise InvariantError(
                        f"pre-allocation {p.id} holds {inner} nodes of requests, more than its {p.nodes}")
    order = [(a.opened_at, a.seq) for a in core.priority_order()]
    if order != sorted(order) or len(order) != len(core.apps):
        raise InvariantError("applications are not kept in priority order")
