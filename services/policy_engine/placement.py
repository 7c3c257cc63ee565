"""Conservative backfilling of one application's waiting requests (CooRM §III-C, CooRMv2 §III-B).

Rules:
* an application's waiting pre-allocations and non-preemptible requests are placed in the first hole that
  fits, never delaying what is already placed (profiles only ever lose capacity during a pass);
* requests linked by COALLOC/NEXT among the waiting ones form a *group* placed as one: each member starts
  at the group's start plus its offset (COALLOC: the offset of the request it is tied to; NEXT: that
  request's offset plus its duration). A link to a running request is a lower bound (COALLOC: its start;
  NEXT: its end);
* groups that contain a pre-allocation are placed first, so that the application's non-preemptible
  requests can be placed inside them;
* a non-preemptible request goes inside one of the application's pre-allocations on its cluster when it
  starts there no later than it would outside (the pre-allocation where it starts first); otherwise it is
  wrapped in an implicit pre-allocation of its own size, i.e. placed in the cluster profile. (DESIGN §4
  says "fits inside"; preferring a pre-allocation that starts later than the cluster's hole would make the
  application's non-preemptive view lie about when its request starts.)

A group's start is found by fixed-point iteration: try ``t``; the first member that does not fit at
``t + offset`` moves ``t`` to where it would fit; repeat. ``t`` only grows and every candidate is a
breakpoint, so it ends. Members already placed in a failed attempt are rolled back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from coorm.services.policy_engine.schedule import Interval, interval_hash
from coorm.services.policy_engine.state import Request, RequestState
from coorm.shared.requests import Relation, RequestType
from coorm.shared.stepfn import INF, Profile

_EPS = 1e-9
_MASK = (1 << 64) - 1
_PRE = RequestType.PRE_ALLOCATION
_MAX_ATTEMPTS = 10_000


@dataclass(slots=True)
class Container:
    """A pre-allocation's inside: its nodes over its lifetime, minus what runs or is placed in it."""

    request: Request
    profile: Profile


@dataclass(slots=True)
class Placement:
    request: Request
    start: float
    container: Container | None
    own: Container | None = None  # a pre-allocation's inside, made while trying its group


