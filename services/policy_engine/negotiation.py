"""Negotiation (the adaptive-RMS paper, §3 and §5.1): the RMS's side of offers, in the policy core.

Rules:
* a negotiation asks for a request whose size is negotiable (:class:`~coorm.shared.negotiation.
  NegotiationTerms`); the RMS answers with an **offer**: the largest allowed size it can give *now*
  without delaying any placed request (what is left of the cluster's profile once every waiting request
  is placed by the backfilling, over the offer's deadline plus the request's duration) and that is
  physically idle (a running or held node is never offered); if none, the earliest start at which the
  smallest allowed size fits, with the largest allowed size then (a *later* offer; when the room is
  nodes held preemptibly, which must be given back within ``preempt_grace``, from then), or nothing.
  Preemptible growth is offered only within the application's preemptive view until the offer's deadline
  (less what it holds, has asked or is offered preemptibly): more would not start, or would start only to
  be taken back;
* an offer *now* sets its nodes aside until its deadline: no other request is placed on them, no
  preemptible request starts on them, no other offer counts them (``reserved``); a later offer reserves
  nothing -- accepted, its request is placed by the backfilling like any other, so it may start later
  than offered if higher-priority work arrived meanwhile;
* the application answers each offer by its deadline: **accept** -- the offer becomes its request, named
  after the negotiation, and a non-preemptible one is *promised*: the next pass places it before every
  other waiting request, on the nodes the offer set aside; **counter** with an allowed size -- the offer
  is withdrawn and a new one made, of at most that size (the next round); **reject** -- the negotiation
  ends. An offer not answered by its deadline lapses: its nodes are free again and its negotiation ends;
* a *standing* negotiation with nothing to give now waits; at each pass, in priority order, the RMS
  offers what it can to the standing negotiations without an offer (the paper's "the scheduler offered
  the 4 idle processors to the malleable application");
* asking again under the name of an open negotiation revises it (its offer is withdrawn); a negotiation
  ends with its session; an application has at most ``MAX_OPEN`` negotiations open.

Theory of operation: the core calls :func:`make_offer` when a command asks for an offer, and
:func:`standing_offers` / :func:`lapse` at the top of a pass. Pure: time comes from the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from coorm.services.policy_engine.state import RequestState
from coorm.shared.events import Offered, OfferLapsed
from coorm.shared.negotiation import NegotiationTerms
from coorm.shared.requests import RequestType
from coorm.shared.stepfn import INF, StepFunction

if TYPE_CHECKING:
    from coorm.services.policy_engine.core import PolicyCore
    from coorm.services.policy_engine.schedule import Schedule

# outcomes of offers no longer open, remembered so that a late answer is told why (bounded, as the core)
RECENT_OFFERS = 10_000
INF_NODES = 1 << 62  # no bound
MAX_OPEN = 64  # open negotiations per application
LAPSED, ANSWERED = "lapsed", "answered"


@dataclass(slots=True, frozen=True)
class Offer:
    id: str
    nodes: int
    start: float  # INF: nothing can be given as things stand
    made_at: float
    deadline: float

    @property
    def reserved(self) -> bool:
        """It sets nodes aside: made for now."""
        return self.nodes > 0 and self.start <= self.made_at


@dataclass(slots=True, eq=False)
class Negotiation:
    app: str
    terms: NegotiationTerms
    opened_at: float
    round: int = 0
    offer: Offer | None = None
    at_most: int | None = None  # the application's last counter

    @property
    def id(self) -> str:
        return self.terms.negotiation

    @property
    def cluster(self) -> str:
        return self.terms.cluster

    def reservation(self) -> tuple[float, float, int] | None:
        """The interval its offer sets aside: until the deadline, and for a non-preemptible request the
        duration it would run if accepted at the deadline."""
        o = self.offer
        if o is None or not o.reserved:
            return None
        end = o.deadline
        if self.terms.type is not RequestType.PREEMPTIBLE and self.terms.duration is not None:
            end += self.terms.duration
        return (o.made_at, end, o.nodes)


@dataclass(slots=True, eq=False)
class NegotiationBook:
    """What the core keeps of negotiations."""

    open: dict[str, Negotiation] = field(default_factory=dict)  # by negotiation id, in opening order
    offers: dict[str, str] = field(default_factory=dict)  # open offer id -> its negotiation
    recent: dict[str, tuple[str, str]] = field(default_factory=dict)  # closed offer -> (app, outcome)
    promised: list[str] = field(default_factory=list)  # accepted non-preemptible requests not started yet

    def reservations(self, cluster: str | None = None) -> list[tuple[str, tuple[float, float, int]]]:
        out = []
        for n in self.open.values():
            iv = n.reservation()
            if iv is not None and (cluster is None or n.cluster == cluster):
                out.append((n.cluster, iv))
        return out

    def reserved_now(self, cluster: str, now: float) -> int:
        return sum(n for _, (b, e, n) in self.reservations(cluster) if b <= now < e)

    def withdraw(self, neg: Negotiation, outcome: str) -> None:
        """Its offer, if any, is no longer open."""
        if neg.offer is not None:
            self.offers.pop(neg.offer.id, None)
            self.recent[neg.offer.id] = (neg.app, outcome)
            while len(self.recent) > RECENT_OFFERS:
                del self.recent[next(iter(self.recent))]
            neg.offer = None

    def close(self, neg: Negotiation, outcome: str) -> None:
        self.withdraw(neg, outcome)
        self.open.pop(neg.id, None)


def idle_now(core: PolicyCore, cluster: str) -> int:
    """Nodes that no started request, fair-start hold or offer holds now."""
    now = core.now
    used = sum(r.nodes for r in core.requests.values()
               if r.state is RequestState.STARTED and r.cluster == cluster and not r.is_preallocation)
    held = sum(h.nodes for h in core.holds if h.physical and h.cluster == cluster and h.until > now)
    return core.clusters.get(cluster, 0) - used - held - core.negotiations.reserved_now(cluster, now)


def _window(terms: NegotiationTerms) -> float:
    """How long a request offered now must find its nodes free: until the offer's deadline, and then its
    duration (a preemptible request only until the deadline: it may be taken back afterwards)."""
    if terms.type is RequestType.PREEMPTIBLE or terms.duration is None:
        return terms.respond_within
    return terms.respond_within + terms.duration


def capacity_now(core: PolicyCore, app: str, terms: NegotiationTerms, profile: StepFunction, taken: int = 0,
                 sched: Schedule | None = None) -> int:
    """What can be given now: the profile left after the placement, over the window, and idle nodes
    (less ``taken``: offered earlier in the same pass); preemptible growth also leaves KOALA's threshold
    and stays within the application's preemptive view in ``sched`` (:func:`room_in_view`)."""
    now = core.now
    # (``taken`` is not in the profile, worked out before those offers, but is in the idle nodes already)
    cap = min(profile.min_over(now, now + _window(terms)) - taken, idle_now(core, terms.cluster))
    if terms.type is RequestType.PREEMPTIBLE:
        cap -= core.settings.local_threshold
        if cap > 0:  # (the view costs a share per breakpoint: only when there is something to give)
            cap = min(cap, room_in_view(core, app, terms, sched))
    return max(cap, 0)


