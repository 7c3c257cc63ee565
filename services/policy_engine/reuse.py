"""Placements kept from the last pass where nothing they depend on changed (issue 16: a pass over 10,000 waiting
requests re-places what an event changed, not all of them).

Conservative backfilling places the applications in priority order, and a request only ever in its own cluster's
profile, except in a group of related requests, which may span clusters. So a pass is cut into *units*, placed in
priority order: an application's waiting requests on one cluster, or on the clusters its related requests tie
together (a COALLOC pair on two clusters: both, with the application's other requests there). A unit is placed in
its cluster's *lane*: the cluster's base (running work, holds, what offers set aside) less the units placed before it
there. A unit's placements depend only on its requests, the application's running pre-allocations there and its
lane's profile at its turn, all of them seen from "now".

The last pass's units are kept (:class:`Kept`). The next one walks the priority order again, and a lane goes
*replacing* -- every unit from there on placed anew -- at the first unit whose placements may differ:

* from its first unit when its nodes up or its base changed (what ended before the new "now" does not count);
* at a unit whose placement is due by the new "now" (it starts, or waits and is placed again from now), placed anew
  there, when its placements differ from the last pass's;
* at a unit whose requests changed (one submitted, started, ended, blocked...: the core notes the application and
  the cluster, :meth:`coorm.services.policy_engine.core.PolicyCore._move`), placed anew there, when its placements
  differ from the last pass's (those of its requests that started since are in the base now);
* at a unit that does not come in the order it came in last time (an application gone, or moved; a unit whose
  requests there all started since is passed over).

Until then a unit is *kept*: its placements, log entries and usage are those of the last pass, and its reservations
are not even made in the lane's profile unless a later unit has to be placed in it (they are made then, in order:
``Lane.pending``). Requests left to the RMS to place, offers accepted, and a first pass place everything.

The simulator runs this core too: the kept placements are the ones a full pass would make (the core's ``validate``
mode makes both and compares them, in every test that sets it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from coorm.services.policy_engine.schedule import Interval
from coorm.services.policy_engine.state import Request
from coorm.shared.stepfn import INF, Profile

ALL = "\x00"  # a unit on several clusters (related requests tie them) is keyed by them after this
_MASK = (1 << 64) - 1

LogEntry = tuple[str, float, float, int]  # cluster, begin, end, nodes


@dataclass(slots=True, eq=False)
class Unit:
    """What is placed together: ``key`` is its cluster, or its clusters after :data:`ALL`."""

    key: str
    clusters: tuple[str, ...]
    waiting: list[Request]  # in submission order
    # the application's running pre-allocations on those clusters, each with what runs inside it
    sources: dict[str, list[tuple[Request, list[Request]]]]
    related: bool = False  # some of its requests are COALLOC or NEXT to another (waiting or running)
    # what its last placement made: log entries (reservations in the lanes) and their request ids, their hashes'
    # sum, the intervals used non-preemptibly (inside pre-allocations too: on several clusters, ``usage``; on one,
    # ``items``), and its earliest start
    entries: list[LogEntry] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    signature: int = 0
    usage: list[tuple[str, Interval]] = field(default_factory=list)
    first: float = INF  # its earliest start: once "now" reaches it, it starts or is placed again from now
    placed: bool = False  # placed at least once (a unit made by this walk has nothing to compare with)
    # the same, ready to be kept: the clusters it reserved on, and (one cluster) its reservations and usage there
    lanes: tuple[str, ...] = ()
    spans: list[Interval] = field(default_factory=list)
    items: list[Interval] = field(default_factory=list)

    @classmethod
    def of(cls, waiting: list[Request], sources: dict[str, list[tuple[Request, list[Request]]]],
           related: bool) -> Unit:
        """The unit of ``waiting`` (one application's), with its running pre-allocations on their clusters."""
        clusters = tuple(sorted({r.cluster for r in waiting}))
        key = clusters[0] if len(clusters) == 1 else ALL + "+".join(clusters)
        return cls(key, clusters, waiting, {c: sources[c] for c in clusters if c in sources}, related)

    def on(self, cluster: str, started: set[str] | None = None) -> list[Interval]:
        """Its reservations in ``cluster``'s lane, those of requests in ``started`` left out, sorted."""
        return sorted((b, e, n) for (c, b, e, n), rid in zip(self.entries, self.ids, strict=True)
                      if c == cluster and (started is None or rid not in started))


@dataclass(slots=True)
class Kept:
    """The last pass's units, and what its lanes were made from."""

    up: dict[str, int]
    # the base it placed them on, (end, interval_hash) a reservation (what started since moves there)
    base: dict[str, list[tuple[float, int]]]
    units: dict[str, list[Unit]]  # application -> its units, in the order they were placed
    order: dict[str, list[tuple[str, str]]]  # cluster -> (application, unit key) of the units with reservations there
    # a request left to the RMS stayed unplaced: it is chosen again at every pass, reading every cluster's profile
    unplaced: bool = False


def key_at(hashes: list[tuple[float, int]], now: float) -> int:
    """A base's reservations that still matter at ``now``, as one number, from their (end, hash): the sum of their
    hashes (commutative: order does not count)."""
    return sum(h for end, h in hashes if end > now) & _MASK


@dataclass(slots=True)
class Lane:
    """One cluster during a walk."""

    cluster: str
    up: int
    base: list[Interval]
    replacing: bool
    order: list[tuple[str, str]]  # the last pass's units with reservations here, in order
    at: int = 0  # how many of them came, in that order, in this walk
    profile: Profile | None = None
    pending: list[Interval] = field(default_factory=list)  # kept reservations not made in the profile yet
    seen: list[tuple[str, str]] = field(default_factory=list)  # this walk's units with reservations here

    def ready(self, now: float) -> Profile:
        """The profile at this point of the walk: every reservation so far made in it."""
        p = self.profile
        if p is None:
            p = self.profile = Profile(now, self.up)
            p.reserve_all([*self.base, *self.pending])
            self.pending.clear()
        elif self.pending:
            pending = self.pending
            if 16 * len(pending) < len(p):  # (all at once goes over the whole profile: ~1/20 of a reserve a step)
                for b, e, n in pending:
                    p.reserve(b, e, n)
            else:
                p.reserve_all(pending)
            pending.clear()
        return p

    def comes(self, app: str, key: str, moved: Callable[[str, str, str], bool]) -> bool:
        """A unit that had reservations here last time comes now: whether it comes where it came then, passing
        over the units before it whose reservations here all ``moved`` to the base (their requests started)."""
        order = self.order
        while self.at < len(order):
            unit = order[self.at]
            self.at += 1
            if unit == (app, key):
                return True
            if not moved(unit[0], unit[1], self.cluster):
                return False
        return False