@dataclass(slots=True)
class Placer:
    now: float
    profiles: dict[str, Profile]
    log: list[tuple[str, float, float, int]] = field(default_factory=list)
    log_ids: list[str] = field(default_factory=list)
    signature: int = 0
    np_usage: dict[str, list[Interval]] = field(default_factory=dict)

    def container_for(self, prealloc: Request, start: float, inner: list[Request]) -> Container:
        begin = max(start, self.now)
        profile = Profile(begin, prealloc.nodes)
        profile.reserve(start + prealloc.duration, INF, prealloc.nodes)
        for r in inner:
            profile.reserve(self.now, r.end, r.nodes)
        return Container(prealloc, profile)

    # -- one application's turn -------------------------------------------------------------------
    def place_app(
        self,
        waiting: list[Request],
        containers: dict[str, list[Container]],
        lookup: Callable[[str], Request | None],
    ) -> list[Placement]:
        """Place ``waiting`` (non-preemptible and pre-allocations, submission order). ``containers``
        holds the application's running pre-allocations per cluster and gains the ones placed here.
        ``lookup(id)`` returns a live request or None."""
        if not any(r.related_to is not None and r.related_how is not Relation.FREE for r in waiting):
            return self._place_lone(waiting, containers)
        by_id = {r.id: r for r in waiting}
        groups: dict[str, list[Request]] = {}
        offsets: dict[str, float] = {}
        for r in waiting:
            target = by_id.get(r.related_to) if r.constrained and r.related_to is not None else None
            if target is None:
                groups[r.id] = [r]
                offsets[r.id] = 0.0
                root_of = r.id
            else:
                root_of = _root(target, by_id)
                groups[root_of].append(r)
                step = target.duration if r.related_how is Relation.NEXT else 0.0
                offsets[r.id] = offsets[target.id] + step
        ordered = sorted(
            groups.values(), key=lambda g: (not any(m.is_preallocation for m in g), g[0].seq)
        )
        placed: list[Placement] = []
        for group in ordered:
            lower = self.now
            for m in group:
                anchor = _anchor(m, by_id, lookup)
                if anchor is not None:
                    lower = max(lower, anchor - offsets[m.id])
            placed.extend(self._place_group(group, offsets, lower, containers))
        return placed

    def _place_lone(self, waiting: list[Request], containers: dict[str, list[Container]]) -> list[Placement]:
        """``place_app`` when no request is related to another: each is its own group, placed at its
        earliest fit from now, pre-allocations first (``waiting`` is in submission order)."""
        now = self.now
        profiles = self.profiles
        log, log_ids, np_usage = self.log, self.log_ids, self.np_usage
        signature = self.signature
        placed: list[Placement] = []
        pre = [r for r in waiting if r.type is _PRE]
        order = pre + [r for r in waiting if r.type is not _PRE] if pre else waiting
        for r in order:
            cluster = r.cluster
            if r.type is not _PRE and containers.get(cluster):
                self.signature = signature & _MASK
                placed.extend(self._place_group([r], {r.id: 0.0}, now, containers))
                signature = self.signature
                continue
            s = profiles[cluster].earliest_fit(r.nodes, r.duration, now)
            placed.append(Placement(r, s, None))
            if s == INF:
                continue
            end = s + r.duration
            profiles[cluster].reserve(s, end, r.nodes)
            item = (s, end, r.nodes)
            log.append((cluster, s, end, r.nodes))
            log_ids.append(r.id)
            signature += interval_hash(cluster, item)
            if r.type is _PRE:
                containers.setdefault(cluster, []).append(self.container_for(r, s, []))
            else:
                np_usage.setdefault(cluster, []).append(item)
        self.signature = signature & _MASK
        return placed

    def _fit(self, r: Request, t: float, containers: dict[str, list[Container]]) -> tuple[float, Container | None]:
        """Where ``r`` starts first: inside one of its application's pre-allocations or wrapped in the
        cluster profile. Ties go inside (the pre-allocation is there for it); an earlier start outside
        wins, so that a request sized within the application's view starts when the view says."""
        outside = self.profiles[r.cluster].earliest_fit(r.nodes, r.duration, t)
        if r.is_preallocation:
            return outside, None
        best: tuple[float, Container | None] = (INF, None)
        for c in containers.get(r.cluster, ()):
            s = c.profile.earliest_fit(r.nodes, r.duration, t)
            if s < best[0]:
                best = (s, c)
        if best[1] is not None and best[0] <= outside:
            return best
        return outside, None

    def _reserve(self, r: Request, start: float, container: Container | None, sign: int) -> None:
        end = start + r.duration
        if container is not None:
            container.profile.reserve(start, end, sign * r.nodes)
        else:
            self.profiles[r.cluster].reserve(start, end, sign * r.nodes)

    def _place_group(
        self,
        group: list[Request],
        offsets: dict[str, float],
        t: float,
        containers: dict[str, list[Container]],
    ) -> list[Placement]:
        if len(group) == 1:
            # a lone request fits where earliest_fit says: no need to try again there
            (m,) = group
            s, container = self._fit(m, t, containers)
            placement = Placement(m, s, container if s < INF else None)
            if s < INF:
                self._reserve(m, s, container, 1)
                self._commit(placement, containers)
            return [placement]
        # a member's tentative reservation matters only to a later member on the same cluster whose
        # window can overlap it (offsets are fixed, so this does not depend on t); the others are
        # reserved at commit only, which spares a reserve and a release per failed attempt
        hold = [
            any(
                o.cluster == m.cluster and offsets[m.id] + m.duration > offsets[o.id]
                for o in group[k + 1 :]
            )
            for k, m in enumerate(group)
        ]
        # past every profile's last change an attempt that fails fails forever (a COALLOC group larger
        # than its cluster): from there on, one more try decides
        horizon = max(self._settled_after(m, containers) - offsets[m.id] for m in group)
        for _ in range(_MAX_ATTEMPTS):
            if t == INF:
                break
            tentative: list[Placement] = []
            moved = None
            for k, m in enumerate(group):
                want = t + offsets[m.id]
                s, container = self._fit(m, want, containers)
                if s - want > _EPS:
                    moved = s - offsets[m.id]
                    break
                if hold[k]:
                    self._reserve(m, want, container, 1)
                placement = Placement(m, want, container)
                if m.is_preallocation:
                    # the group's later members may go inside it
                    placement.own = self.container_for(m, want, [])
                    containers.setdefault(m.cluster, []).append(placement.own)
                tentative.append(placement)
            if moved is None:
                for k, p in enumerate(tentative):
                    if not hold[k]:
                        self._reserve(p.request, p.start, p.container, 1)
                    self._commit(p, containers)
                return tentative
            for k in reversed(range(len(tentative))):
                p = tentative[k]
                if p.own is not None:
                    containers[p.request.cluster].remove(p.own)
                if hold[k]:
                    self._reserve(p.request, p.start, p.container, -1)
            if t >= horizon:
                break
            t = moved
        return [Placement(m, INF, None) for m in group]

    def _settled_after(self, r: Request, containers: dict[str, list[Container]]) -> float:
        """From then on, every profile ``r`` may be placed in is constant."""
        h = self.profiles[r.cluster].horizon()
        for c in containers.get(r.cluster, ()):
            h = max(h, c.profile.horizon())
        return h

    def _commit(self, p: Placement, containers: dict[str, list[Container]]) -> None:
        r = p.request
        end = p.start + r.duration
        if p.container is None:
            item = (r.cluster, p.start, end, r.nodes)
            self.log.append(item)
            self.log_ids.append(r.id)
            self.signature = (self.signature + interval_hash(r.cluster, item[1:])) & ((1 << 64) - 1)
        if r.is_preallocation:
            if p.own is None:
                containers.setdefault(r.cluster, []).append(self.container_for(r, p.start, []))
        else:
            self.np_usage.setdefault(r.cluster, []).append((p.start, end, r.nodes))


def _root(r: Request, by_id: dict[str, Request]) -> str:
    while r.constrained and r.related_to in by_id:
        r = by_id[r.related_to]
    return r.id


def _anchor(r: Request, by_id: dict[str, Request], lookup: Callable[[str], Request | None]) -> float | None:
    """The lower bound a running (not waiting) related request puts on ``r``'s start."""
    if not r.constrained or r.related_to is None or r.related_to in by_id:
        return None
    target = lookup(r.related_to)
    if target is None or target.state is not RequestState.STARTED:
        return None
    return target.end if r.related_how is Relation.NEXT else target.start
