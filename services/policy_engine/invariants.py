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
        if r.unplaced and r.state is not WAITING:
            raise InvariantError(f"request {rid} started with no cluster chosen")
        if r.allowed and not r.unplaced and r.cluster not in r.allowed:
            raise InvariantError(f"request {rid} was placed on {r.cluster}, not one of {', '.join(r.allowed)}")
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
    book = core.negotiations
    for offer_id, nid in book.offers.items():
        neg = book.open.get(nid)
        if neg is None or neg.offer is None or neg.offer.id != offer_id:
            raise InvariantError(f"offer {offer_id} is filed under {nid}, which is not open with it")
        if core.apps.get(neg.app) is None:
            raise InvariantError(f"negotiation {nid} outlived its session {neg.app}")
        o = neg.offer
        if o.nodes > 0 and not neg.terms.allows(o.nodes):
            raise InvariantError(f"offer {offer_id} of {o.nodes} nodes is not a size negotiation {nid} allows")
        if core.last_pass == now and o.deadline <= now:
            raise InvariantError(f"offer {offer_id} outlived its deadline {o.deadline} past a pass")
    for c in core.clusters:
        # an offer sets idle nodes aside: never nodes that run or are held (no double booking). An offer whose
        # nodes went down is made due (it lapses at the next pass): it is not counted
        reserved = sum(n.offer.nodes for n in book.open.values()
                       if n.cluster == c and n.offer is not None and n.offer.reserved and n.offer.deadline > now)
        if reserved and used.get(c, 0) + reserved > core.clusters[c]:
            raise InvariantError(f"cluster {c}: offers set aside {reserved} nodes, {used.get(c, 0)} are used, "
                                 f"only {core.clusters[c]} up")
    _indexes(core)


def _indexes(core: PolicyCore) -> None:
    """The core's shortcuts agree with what they stand for."""
    started = {rid for rid, r in core.requests.items() if r.state is STARTED}
    if set(core.started) != started:
        raise InvariantError(f"the index of started requests is wrong: {sorted(set(core.started) ^ started)}")
    per_app: dict[str, int] = {}
    for rid in started:
        app = core.requests[rid].app
        per_app[app] = per_app.get(app, 0) + 1
    if core.started_per_app != per_app:
        raise InvariantError(f"started requests per application: {core.started_per_app}, not {per_app}")
    begins = [h.begin for h in core.holds]
    if begins != sorted(begins):
        raise InvariantError(f"fair-start holds out of the order they began in: {begins}")
    for h in core.holds:
        late = sorted(a for a in h.awaiting if core.answered_at.get(a, -float("inf")) > h.begin)
        if late:
            raise InvariantError(f"the hold of {h.request} still awaits {', '.join(late)}, who answered since")
    if core.schedule is not None:  # what a pass kept of each session's views is its schedule's
        for app, sig in core._signatures.items():
            if sig != core.schedule.signature(app):
                raise InvariantError(f"the views' signature kept for {app} is not its schedule's")
    kept, order = core._by_priority, core._order
    if kept is not None and (len(kept) != len(order)
                             or any(app is not core.apps.get(a) for app, (_, _, a) in zip(kept, order, strict=True))):
        raise InvariantError("the applications kept in priority order are not the order's")