def room_in_view(core: PolicyCore, app: str, terms: NegotiationTerms, sched: Schedule | None) -> int:
    """Preemptible growth the application may hold until the offer's deadline: its preemptive view in
    ``sched`` (the schedule of the placement the offer is made on), at its lowest until then, less what it
    holds or has asked for preemptibly on the cluster and its other open offers there. Beyond it, an
    accepted growth would not start (the malleability policy gives it no room: it would wait, holding the
    application's growth back) or would start only to be taken back within the grace."""
    if sched is None or terms.cluster not in sched.up:
        return INF_NODES
    now = core.now
    until = now + terms.respond_within
    view = sched.p_view(app, terms.cluster, until=until).min_over(now, until)
    owner = core.apps.get(app)
    mine = 0
    if owner is not None:
        mine = sum(r.nodes for r in owner.preemptible.values()
                   if r.cluster == terms.cluster and r.state in (RequestState.STARTED, RequestState.WAITING))
    offered_elsewhere = sum(n.offer.nodes for n in core.negotiations.open.values()
                            if n.app == app and n.cluster == terms.cluster and n.terms.negotiation != terms.negotiation
                            and n.offer is not None and n.offer.reserved and n.terms.type is RequestType.PREEMPTIBLE)
    return int(view) - mine - offered_elsewhere


def later(terms: NegotiationTerms, profile: StepFunction, now: float, at_most: int | None) -> tuple[int, float]:
    """The later offer: the earliest start at which the smallest allowed size fits the profile for the
    request's duration, and the largest allowed size that fits then; (0, INF) if never."""
    duration = terms.duration if terms.duration is not None else 0.0
    smallest = terms.smallest()
    if at_most is not None:
        smallest = min(smallest, at_most)
    t = profile.earliest_fit(smallest, duration, now)
    if t == INF:
        return 0, INF
    return terms.best(profile.min_over(t, t + duration) if duration > 0 else profile.value_at(t), at_most), t


def make_offer(core: PolicyCore, neg: Negotiation, profile: StepFunction, stimulus: str, *,
               unsolicited: bool = False, taken: int = 0, sched: Schedule | None = None) -> Offered | None:
    """The next round's offer for ``neg`` (its previous one withdrawn by the caller), or None when a
    standing negotiation has nothing to be given now (it keeps waiting)."""
    now, terms = core.now, neg.terms
    nodes, start = terms.best(capacity_now(core, neg.app, terms, profile, taken, sched), neg.at_most), now
    if nodes == 0:
        if terms.standing:
            return None
        nodes, start = later(terms, profile, now, neg.at_most)
        if start <= now:
            # the profile has room now that is not idle: nodes held preemptibly, which (precedence to
            # waiting requests) their holders must give back within the grace -- the offer is for then
            start = now + core.settings.preempt_grace
    neg.round += 1
    offer = Offer(f"{neg.id}.o{neg.round}", nodes, start, now, now + terms.respond_within)
    neg.offer = offer
    core.negotiations.offers[offer.id] = neg.id
    core.dirty = True  # the nodes it sets aside leave the others' views
    return offered(neg, stimulus, unsolicited)


def offered(neg: Negotiation, stimulus: str, unsolicited: bool = False) -> Offered:
    o = neg.offer
    assert o is not None
    return Offered(stimulus_id=stimulus, app=neg.app, negotiation=neg.id, offer=o.id, cluster=neg.cluster,
                   nodes=o.nodes, start=None if o.start == INF else o.start, deadline=o.deadline, round=neg.round,
                   unsolicited=unsolicited)


def lapse(core: PolicyCore, stimulus: str) -> list[OfferLapsed]:
    """Offers whose deadline passed: their nodes are free again, their negotiations end."""
    book, now = core.negotiations, core.now
    out = []
    for neg in [n for n in book.open.values() if n.offer is not None and n.offer.deadline <= now]:
        assert neg.offer is not None
        out.append(OfferLapsed(stimulus_id=stimulus, app=neg.app, negotiation=neg.id, offer=neg.offer.id,
                               cluster=neg.cluster))
        core.tell_negotiation(neg, f"offer {neg.offer.id} lapsed")
        core.close_negotiation(neg, LAPSED)
    return out


def overdrawn(core: PolicyCore, cluster: str) -> None:
    """Nodes of ``cluster`` went down: offers that now set aside more than is idle are made due, latest
    first (they lapse at the next pass, and their applications hear of it)."""
    book, now = core.negotiations, core.now
    held = [n for n in book.open.values() if n.cluster == cluster and n.offer is not None and n.offer.reserved
            and n.offer.deadline > now]
    excess = -idle_now(core, cluster)
    for neg in reversed(held):
        if excess <= 0:
            break
        o = neg.offer
        assert o is not None
        neg.offer = replace(o, deadline=now)
        excess -= o.nodes
        core.tell_negotiation(neg, f"offer {o.id} withdrawn: nodes went down")
        core.dirty = True


def standing_offers(core: PolicyCore, profiles: dict[str, StepFunction], stimulus: str,
                    sched: Schedule | None = None) -> list[Offered]:
    """Offers to the standing negotiations that have none, in their applications' priority order, each
    within what the earlier ones left (``sched``: the pass's schedule before its starts, for the views)."""
    book = core.negotiations
    waiting = [n for n in book.open.values() if n.offer is None and n.terms.standing]
    if not waiting:
        return []
    rank = {a.id: i for i, a in enumerate(core.priority_order())}
    waiting.sort(key=lambda n: (rank.get(n.app, len(rank)), n.opened_at))
    taken: dict[str, int] = {}
    out = []
    for neg in waiting:
        profile = profiles.get(neg.cluster)
        if profile is None:
            continue
        made = make_offer(core, neg, profile, stimulus, unsolicited=True, taken=taken.get(neg.cluster, 0),
                          sched=sched)
        if made is not None:
            core.tell_negotiation(neg, f"offered {made.nodes} nodes ({made.offer}), unsolicited")
            taken[neg.cluster] = taken.get(neg.cluster, 0) + made.nodes
            out.append(made)
    return out
