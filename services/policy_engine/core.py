"""The policy core: CooRM + CooRMv2 scheduling as a pure state machine.

Rules (DESIGN §4):
* applications are ordered by the time their session opened (ties: opening order): that is priority;
* a pass runs at most once per re-scheduling interval; events in between only change the state and are
  coalesced into the next pass; :meth:`PolicyCore.next_wakeup` tells the shell when to call back;
* in a pass, per cluster, a profile starts from the up nodes minus running pre-allocations, running
  non-preemptible requests that are not inside a pre-allocation, and fair-start holds; then each
  application in priority order gets its non-preemptive view (the profile as it stands) and its waiting
  requests are placed by conservative backfilling (:mod:`.placement`);
* every node not used non-preemptibly (so pre-allocated but unused nodes too) is preemptible capacity,
  shared among the applications that want it by the malleability policy (:mod:`.shares`: CooRMv2's
  ``filling``/``strict``, KOALA's ``fpsma``/``egs``; ``local_threshold`` nodes per cluster never go to
  it); a waiting preemptible request starts when it fits in its application's preemptive view;
* precedence (KOALA's PWA/PRA): to waiting requests, the nodes held preemptibly are free for the
  placement (their holders must give them back: a mandatory shrink); to running applications, they are
  occupied until their holders give them back, and a waiting request is placed after them;
* a request placed at "now" starts if its nodes are physically free; non-preemptible starts come first, in
  priority order, and if nodes are still held preemptibly the request waits (blocked) while the holders,
  whose preemptive views have dropped, must release within ``preempt_grace`` -- or are killed and their
  session ended (protocol violation);
* ``done`` ends a running request (its non-carried nodes held for ``fair_start`` if it ended a
  pre-allocation or a self-wrapped request early) or cancels a waiting one; a relation to an ended request
  no longer constrains; a NEXT successor that starts where its predecessor ended keeps its nodes.

Theory of operation: :meth:`handle` is the only way in. It validates and applies the event (commands get
an ``Accepted`` or ``Rejected`` at once), then runs a pass if one is due. Lifecycle decisions (start,
end, session ended, preemption deadlines) come only out of passes, so that the allocator sees a
predecessor's end and its successor's start in the same batch. Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from coorm.services.policy_engine import lifecycle, negotiation, preemption
from coorm.services.policy_engine.lifecycle import Phase
from coorm.services.policy_engine.negotiation import ANSWERED, LAPSED, Negotiation, NegotiationBook
from coorm.services.policy_engine.placement import Placer
from coorm.services.policy_engine.reuse import Kept, Lane, Unit, key_at
from coorm.services.policy_engine.schedule import Schedule, interval_hash
from coorm.services.policy_engine.shares import FILLING, INCREMENTAL, POLICIES
from coorm.services.policy_engine.state import App, Hold, Request, RequestState
from coorm.shared.cluster_choice import WORST_FIT, choose
from coorm.shared.events import (
    Accepted,
    CloseSession,
    Done,
    EndReason,
    EndRequest,
    ErrorCode,
    HoldReleased,
    Negotiate,
    NodesChanged,
    Offered,
    OpenSession,
    PassDone,
    PolicyDecision,
    PolicyEvent,
    Rejected,
    Respond,
    SessionEnded,
    StartRequest,
    Submit,
    Tick,
    ViewsChanged,
)
from coorm.shared.negotiation import Answer
from coorm.shared.requests import Relation, RequestBatch, RequestSpec, RequestType
from coorm.shared.stepfn import INF, Profile, StepFunction

Step = tuple[float, int]  # a view's step on the wire: from this time on, this many nodes

WAITING, STARTED, ENDED = RequestState.WAITING, RequestState.STARTED, RequestState.ENDED
_SEQ = attrgetter("seq")
_MASK = (1 << 64) - 1  # signatures are sums of 64-bit hashes
_BEGIN = attrgetter("begin")

# what the core keeps of requests is bounded, so that a year of a busy cluster fits in memory and in a
# snapshot (the whole history is in the event log and in accounting): a request's story keeps its first
# line and its last ones; the stories of the last ENDED_STORIES ended requests are kept, older ones go
STORY_LINES = 32
ENDED_STORIES = 10_000

# KOALA's precedence (PolicySettings.precedence): to running applications (PRA) or to waiting ones (PWA)
RUNNING_FIRST = "running"
WAITING_FIRST = "waiting"


class PolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fair_start: float = Field(default=5.0, ge=0)
    reschedule_interval: float = Field(default=1.0, ge=0)
    preempt_grace: float = Field(default=5.0, ge=0)
    # how the preemptible capacity is shared among malleable applications (:mod:`.shares`); the simulator's
    # scenarios may call it malleable_policy
    preemptible: str = Field(default=FILLING, pattern="^(" + "|".join(POLICIES) + ")$",
                             validation_alias=AliasChoices("preemptible", "malleable_policy"))
    # KOALA's precedence: "waiting" (PWA) -- a waiting request is placed on nodes held preemptibly, whose
    # holders must give them back (a mandatory shrink, CooRMv2's rule); "running" (PRA) -- what running
    # applications hold preemptibly stays theirs, a waiting request is placed after it
    precedence: str = Field(default=WAITING_FIRST, pattern=f"^({RUNNING_FIRST}|{WAITING_FIRST})$")
    # nodes per cluster never handed to preemptible work (KOALA's threshold, kept for local users)
    local_threshold: int = Field(default=0, ge=0)
    # at most this many passes in any re-scheduling interval: the first ones of a quiet period run at once
    # (a request on an idle system starts without waiting for the interval), a burst is coalesced
    pass_burst: int = Field(default=1, ge=1)
    # a request for more nodes than its cluster has, up or down, waits (CooRM's papers: nodes may come);
    # False: it is refused (too_large), as users of a production cluster expect
    oversize_waits: bool = True


@dataclass(slots=True)
class PassContext:
    """What one pass works out as it goes (never kept between passes, nor in a snapshot): the placement,
    the base reservations, each application's position in the placement log and signature there, and the
    waiting requests placed at now, in priority then submission order."""

    placer: Placer
    base: dict[str, list[tuple[float, float, int]]]
    marks: dict[str, int] = field(default_factory=dict)
    np_signatures: dict[str, int] = field(default_factory=dict)
    due: list[Request] = field(default_factory=list)
    lanes: dict[str, Lane] = field(default_factory=dict)
    kept: Kept | None = None  # what the next pass may keep of this one
    placed_units: int = 0  # units placed anew (the others were kept: :mod:`.reuse`)
    kept_units: int = 0

    def profile(self, cluster: str) -> Profile:
        """``cluster``'s profile once every waiting request is placed."""
        return self.lanes[cluster].ready(self.placer.now)


def _steps(view: StepFunction) -> list[Step]:
    return list(zip(view.times, view.values, strict=True))


class CommandError(Exception):
    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        parts.append(f"{loc}: {e['msg']}" if loc else e["msg"])
    return "; ".join(parts)


class PolicyCore:
    def __init__(self, settings: PolicySettings | None = None, *, validate: bool = False) -> None:
        self.settings = settings or PolicySettings()
        self.validate = validate
        self.now = 0.0
        self.clusters: dict[str, int] = {}
        self.apps: dict[str, App] = {}
        self._order: list[tuple[float, int, str]] = []
        # the applications in that order, kept between the changes of it: a pass reads the order three times,
        # and with thousands of open sessions building it was a tenth of a live engine's time
        self._by_priority: list[App] | None = None
        self.requests: dict[str, Request] = {}
        # the started ones among them (running or handing over), kept by the lifecycle's moves: a pass
        # reads them several times, and there are far fewer of them than waiting ones
        self.started: dict[str, Request] = {}
        self.started_per_app: dict[str, int] = {}  # how many of an application's live requests started
        self.answered_at: dict[str, float] = {}  # when each application last answered the holds (_answered)
        self.ended: dict[str, tuple[str, EndReason, float]] = {}
        self.holds: list[Hold] = []
        self._pending_ends: list[Request] = []
        self._pending_sessions: list[tuple[str, str]] = []
        self._seq = 0
        self.dirty = False
        self.last_pass = -INF
        self.recent_passes: list[float] = []  # the last ``pass_burst`` passes' times
        self.released_holds: list[Hold] = []  # ended early: the next pass tells the allocator first
        self.epoch = 0
        self._timer = INF
        self.schedule: Schedule | None = None
        self._signatures: dict[str, tuple[int, int]] = {}
        self.stories: dict[str, list[tuple[float, str, str]]] = {}
        self._ended_stories: deque[str] = deque()  # the ended requests whose stories are kept, oldest first
        self.negotiations = NegotiationBook()  # offers and what they set aside (:mod:`.negotiation`)
        # the last placement, and the (application, cluster)s whose requests changed since (:mod:`.reuse`); never in
        # a snapshot: a restored core's first pass places everything. ``reuse`` False: every pass does
        self.reuse = True
        self._kept: Kept | None = None
        self._touched: dict[str, set[str]] = {}
        self._started_since: list[Request] = []

    # ============================================================================================
    # public API
    # ============================================================================================
    def handle(self, event: PolicyEvent, *, pass_now: bool = True) -> list[PolicyDecision]:
        """Apply ``event``; then run a pass if one is due, unless ``pass_now`` is False (more events that
        arrived with this one follow: the pass runs once, after the last of them)."""
        at = max(event.at, self.now)
        self.now = at
        out: list[PolicyDecision] = []
        try:
            reply = self._dispatch(event)
        except CommandError as e:
            out.append(Rejected(stimulus_id=event.stimulus_id, code=e.code, reason=e.reason))
        else:
            if reply is not None:
                out.append(reply)
        if pass_now and self._pass_due():
            out.extend(self._run_pass(event.stimulus_id))
        if self.validate:
            from coorm.services.policy_engine.invariants import check

            check(self)
        return out

    def next_wakeup(self) -> float | None:
        t = self.now if self.dirty else self._timer
        if t == INF:
            return None
        return max(t, self._earliest_pass())

    def _earliest_pass(self) -> float:
        """When the next pass may run: once ``pass_burst`` passes ran within an interval, an interval after
        the first of them."""
        burst = self.settings.pass_burst
        if len(self.recent_passes) < burst:
            return -INF
        return self.recent_passes[-burst] + self.settings.reschedule_interval

    def story(self, request_id: str) -> list[tuple[float, str, str]]:
        return list(self.stories.get(request_id, []))

    def waiting(self) -> list[Request]:
        return [r for r in self.requests.values() if r.state is WAITING]

    def running(self) -> list[Request]:
        return self._started_in_order()

    def _started_in_order(self, until: float = INF) -> list[Request]:
        """The started requests (those whose end is at or before ``until``) in submission order, the order
        of ``requests``: the index keeps them in the order they started."""
        return sorted((r for r in self.started.values() if r.end <= until), key=_SEQ)

    def priority_order(self) -> list[App]:
        """The open sessions' applications, highest priority first (the list is shared: read it, never change it)."""
        if self._by_priority is None:
            self._by_priority = [self.apps[a] for _, _, a in self._order]
        return self._by_priority

    # ============================================================================================
    # commands
    # ============================================================================================
    def _dispatch(self, event: PolicyEvent) -> Accepted | Offered | None:
        if isinstance(event, Tick):
            return None
        if isinstance(event, NodesChanged):
            self._nodes_changed(event)
            return None
        if isinstance(event, OpenSession):
            return self._open(event)
        if isinstance(event, Submit):
            return self._submit(event)
        if isinstance(event, Done):
            return self._done(event)
        if isinstance(event, CloseSession):
            return self._close(event)
        if isinstance(event, Negotiate):
            return self._negotiate(event)
        if isinstance(event, Respond):
            return self._respond(event)
        raise CommandError(ErrorCode.BAD_REQUEST, f"unknown event {type(event).__name__}")

    def _app(self, app_id: str) -> App:
        app = self.apps.get(app_id)
        if app is None:
            raise CommandError(ErrorCode.UNKNOWN_APP, f"no open session for application {app_id}")
        return app

    def _open(self, ev: OpenSession) -> Accepted:
        if ev.app in self.apps:
            raise CommandError(ErrorCode.DUPLICATE, f"application {ev.app} already has an open session")
        self._seq += 1
        app = App(ev.app, self.now, self._seq, ev.user, ev.name, ev.app_kind, ev.adapts)
        self.apps[app.id] = app
        bisect.insort(self._order, (app.opened_at, app.seq, app.id))
        self._by_priority = None
        self.dirty = True
        return Accepted(stimulus_id=ev.stimulus_id, app=app.id)

    def _close(self, ev: CloseSession) -> Accepted:
        app = self._app(ev.app)
        self._end_session(app, ev.reason, EndReason.SESSION_CLOSED)
        return Accepted(stimulus_id=ev.stimulus_id, app=app.id)

    def _submit(self, ev: Submit) -> Accepted:
        """A batch, accepted or refused as a whole. With ``replaces`` (an atomic replace), the waiting requests
        it names are cancelled in this same step, before the batch is added; a refusal -- one of them started,
        or anything else -- changes nothing at all (checked in full before the first change)."""
        app = self._app(ev.app)
        if not ev.replaces:
            self._answered(app.id)  # (a refused batch is an answer too; a refused replace changes nothing)
        try:
            RequestBatch(requests=ev.requests)
        except ValidationError as e:
            raise CommandError(ErrorCode.BAD_REQUEST, describe(e)) from None
        replaced = frozenset(ev.replaces)
        batch: dict[str, Request] = {}
        followed: set[str] = set()
        seq = self._seq
        for spec in ev.requests:
            self._check_clusters(spec)
            if spec.id in self.requests or spec.id in self.ended:
                raise CommandError(ErrorCode.DUPLICATE, f"request id {spec.id} is already used")
            if spec.related_how is not Relation.FREE:
                self._check_relation(app, spec, batch, replaced)
            if spec.related_how is Relation.NEXT:
                if spec.related_to in followed:
                    raise CommandError(
                        ErrorCode.BAD_RELATION, f"request {spec.id}: {spec.related_to} already has a NEXT successor"
                    )
                if spec.related_to is not None:  # (the request model refuses a NEXT without it)
                    followed.add(spec.related_to)
            seq += 1
            batch[spec.id] = Request(
                id=spec.id,
                app=app.id,
                type=spec.type,
                cluster=spec.cluster or "",
                nodes=spec.nodes,
                duration=INF if spec.duration is None else spec.duration,
                related_to=spec.related_to if spec.related_how is not Relation.FREE else None,
                related_how=spec.related_how,
                submitted_at=self.now,
                seq=seq,
                placement=spec.placement,
                allowed=tuple(spec.clusters or ()),
            )
        old = self._check_replaced(app, ev.replaces, batch)
        # accepted: nothing below refuses
        self._seq = seq
        if old:
            self._answered(app.id)
            by = ", ".join(batch)
            for r in old:
                self._tell(r.id, "replaced", f"by {by}")
                self._end(r, EndReason.CANCELLED, self.now)
        for r in batch.values():
            self.requests[r.id] = r
            app.requests[r.id] = r
            self._touched.setdefault(app.id, set()).add(r.cluster)
            if r.preemptible:
                app.preemptible[r.id] = r
            if r.related_how is Relation.NEXT and r.related_to is not None:
                self._get(r.related_to).successor = r.id
            where = r.cluster or f"the cluster {r.placement} chooses" + (
                f" of {', '.join(r.allowed)}" if r.allowed else "")
            self._tell(r.id, "submitted", f"{r.type.value} {r.nodes} nodes on {where}")
        self.dirty = True
        return Accepted(stimulus_id=ev.stimulus_id, app=app.id, requests=tuple(batch))

    def _check_clusters(self, spec: RequestSpec) -> None:
        """The cluster it names, or the clusters it allows the RMS to choose from, exist."""
        known = ", ".join(sorted(self.clusters)) or "none"
        if spec.cluster is not None:
            if spec.cluster not in self.clusters:
                raise CommandError(
                    ErrorCode.UNKNOWN_CLUSTER, f"request {spec.id}: unknown cluster {spec.cluster} (known: {known})"
                )
            return
        unknown = [c for c in spec.clusters or () if c not in self.clusters]
        if unknown or not self.clusters:
            what = f"unknown cluster {', '.join(unknown)}" if unknown else "no cluster to choose from"
            raise CommandError(ErrorCode.UNKNOWN_CLUSTER, f"request {spec.id}: {what} (known: {known})")

    def _get(self, rid: str) -> Request:
        return self.requests[rid]

    def _check_replaced(self, app: App, replaces: Iterable[str], batch: dict[str, Request]) -> list[Request]:
        """The waiting requests of ``app`` a submission replaces (CommandError if one is not: ``started`` when
        it has started -- the application keeps it --, ``ended``, ``not_yours``, ``unknown_request``); the
        batch may not relate to one of them (it is cancelled)."""
        out: list[Request] = []
        seen: set[str] = set()
        for rid in replaces:
            if rid in seen:
                raise CommandError(ErrorCode.BAD_REQUEST, f"request {rid} is named twice in replaces")
            seen.add(rid)
            r = self.requests.get(rid)
            if r is None:
                if rid in self.ended and self.ended[rid][0] != app.id:
                    raise CommandError(ErrorCode.NOT_YOURS, f"replaced request {rid} belongs to another application")
                if rid in self.ended:
                    reason = self.ended[rid][1].value
                    raise CommandError(ErrorCode.ENDED, f"replaced request {rid} has already ended ({reason})")
                raise CommandError(ErrorCode.UNKNOWN_REQUEST, f"no request {rid} to replace")
            if r.app != app.id:
                raise CommandError(ErrorCode.NOT_YOURS, f"replaced request {rid} belongs to another application")
            if r.state is not WAITING:
                raise CommandError(ErrorCode.STARTED, f"replaced request {rid} has started (at {r.start}): "
                                   "nothing was changed")
            out.append(r)
        for new in batch.values():
            if new.related_to in seen:
                raise CommandError(ErrorCode.BAD_RELATION,
                                   f"request {new.id}: related to {new.related_to}, which it replaces")
        return out

    def _check_relation(self, app: App, spec: RequestSpec, batch: dict[str, Request],
                        replaced: frozenset[str] = frozenset()) -> None:
        """``replaced``: requests the submission cancels -- a NEXT successor among them frees its predecessor
        for a new one (an evolving application revising the growth it asked for)."""
        rid = spec.related_to
        if rid is None:  # (the request model refuses a relation without its target)
            raise CommandError(ErrorCode.BAD_RELATION, f"request {spec.id}: related to nothing")
        target = batch.get(rid) or self.requests.get(rid)
        if target is None:
            if rid in self.ended:
                owner = self.ended[rid][0]
                if owner != app.id:
                    raise CommandError(
                        ErrorCode.NOT_YOURS, f"request {spec.id}: {rid} belongs to another application"
                    )
                raise CommandError(ErrorCode.ENDED, f"request {spec.id}: related request {rid} has ended")
            raise CommandError(ErrorCode.UNKNOWN_REQUEST, f"request {spec.id}: no request {rid}")
        if target.app != app.id:
            raise CommandError(ErrorCode.NOT_YOURS, f"request {spec.id}: {rid} belongs to another application")
        if target.unplaced:
            raise CommandError(ErrorCode.BAD_RELATION, f"request {spec.id}: the RMS has not chosen {rid}'s cluster "
                               "yet (its start notification names it)")
        if spec.related_how is Relation.NEXT:
            if target.type is not spec.type or target.cluster != spec.cluster:
                raise CommandError(
                    ErrorCode.BAD_RELATION,
                    f"request {spec.id}: NEXT must follow a request of the same type and cluster "
                    f"({rid} is {target.type.value} on {target.cluster})",
                )
            if target.successor is not None and target.successor not in replaced:
                raise CommandError(
                    ErrorCode.BAD_RELATION, f"request {spec.id}: {rid} already has a NEXT successor"
                )
        elif spec.type is not RequestType.PREEMPTIBLE and target.type is RequestType.PREEMPTIBLE:
            raise CommandError(
                ErrorCode.BAD_RELATION,
                f"request {spec.id}: a {spec.type.value} request cannot be co-allocated with a preemptible one",
            )

    def _done(self, ev: Done) -> Accepted:
        app = self._app(ev.app)
        self._answered(app.id)
        r = self.requests.get(ev.request)
        if r is None:
            if ev.request in self.ended and self.ended[ev.request][0] == app.id:
                reason = self.ended[ev.request][1].value
                raise CommandError(ErrorCode.ENDED, f"request {ev.request} has already ended ({reason})")
            if ev.request in self.ended:
                raise CommandError(ErrorCode.NOT_YOURS, f"request {ev.request} belongs to another application")
            raise CommandError(ErrorCode.UNKNOWN_REQUEST, f"no request {ev.request}")
        if r.app != app.id:
            raise CommandError(ErrorCode.NOT_YOURS, f"request {ev.request} belongs to another application")
        if len(set(ev.released)) != len(ev.released):
            raise CommandError(ErrorCode.BAD_RELEASE, "a node ID is named twice in released")
        if ev.released and (r.state is not STARTED or r.type is RequestType.PRE_ALLOCATION):
            raise CommandError(ErrorCode.BAD_RELEASE, f"request {r.id} holds no node IDs to release")
        if len(ev.released) > r.nodes:
            raise CommandError(
                ErrorCode.BAD_RELEASE, f"request {r.id} holds {r.nodes} nodes; cannot release {len(ev.released)}"
            )
        if r.state is WAITING:
            self._end(r, EndReason.CANCELLED, self.now)
        elif self._successor_waiting(r) is not None:
            # an update (request NEXT r, then done r): r keeps its nodes until the successor takes them
            # over, possibly after preemptible holders released theirs; it ends as done, at this time
            r.released = tuple(ev.released)
            r.done_at = self.now
            r.end = min(r.end, self.now)
            self._hand_over(r)
        else:
            r.released = tuple(ev.released)
            self._hold_on_done(r)
            self._end(r, EndReason.DONE, self.now)
            if r.preemptible:
                self._shrink_met(app, r.cluster)
        self.dirty = True
        return Accepted(stimulus_id=ev.stimulus_id, app=app.id, requests=(r.id,))

    def _shrink_met(self, app: App, cluster: str) -> None:
        """A holder told to shrink that gave back enough by its deadline has met it, whenever the next pass
        comes. A pass that finds it within its view lifts the deadline too, but passes may be further apart
        than the grace (a long re-scheduling interval), and by the next one the view may have dropped again:
        that is a new shrink, with a grace of its own, not the old one missed -- which ended the session of
        an application that had obeyed."""
        deadline = app.deadlines.get(cluster)
        if deadline is None or self.now > deadline or self.schedule is None:
            return
        # against what the shrink asked, not the view worked out again: the done changed what the holder wants,
        # and a policy may then share the cluster otherwise (EGS gave m157 of koala-pwa-growth 2 nodes of 5
        # rather than 3 once it wanted fewer, and ended it for obeying)
        allowed = app.shrink_to.get(cluster)
        held = sum(r.nodes for r in app.preemptible.values() if r.state is STARTED and r.cluster == cluster)
        if (held <= allowed) if allowed is not None else preemption.within_view(self, self.schedule, app.id, cluster):
            del app.deadlines[cluster]
            app.shrink_to.pop(cluster, None)

    # -- negotiation (the adaptive-RMS paper; rules in :mod:`.negotiation`) ---------------------------
    def _negotiate(self, ev: Negotiate) -> Accepted | Offered:
        app = self._app(ev.app)
        self._answered(app.id)
        terms = ev.terms
        if terms.cluster not in self.clusters:
            known = ", ".join(sorted(self.clusters)) or "none"
            raise CommandError(ErrorCode.UNKNOWN_CLUSTER,
                               f"negotiation {terms.negotiation}: unknown cluster {terms.cluster} (known: {known})")
        if terms.negotiation in self.requests or terms.negotiation in self.ended:
            raise CommandError(ErrorCode.DUPLICATE, f"request id {terms.negotiation} is already used")
        book = self.negotiations
        neg = book.open.get(terms.negotiation)
        if neg is not None and neg.app != app.id:
            raise CommandError(ErrorCode.DUPLICATE,
                               f"negotiation id {terms.negotiation} is already another application's")
        if neg is None:
            if sum(1 for n in book.open.values() if n.app == app.id) >= negotiation.MAX_OPEN:
                # what the core keeps stays bounded: a session may not pile up negotiations (each pass reads them)
                raise CommandError(ErrorCode.BAD_REQUEST, f"application {app.id} has {negotiation.MAX_OPEN} open "
                                   "negotiations already: answer or reject one first")
            neg = book.open[terms.negotiation] = Negotiation(app.id, terms, self.now)
        else:  # revised: its offer is withdrawn
            book.withdraw(neg, ANSWERED)
            neg.terms, neg.at_most = terms, None
            self.dirty = True
        return self._offer(app, neg, ev.stimulus_id)

    def _offer(self, app: App, neg: Negotiation, stimulus: str) -> Accepted | Offered:
        ctx = self._place_all()
        # preemptible growth is offered within the application's preemptive view: the schedule of this placement
        sched = self._schedule(ctx) if neg.terms.type is RequestType.PREEMPTIBLE else None
        made = negotiation.make_offer(self, neg, ctx.profile(neg.cluster).to_stepfunction(), stimulus,
                                      sched=sched)
        if made is None:
            self.tell_negotiation(neg, "nothing to offer now: waits for nodes to free up")
            return Accepted(stimulus_id=stimulus, app=app.id)
        when = "now" if made.start == self.now else f"from {made.start}"
        self.tell_negotiation(neg, f"offered {made.nodes} nodes {when} ({made.offer}, round {made.round})")
        return made

    def _respond(self, ev: Respond) -> Accepted | Offered:
        app = self._app(ev.app)
        self._answered(app.id)
        book = self.negotiations
        nid = book.offers.get(ev.offer)
        if nid is None:
            owner, outcome = book.recent.get(ev.offer, ("", ""))
            if owner and owner != app.id:
                raise CommandError(ErrorCode.NOT_YOURS, f"offer {ev.offer} is another application's")
            if outcome == LAPSED:
                raise CommandError(ErrorCode.OFFER_LAPSED, f"offer {ev.offer} lapsed: its deadline passed")
            if outcome:
                raise CommandError(ErrorCode.UNKNOWN_OFFER, f"offer {ev.offer} was answered already")
            raise CommandError(ErrorCode.UNKNOWN_OFFER, f"no offer {ev.offer}")
        neg = book.open[nid]
        offer = neg.offer
        assert offer is not None
        if neg.app != app.id:
            raise CommandError(ErrorCode.NOT_YOURS, f"offer {ev.offer} is another application's")
        if offer.deadline <= self.now:  # its pass has not come yet: it lapses now
            self.tell_negotiation(neg, f"offer {offer.id} lapsed (answered after its deadline)")
            self.close_negotiation(neg, LAPSED)
            raise CommandError(ErrorCode.OFFER_LAPSED, f"offer {ev.offer} lapsed at {offer.deadline}")
        if ev.answer is Answer.ACCEPT:
            return self._accept(app, neg, ev)
        if ev.answer is Answer.COUNTER:
            if ev.nodes is None or not neg.terms.allows(ev.nodes):
                t = neg.terms
                sizes = f" in {list(t.sizes)}" if t.sizes else ""
                raise CommandError(ErrorCode.BAD_COUNTER,
                                   f"counter {ev.nodes}: the negotiation allows {t.min_nodes}..{t.max_nodes}{sizes}")
            book.withdraw(neg, ANSWERED)
            neg.at_most = ev.nodes
            self.dirty = True
            return self._offer(app, neg, ev.stimulus_id)
        self.tell_negotiation(neg, f"offer {offer.id} rejected")
        self.close_negotiation(neg, ANSWERED)
        return Accepted(stimulus_id=ev.stimulus_id, app=app.id)

    def _accept(self, app: App, neg: Negotiation, ev: Respond) -> Accepted:
        offer, terms = neg.offer, neg.terms
        assert offer is not None
        if ev.nodes is not None and ev.nodes != offer.nodes:
            raise CommandError(ErrorCode.BAD_REQUEST,
                               f"an accept takes the offer as it is ({offer.nodes} nodes): counter to change it")
        if offer.nodes == 0:
            raise CommandError(ErrorCode.BAD_REQUEST, f"offer {offer.id} gives no nodes: nothing to accept")
        if neg.id in self.requests or neg.id in self.ended:
            raise CommandError(ErrorCode.DUPLICATE, f"request id {neg.id} is already used")
        self._seq += 1
        r = Request(id=neg.id, app=app.id, type=terms.type, cluster=terms.cluster, nodes=offer.nodes,
                    duration=INF if terms.duration is None else terms.duration, related_to=None,
                    related_how=Relation.FREE, submitted_at=self.now, seq=self._seq)
        self.requests[r.id] = r
        app.requests[r.id] = r
        self._touched.setdefault(app.id, set()).add(r.cluster)
        if r.preemptible:
            app.preemptible[r.id] = r
        elif offer.reserved:
            self.negotiations.promised.append(r.id)  # placed first by the next pass, on what the offer set aside
        self._tell(r.id, "submitted", f"{r.type.value} {r.nodes} nodes on {r.cluster}, offer {offer.id} accepted")
        self.negotiations.withdraw(neg, ANSWERED)
        self.negotiations.open.pop(neg.id, None)
        self.dirty = True
        return Accepted(stimulus_id=ev.stimulus_id, app=app.id, requests=(r.id,))

    def tell_negotiation(self, neg: Negotiation, what: str) -> None:
        self._tell(neg.id, "negotiation", what)

    def close_negotiation(self, neg: Negotiation, outcome: str) -> None:
        """It ends without becoming a request: its story is kept as an ended request's (bounded)."""
        self.negotiations.close(neg, outcome)
        self._ended_stories.append(neg.id)
        while len(self._ended_stories) > ENDED_STORIES:
            self.stories.pop(self._ended_stories.popleft(), None)
        self.dirty = True

    def _nodes_changed(self, ev: NodesChanged) -> None:
        self.clusters[ev.cluster] = ev.up
        negotiation.overdrawn(self, ev.cluster)
        self._shrink_holds(ev.cluster, ev.lost_held)
        for rid in ev.lost_requests:
            r = self.requests.get(rid)
            if r is not None and r.state is STARTED and r.cluster == ev.cluster:
                self._end(r, EndReason.NODE_FAILURE, self.now)
            else:
                # it ended (done) but the allocator has not freed its nodes yet: its hold loses the node
                self._shrink_holds(ev.cluster, 1, request=rid)
        self.dirty = True

    # ============================================================================================
    # state transitions
    # ============================================================================================
    def _tell(self, rid: str, what: str, detail: str = "") -> None:
        story = self.stories.setdefault(rid, [])
        story.append((self.now, what, detail))
        if len(story) > STORY_LINES:
            del story[1]  # the first line (submitted) and the latest ones

    def _carry_potential(self, r: Request) -> int:
        succ = self.requests.get(r.successor) if r.successor else None
        if succ is None or succ.state is not WAITING:
            return 0
        return min(r.nodes - len(r.released), succ.nodes)

    def _hold_on_done(self, r: Request) -> None:
        """Fair-start (CooRM §III-C): nodes leaving a pre-allocation (explicit or implicit) early stay
        occupied for ``fair_start`` seconds, never beyond the request's planned end -- so that the
        applications that adapt to their views and wait may re-select onto them before lower priorities
        backfill them. Only while there are such applications: a hold for no one is idle nodes; and only
        until each of them has answered (sent a request or a ``done``)."""
        fs = self.settings.fair_start
        until = min(self.now + fs, r.end)
        if fs <= 0 or until <= self.now or r.preemptible or r.container is not None:
            return
        # (counted, not searched: a search was most of a done's time with thousands of requests waiting)
        started = self.started_per_app
        awaiting = {a.id for a in self.apps.values()
                    if a.adapts and len(a.requests) - started.get(a.id, 0) > (r.app == a.id and r.state is WAITING)}
        if not awaiting:
            return
        nodes = r.nodes - self._carry_potential(r)
        if nodes <= 0:
            return
        if not r.is_preallocation:
            self.holds.append(Hold(r.cluster, self.now, until, nodes, True, r.id, awaiting))
            return
        # a pre-allocation's node IDs belong to the requests running inside it: hold theirs, but not
        # those their NEXT successors keep
        inside = [i for i in self.apps[r.app].requests.values() if i.container == r.id]
        nodes -= sum(self._carry_potential(i) for i in inside)
        for inner in inside:
            take = min(inner.nodes - self._carry_potential(inner), nodes)
            if take > 0:
                self.holds.append(Hold(r.cluster, self.now, until, take, True, inner.id, set(awaiting)))
                nodes -= take
        if nodes > 0:
            self.holds.append(Hold(r.cluster, self.now, until, nodes, False, r.id, awaiting))

    def _answered(self, app_id: str, *, left: bool = False) -> None:
        """The application sent a command (or ``left``: its session ended): the holds kept for it to
        re-select need not wait for it now."""
        now = self.now
        holds = self.holds
        # holds begin at their ``done`` and are kept in that order, so an answer reaches every hold begun
        # before it: only those begun since this application's last answer can still await it
        first = 0 if left else bisect.bisect_left(holds, self.answered_at.get(app_id, -INF), key=_BEGIN)
        if left:
            self.answered_at.pop(app_id, None)
        else:
            self.answered_at[app_id] = now
        answered = emptied = False
        for i in range(first, len(holds)):
            h = holds[i]
            if not left and h.begin >= now:
                break
            if app_id in h.awaiting:
                h.awaiting.discard(app_id)  # in place: a copy per hold per answer was O(holds x apps)
                answered = True
                emptied = emptied or not h.awaiting
        if not answered:
            return
        self.dirty = True
        if not emptied:
            return
        kept = []
        for h in holds:
            if not h.awaiting:
                self._tell(h.request, "fair-start hold ended", "every waiting application answered")
                if h.physical:
                    self.released_holds.append(h)
                continue
            kept.append(h)
        self.holds = kept

    def _shrink_holds(self, cluster: str, lost: int, request: str | None = None) -> None:
        """Held nodes that went down are no longer held: the latest holds give them back first."""
        for i in range(len(self.holds) - 1, -1, -1):
            h = self.holds[i]
            if lost <= 0:
                break
            if h.cluster == cluster and h.physical and request in (None, h.request):
                take = min(lost, h.nodes)
                lost -= take
                if take == h.nodes:
                    del self.holds[i]
                else:
                    self.holds[i] = Hold(h.cluster, h.begin, h.until, h.nodes - take, True, h.request, h.awaiting)

    def _move(self, r: Request, transition: str) -> None:
        """The one way a request's phase changes: a transition of its lifecycle table."""
        r.phase = lifecycle.target(r.phase, transition, r.id, self.stories.get(r.id, ()))
        self._touched.setdefault(r.app, set()).add(r.cluster)
        if r.phase is Phase.RUNNING:
            self.started[r.id] = r  # (only ``start`` leads here)
            self._started_since.append(r)
            self.started_per_app[r.app] = self.started_per_app.get(r.app, 0) + 1
        elif r.phase is Phase.ENDED and self.started.pop(r.id, None) is not None:
            left = self.started_per_app.pop(r.app) - 1
            if left:
                self.started_per_app[r.app] = left

    def _end(self, r: Request, reason: EndReason, at: float) -> None:
        was_started = r.state is STARTED
        self._move(r, "end" if was_started else "cancel")
        r.end_reason = reason
        r.end = at if was_started else r.end
        self.requests.pop(r.id, None)
        app = self.apps.get(r.app)
        if app is not None:
            app.requests.pop(r.id, None)
            app.preemptible.pop(r.id, None)
        self.ended[r.id] = (r.app, reason, at)
        if app is not None:
            app.ended.append(r.id)
        if not was_started and r.related_how is Relation.NEXT and r.related_to is not None:
            # a successor that never started: its predecessor may be followed again (an evolving
            # application revises a growth it over-asked for)
            pred = self.requests.get(r.related_to)
            if pred is not None and pred.successor == r.id:
                pred.successor = None
        self._pending_ends.append(r)
        self._tell(r.id, "ended", reason.value)
        self._ended_stories.append(r.id)
        while len(self._ended_stories) > ENDED_STORIES:
            self.stories.pop(self._ended_stories.popleft(), None)
        if r.is_preallocation and was_started and app is not None:
            for inner in [i for i in app.requests.values() if i.container == r.id]:
                self._end(inner, EndReason.CONTAINER_ENDED, at)

    def _end_session(self, app: App, reason: str, end_reason: EndReason) -> None:
        self._answered(app.id, left=True)
        for neg in [n for n in self.negotiations.open.values() if n.app == app.id]:
            self.close_negotiation(neg, ANSWERED)
        for r in list(app.requests.values()):
            if r.state is not ENDED:
                self._end(r, end_reason if r.state is STARTED else EndReason.CANCELLED, self.now)
        del self.apps[app.id]
        # its request ids are no longer anyone's: a request naming one of them is unknown from now on
        # (the SDK's ids, ``<app>.<n>``, are never used again: application ids never are)
        for rid in app.ended:
            self.ended.pop(rid, None)
        self._order.remove((app.opened_at, app.seq, app.id))
        self._by_priority = None
        self._pending_sessions.append((app.id, reason))
        self.dirty = True

    # ============================================================================================
    # the pass
    # ============================================================================================
    def _pass_due(self) -> bool:
        if not self.dirty and self._timer > self.now:
            return False
        return self.now >= self._earliest_pass()

    def _expire(self) -> None:
        now = self.now
        due = [r for r in self.started.values() if r.end <= now]
        # a request inside a pre-allocation that ends with it reached its own walltime
        for r in sorted(due, key=lambda r: (r.end, r.is_preallocation, r.seq)):
            if r.state is not STARTED:
                continue  # it ended as a container's inner request meanwhile
            if self._successor_waiting(r) is None:
                self._end(r, *self._natural_end(r))
            else:
                self._hand_over(r)
        self.holds = [h for h in self.holds if h.until > now]

    def _hand_over(self, r: Request) -> None:
        """``r`` keeps running past its end (or its done) for its waiting NEXT successor."""
        if r.phase is Phase.RUNNING:
            self._move(r, "hand over")
            self._tell(r.id, "handing over", f"to {r.successor}")

    def _successor_waiting(self, r: Request) -> Request | None:
        """The waiting NEXT successor that will take ``r``'s nodes over. Until it starts -- it may wait
        for preemptible holders to release -- ``r`` keeps running past its end, so that the chain keeps
        its nodes (CooRMv2 §III-A2)."""
        if r.successor is None or r.type is not RequestType.NON_PREEMPTIBLE:
            return None
        succ = self.requests.get(r.successor)
        return succ if succ is not None and succ.state is WAITING else None

    def _end_overdue(self) -> None:
        """Requests kept past their end for a successor that is not starting now after all."""
        now = self.now
        for r in self._started_in_order(now):
            succ = self._successor_waiting(r)
            if succ is None or not (succ.blocked and succ.start <= now):
                self._end(r, *self._natural_end(r))

    @staticmethod
    def _natural_end(r: Request) -> tuple[EndReason, float]:
        return (EndReason.DONE, r.done_at) if r.done_at is not None else (EndReason.WALLTIME, r.end)

    def _run_pass(self, stimulus: str) -> list[PolicyDecision]:
        # decisions leave in causal order: what ended, then what started in view of it; a violator killed
        # at the end of an iteration (possibly right after one of its requests started) gets its ends in
        # the next iteration, after those starts
        decisions: list[PolicyDecision] = []
        decisions.extend(negotiation.lapse(self, stimulus))
        decisions.extend(self._standing_offers(stimulus))
        while True:
            # holds ended early -- by a command, or by a violator's session ended in the last iteration --
            # reach the allocator before any start that counts their nodes as free
            decisions.extend(HoldReleased(stimulus_id=stimulus, request=h.request, cluster=h.cluster)
                             for h in self.released_holds)
            self.released_holds = []
            self._expire()
            ctx = self._place_all()
            schedule = self._schedule(ctx)
            started = self._start_due(ctx, schedule, stimulus)
            schedule.settle({s.request for s in started})
            if self.settings.precedence == RUNNING_FIRST:
                held = [self.requests[s.request] for s in started if s.type is RequestType.PREEMPTIBLE]
                schedule.occupy([(r.cluster, (r.start, r.end, r.nodes)) for r in held])
            decisions.extend(self._end_decisions(stimulus))
            decisions.extend(started)
            deadlines, violators = preemption.enforce(self, schedule, stimulus)
            for d in deadlines:
                for r in self.apps[d.app].preemptible.values():
                    if r.state is STARTED and r.cluster == d.cluster:
                        self._tell(r.id, "preempt", f"release {d.held - d.allowed} nodes by {d.deadline}")
            decisions.extend(deadlines)
            if not violators:
                break
            for app_id in violators:
                self._end_session(self.apps[app_id], "protocol violation", EndReason.VIOLATION)
        book = self.negotiations
        if book.promised:
            live = self.requests
            book.promised = [rid for rid in book.promised if rid in live and live[rid].state is WAITING]
        self.dirty = False
        self.last_pass = self.now
        self.recent_passes = [*self.recent_passes, self.now][-self.settings.pass_burst:]
        self.epoch += 1
        schedule.epoch = self.epoch
        self.schedule = schedule
        for app_id, reason in self._pending_sessions:
            decisions.append(SessionEnded(stimulus_id=stimulus, app=app_id, reason=reason))
        self._pending_sessions.clear()
        changed = self._changed_views(schedule)
        if changed:
            decisions.append(ViewsChanged(stimulus_id=stimulus, apps=tuple(changed)))
        self._timer = self._next_timer(schedule)
        waiting = len(self.requests) - len(self.started)
        decisions.append(
            PassDone(
                stimulus_id=stimulus,
                epoch=self.epoch,
                at=self.now,
                waiting=waiting,
                running=len(self.requests) - waiting,
                next_wakeup=self.next_wakeup(),
            )
        )
        return decisions

    def _standing_offers(self, stimulus: str) -> list[Offered]:
        book = self.negotiations
        clusters = {n.cluster for n in book.open.values() if n.offer is None and n.terms.standing}
        if not clusters:
            return []
        ctx = self._place_all()  # (the profiles left once every waiting request is placed never delay them)
        return negotiation.standing_offers(self, {c: ctx.profile(c).to_stepfunction() for c in clusters}, stimulus,
                                           self._schedule(ctx))

    def _base(self) -> dict[str, list[tuple[float, float, int]]]:
        base: dict[str, list[tuple[float, float, int]]] = {c: [] for c in self.clusters}
        # PRA: nodes held preemptibly are occupied for the placement, so no waiting request is placed on
        # them (it waits until they are given back). Only the placement sees them: they stay preemptible
        # capacity, else their holders' views would drop under what they hold. (Preemptible nodes lent
        # from pre-allocated but unused ones are then counted twice: waiting requests may start later.)
        keep_preemptible = self.settings.precedence == RUNNING_FIRST
        for r in self._started_in_order():
            if r.container is None and (keep_preemptible or not r.preemptible):
                base[r.cluster].append((r.start, r.end, r.nodes))
        for h in self.holds:
            base[h.cluster].append((h.begin, h.until, h.nodes))
        for c, item in self.negotiations.reservations():  # nodes an open offer sets aside
            base[c].append(item)
        return base

    def _place_all(self) -> PassContext:
        ctx = self._walk(self._kept) if self.reuse else self._walk(None, whole=True)
        if self.validate and ctx.kept_units:
            self._check_kept(ctx)
        self._kept = ctx.kept
        self._touched = {}
        self._started_since = []
        return ctx

    def _walk(self, kept: Kept | None, *, whole: bool = False) -> PassContext:
        """Place every waiting request, keeping from ``kept`` (the last placement) what cannot have changed
        (:mod:`.reuse`); with ``kept`` None, nothing. ``whole``: each application's requests as one unit, placed
        together as before units were (the reference the kept placements are compared with)."""
        now = self.now
        base = self._base()
        requests = self.requests
        # accepted offers go first, on the nodes their offers set aside: the RMS gave its word
        promised = {rid for rid in self.negotiations.promised
                    if rid in requests and requests[rid].state is WAITING}
        touched = self._touched
        full = kept is None or bool(promised) or kept.unplaced or any("" in cs for cs in touched.values())
        lanes: dict[str, Lane] = {}
        profiles: dict[str, Profile] = {}
        # what started since was placed then: its reservation moved from the placement to the base
        into_base: dict[str, list[tuple[float, float, int]]] = {}
        if not full:
            for r in self._started_since:
                if r.state is STARTED and r.container is None and not r.preemptible:
                    into_base.setdefault(r.cluster, []).append((r.start, r.end, r.nodes))
        signature = 0
        hashed: dict[str, list[tuple[float, int]]] = {}
        for c, up in self.clusters.items():
            items = base[c]
            hashes = hashed[c] = [(item[1], interval_hash(c, item)) for item in items]
            signature += sum(h for _, h in hashes)
            if kept is None or full:
                lane = Lane(c, up, items, True, [])
            else:
                was = kept.base.get(c)
                replacing = was is None or kept.up.get(c) != up or (
                    key_at(hashes, now) != key_at(was + [(i[1], interval_hash(c, i)) for i in into_base.get(c, ())],
                                                  now))
                lane = Lane(c, up, items, replacing, kept.order.get(c, []))
            lanes[c] = lane
            if lane.replacing:
                profiles[c] = lane.ready(now)
        placer = Placer(now, profiles, signature=signature & _MASK)
        placer.np_usage = {c: [] for c in self.clusters}
        for r in self._started_in_order():
            if not r.preemptible and not r.is_preallocation:
                placer.np_usage[r.cluster].append((r.start, r.end, r.nodes))
        for h in self.holds:
            if h.physical:
                placer.np_usage[h.cluster].append((h.begin, h.until, h.nodes))
        for c, item in self.negotiations.reservations():
            placer.np_usage[c].append(item)
        ctx = PassContext(placer, base, lanes=lanes)
        lookup = requests.get
        due = ctx.due
        for rid in self.negotiations.promised:
            if rid in promised:
                r = requests[rid]
                for pl in placer.place_app([r], {}, lookup):
                    pl.request.start = pl.start
                    pl.request.placed_in = None
                if r.start <= now:
                    due.append(r)
        marks, signatures = ctx.marks, ctx.np_signatures
        log, log_ids, usage = placer.log, placer.log_ids, placer.np_usage
        old_units = kept.units if kept is not None and not full else {}
        units_of: dict[str, list[Unit]] = {}
        unplaced = False

        def moved(app_id: str, key: str, cluster: str) -> bool:
            """Whether the last placement's unit's reservations on ``cluster`` are all of requests started since."""
            for u in old_units.get(app_id, ()):
                if u.key == key:
                    return all((q := requests.get(rid)) is not None and q.state is STARTED
                               for (c, *_), rid in zip(u.entries, u.ids, strict=True) if c == cluster)
            return False
        for app in self.priority_order():
            marks[app.id] = len(log)
            signatures[app.id] = placer.signature
            if not app.requests:
                continue  # (most of a thousand open sessions: nothing to place, and a pass is per session)
            old = old_units.get(app.id)
            mine = touched.get(app.id)
            previous: dict[str, Unit] = {}
            if old is not None and mine is None:
                units = old
            else:
                units, missed = self._units(app, placer, promised, whole)
                unplaced = unplaced or missed
                if old is not None and mine is not None:
                    previous = {u.key: u for u in old}
                    units = [previous[u.key] if u.key in previous and mine.isdisjoint(u.clusters) else u
                             for u in units]
            units_of[app.id] = units
            app_due: list[Request] = []
            due_units = 0
            for u in units:
                if u.placed and len(u.clusters) == 1 and u.first > now and not (lane := lanes[u.key]).replacing:
                    # the common case, kept as it was: one cluster, in its place in the lane's order
                    if not u.spans:
                        usage[u.key].extend(u.items)
                        ctx.kept_units += 1
                        continue
                    order, at = lane.order, lane.at
                    if at < len(order) and order[at] == (app.id, u.key):
                        lane.at = at + 1
                        log.extend(u.entries)
                        log_ids.extend(u.ids)
                        placer.signature = (placer.signature + u.signature) & _MASK
                        lane.pending.extend(u.spans)
                        usage[u.key].extend(u.items)
                        lane.seen.append((app.id, u.key))
                        ctx.kept_units += 1
                        continue
                prev = u if u.placed else previous.get(u.key)
                had = set(prev.lanes) if prev is not None else set()
                for c in had:
                    lane = lanes[c]
                    if not lane.replacing and not lane.comes(app.id, u.key, moved):
                        lane.replacing = True
                if prev is u and u.first > now and not any(lanes[c].replacing for c in u.clusters):
                    # kept: what it placed last time, its reservations made in the profile only when needed
                    log.extend(u.entries)
                    log_ids.extend(u.ids)
                    placer.signature = (placer.signature + u.signature) & _MASK
                    for c, b, e, n in u.entries:
                        lanes[c].pending.append((b, e, n))
                    if len(u.clusters) == 1:
                        usage[u.key].extend(u.items)
                    for c, item in u.usage:
                        usage[c].append(item)
                    ctx.kept_units += 1
                else:
                    keeping = [c for c in had.union(u.clusters) if not lanes[c].replacing]
                    if keeping:
                        started = set() if prev is None else {
                            rid for rid in prev.ids if (q := requests.get(rid)) is not None and q.state is STARTED}
                        before = {c: prev.on(c, started) if prev is not None else [] for c in keeping}
                    self._place_unit(u, placer, lanes)
                    ctx.placed_units += 1
                    for c in keeping:
                        if u.on(c) != before[c]:
                            lanes[c].replacing = True
                            profiles[c] = lanes[c].ready(now)
                    now_due = [r for r in u.waiting if r.start <= now]
                    if now_due:
                        app_due.extend(now_due)
                        due_units += 1
                for c in u.lanes:
                    lanes[c].seen.append((app.id, u.key))
            if due_units > 1:
                app_due.sort(key=_SEQ)
            due.extend(app_due)
        ctx.np_signatures["\x00final"] = placer.signature
        ctx.kept = Kept(dict(self.clusters), hashed, units_of,
                        {c: lane.seen for c, lane in lanes.items()}, unplaced=unplaced)
        return ctx

    def _units(self, app: App, placer: Placer, promised: set[str], whole: bool = False) -> tuple[list[Unit], bool]:
        """``app``'s waiting requests cut into the units placed together (:mod:`.reuse`): those on clusters that
        related requests tie together, one unit (``whole``: all of them); and whether one left to the RMS fits
        nowhere yet."""
        waiting: list[Request] = []
        sources: dict[str, list[tuple[Request, list[Request]]]] = {}
        missed = False
        for r in app.requests.values():
            if r.state is WAITING:
                if not r.preemptible and r.id not in promised:
                    if r.unplaced and not self._choose_cluster(r, placer):
                        missed = True
                        continue
                    waiting.append(r)
            elif r.is_preallocation:
                inner = [i for i in app.requests.values() if i.container == r.id]
                sources.setdefault(r.cluster, []).append((r, inner))
        if not waiting:
            return [], missed
        if whole:
            return [Unit.of(waiting, sources, related=True)], missed
        # a group of related requests is placed as one: the clusters it spans are one unit's
        tied: dict[str, str] = {r.cluster: r.cluster for r in waiting}

        def root(c: str) -> str:
            while tied[c] != c:
                c = tied[c]
            return c

        ids = {r.id: r for r in waiting}
        for r in waiting:
            if r.constrained and r.related_to in ids:
                a, b = root(r.cluster), root(ids[r.related_to].cluster)
                if a != b:
                    tied[max(a, b)] = min(a, b)
        per: dict[str, list[Request]] = {}
        for r in waiting:
            per.setdefault(root(r.cluster), []).append(r)
        # (related: place_app's test, a relation to a running request counts)
        units = [Unit.of(rs, sources, related=any(r.constrained for r in rs)) for rs in per.values()]
        units.sort(key=lambda u: u.key)
        return units, missed

    def _place_unit(self, u: Unit, placer: Placer, lanes: dict[str, Lane]) -> None:
        now = self.now
        clusters = u.clusters
        for c in clusters:
            placer.profiles[c] = lanes[c].ready(now)
        containers = {c: [placer.container_for(p, p.start, inner) for p, inner in srcs]
                      for c, srcs in u.sources.items()} if u.sources else {}
        log, usage = placer.log, placer.np_usage
        n0, s0 = len(log), placer.signature
        u0 = [len(usage[c]) for c in clusters]
        if u.related:
            placed = placer.place_app(u.waiting, containers, self.requests.get)
        else:  # (what place_app does with no related request, without looking for one)
            placed = placer._place_lone(u.waiting, containers)
        for pl in placed:
            pl.request.start = pl.start
            pl.request.placed_in = pl.container.request.id if pl.container else None
        entries = u.entries = log[n0:]
        u.ids = placer.log_ids[n0:]
        u.signature = (placer.signature - s0) & _MASK
        if len(clusters) == 1:
            u.items = usage[clusters[0]][u0[0]:]
            u.lanes = clusters if entries else ()
        else:
            u.usage = [(c, item) for c, k in zip(clusters, u0, strict=True) for item in usage[c][k:]]
            u.lanes = tuple(sorted({e[0] for e in entries}))
        u.spans = [(b, e, n) for _, b, e, n in entries]
        u.first = min([r.start for r in u.waiting])
        u.placed = True

    def _check_kept(self, kept: PassContext) -> None:
        """``validate``: a placement that kept units must equal one that placed everything."""
        def outcome(ctx: PassContext) -> dict[str, object]:
            order = [ctx.marks[a.id] for a in self.priority_order()] + [len(ctx.placer.log)]
            log = list(zip(ctx.placer.log, ctx.placer.log_ids, strict=True))
            return {
                "turns": [sorted(log[a:b]) for a, b in itertools.pairwise(order)],
                "marks": dict(ctx.marks), "signatures": dict(ctx.np_signatures),
                "due": [r.id for r in ctx.due],
                "usage": {c: sorted(items) for c, items in ctx.placer.np_usage.items()},
                "profiles": {c: ctx.profile(c).to_stepfunction() for c in self.clusters},
                "placed": {r.id: (r.start, r.placed_in) for r in self.requests.values()
                           if r.state is WAITING and not r.preemptible},
            }
        got = outcome(kept)
        want = outcome(self._walk(None, whole=True))
        for what, mine in got.items():
            if mine != want[what]:
                raise AssertionError(f"kept placements differ from a full pass's in {what} at {self.now}: "
                                     f"{mine} against {want[what]}")

    def _choose_cluster(self, r: Request, placer: Placer) -> bool:
        """The cluster of a request left to the RMS, chosen when it is first placed and kept: its rule
        (:mod:`coorm.shared.cluster_choice`, KOALA's worst-fit) applied to the profiles as they stand at its
        application's turn -- its non-preemptive views -- less ``local_threshold``. A request that fits
        nowhere with the threshold goes where it fits without it (the threshold keeps nodes from malleable
        growth, never from a non-preemptible request); one that fits nowhere, ever, waits unplaced (chosen
        again at the next pass), as KOALA keeps a job it cannot place in its queue."""
        allowed = [c for c in (r.allowed or sorted(self.clusters)) if c in placer.profiles]
        views = {c: placer.profiles[c].to_stepfunction() for c in allowed}
        rule, threshold = r.placement or WORST_FIT, self.settings.local_threshold
        chosen = choose(rule, views, r.nodes, r.duration, self.now, threshold)
        if chosen is None and threshold:
            chosen = choose(rule, views, r.nodes, r.duration, self.now)
        if chosen is None:
            r.start = INF
            return False
        r.cluster = chosen
        self._tell(r.id, "placed", f"on {chosen} by {rule}")
        return True

    def _schedule(self, ctx: PassContext) -> Schedule:
        placer = ctx.placer
        sched = Schedule(
            epoch=self.epoch + 1,
            now=self.now,
            policy=self.settings.preemptible,
            up=dict(self.clusters),
            base=ctx.base,
            log=placer.log,
            log_ids=placer.log_ids,
            marks=ctx.marks,
            np_signature=ctx.np_signatures,
            np_usage=placer.np_usage,
            priorities={a: (opened, seq) for opened, seq, a in self._order},  # (App.priority, read off the order)
            threshold=self.settings.local_threshold,
        )
        if self.settings.preemptible in INCREMENTAL:  # KOALA's rank: the order they first started in
            sched.priorities = {a.id: (a.started_at, a.seq) for a in self.apps.values()}
        preemption.collect_demands(self, sched)
        return sched

    def _start_due(self, ctx: PassContext, schedule: Schedule, stimulus: str) -> list[StartRequest]:
        # a predecessor kept past its end for a successor that is not due now ends first: its nodes are
        # free for this pass's starts
        now = self.now
        for r in self._started_in_order(now):
            succ = self._successor_waiting(r)
            if succ is not None and succ.start > now:
                self._end(r, *self._natural_end(r))
        free = {c: up for c, up in self.clusters.items()}
        for r in self.started.values():
            if not r.is_preallocation:
                free[r.cluster] -= r.nodes
        for h in self.holds:
            if h.physical:
                free[h.cluster] -= h.nodes
        for c in free:
            free[c] -= self.negotiations.reserved_now(c, now)
        starts: list[StartRequest] = []
        waiting_for_nodes: list[tuple[Request, int]] = []  # (request, free nodes set aside for it)
        for r in ctx.due:
            if r.state is WAITING:
                if not r.is_preallocation:
                    got = self._fits(r, free)
                    if got is None:
                        if not r.blocked:
                            self._tell(r.id, "blocked", "nodes still held preemptibly")
                            self._move(r, "block")
                        # what is free stays set aside for it: later (lower-priority) starts do not take it
                        aside = min(r.nodes, max(free[r.cluster], 0))
                        free[r.cluster] -= aside
                        waiting_for_nodes.append((r, aside))
                        continue
                starts.append(self._start(r, stimulus))
        # a NEXT hand-over later in the order may have freed its predecessor's surplus: a request blocked
        # before it gets a second look (a lower-priority chain must not hold a higher-priority start back)
        for r, aside in waiting_for_nodes:
            free[r.cluster] += aside
            if r.state is WAITING and self._fits(r, free) is not None:
                starts.append(self._start(r, stimulus))
            else:
                free[r.cluster] -= aside
        self._end_overdue()
        starts.extend(self._start(r, stimulus) for r in preemption.due_preemptible(self, schedule, free))
        return starts

    def _fits(self, r: Request, free: dict[str, int]) -> int | None:
        """Take from ``free`` the nodes ``r`` needs beyond what its NEXT predecessor hands over, and give
        back that predecessor's other nodes (released or surplus: freed as it hands over, before the
        successor takes new ones, so the successor may use them -- it would otherwise wait for its own
        predecessor, which waits for it). None if they are not free (held preemptibly)."""
        pred = self._running_predecessor(r)
        kept = min(pred.nodes - len(pred.released), r.nodes) if pred else 0
        need = r.nodes - kept
        surplus = pred.nodes - kept if pred else 0
        if need > free[r.cluster] + surplus:
            return None
        free[r.cluster] += surplus - need
        return need

    def _running_predecessor(self, r: Request) -> Request | None:
        """The NEXT predecessor still running (kept past its end) whose nodes ``r`` takes over."""
        if r.related_how is not Relation.NEXT or r.related_to is None:
            return None
        pred = self.requests.get(r.related_to)
        if pred is not None and pred.state is STARTED and pred.end <= self.now and pred.successor == r.id:
            return pred
        return None

    def _start(self, r: Request, stimulus: str) -> StartRequest:
        self._move(r, "start")
        r.start = self.now
        app = self.apps[r.app]
        if app.started_at == INF:
            app.started_at = self.now
        r.end = self.now + r.duration
        r.container = r.placed_in
        carry_from, carried = None, 0
        running = self._running_predecessor(r)
        if running is not None:
            # done (possibly after its end had passed, before a pass saw it) ends at the done's time
            if running.done_at is not None:
                self._end(running, EndReason.DONE, max(running.end, running.done_at))
            else:
                self._end(running, EndReason.NEXT, running.end)
        pred = self.ended.get(r.related_to) if r.related_how is Relation.NEXT and r.related_to else None
        if pred is not None and r.type is not RequestType.PRE_ALLOCATION:
            pred_req = next((p for p in self._pending_ends if p.id == r.related_to), None)
            if pred_req is not None and pred_req.end_reason not in (EndReason.CANCELLED,):
                carry_from = pred_req.id
                carried = min(pred_req.nodes - len(pred_req.released), r.nodes)
                pred_req.successor = r.id
                if pred_req.end_reason is EndReason.WALLTIME:
                    pred_req.end_reason = EndReason.NEXT
                    self.ended[pred_req.id] = (pred_req.app, EndReason.NEXT, pred_req.end)
        self._tell(r.id, "started", f"{r.nodes} nodes" + (f", {carried} kept from {carry_from}" if carry_from else ""))
        return StartRequest(
            stimulus_id=stimulus,
            app=r.app,
            request=r.id,
            type=r.type,
            cluster=r.cluster,
            nodes=r.nodes,
            at=self.now,
            end=None if r.end == INF else r.end,
            carry_from=carry_from,
            carried=carried,
        )

    def _end_decisions(self, stimulus: str) -> list[EndRequest]:
        out = []
        holds: dict[str, Hold] = {}
        for h in self.holds:
            if h.physical:
                holds[h.request] = h
        for r in self._pending_ends:
            hold = holds.get(r.id)
            started = r.end_reason is not EndReason.CANCELLED
            succ = r.successor if started and self._carried_to(r) else None
            carried = min(r.nodes - len(r.released), self.requests[succ].nodes) if succ else 0
            out.append(
                EndRequest(
                    stimulus_id=stimulus,
                    app=r.app,
                    request=r.id,
                    type=r.type,
                    cluster=r.cluster,
                    nodes=r.nodes,
                    started=started,
                    reason=r.end_reason,
                    at=r.end if started else self.now,
                    started_at=r.start if started else None,
                    successor=succ,
                    carried=carried,
                    released=r.released,
                    hold_nodes=hold.nodes if hold else 0,
                    hold_until=hold.until if hold else None,
                )
            )
        self._pending_ends.clear()
        return out

    def _carried_to(self, r: Request) -> bool:
        succ = self.requests.get(r.successor) if r.successor else None
        return succ is not None and succ.state is STARTED and succ.start == self.now

    def _changed_views(self, schedule: Schedule) -> list[str]:
        # an application that does not adapt reads no views: none is computed nor sent
        adapting = [app.id for app in self.priority_order() if app.adapts]
        new = dict(zip(adapting, schedule.signatures(adapting), strict=True))
        before = self._signatures.get
        self._signatures = new
        return [app for app, sig in new.items() if before(app) != sig]

    def _next_timer(self, schedule: Schedule) -> float:
        now = self.now
        # a started request's start is past: only waiting ones pass the test on their start
        t = min([r.start for r in self.requests.values() if r.start > now], default=INF)
        for r in self.started.values():
            if now < r.end < t:
                t = r.end
        for h in self.holds:
            t = min(t, h.until)
        for app in self.apps.values():
            for d in app.deadlines.values():
                t = min(t, d)
        for neg in self.negotiations.open.values():
            if neg.offer is not None:
                t = min(t, neg.offer.deadline)
        return min(t, preemption.next_change(self, schedule))

    # ============================================================================================
    # queries: what the services read of the core (nothing else of it is theirs to read)
    # ============================================================================================
    def has_app(self, app_id: str) -> bool:
        return app_id in self.apps

    def app_ids(self) -> list[str]:
        """The open sessions, in the order they opened."""
        return list(self.apps)

    def submitted_at(self, request_id: str) -> float | None:
        r = self.requests.get(request_id)
        return None if r is None else r.submitted_at

    def has_views(self) -> bool:
        """Whether a pass has run: views exist from the first one on."""
        return self.schedule is not None

    def views_of(self, app_id: str, clusters: Iterable[str] | None, preemptive: bool,
                 memo: dict[tuple[int, str], list[Step]] | None = None
                 ) -> dict[str, tuple[list[Step], list[Step] | None]]:
        """The application's views as of the last pass, per cluster (of ``clusters``, None: all), as wire
        steps: (non-preemptive, preemptive or None). ``memo`` shares the non-preemptive views between the
        applications that see the same ones (with a thousand idle launchers, most do)."""
        sched = self.schedule
        if sched is None:
            return {}
        memo = {} if memo is None else memo
        allowed = None if clusters is None else set(clusters)
        key = sched.np_view_key(app_id)
        out: dict[str, tuple[list[Step], list[Step] | None]] = {}
        for c in self.clusters:
            if (allowed is not None and c not in allowed) or c not in sched.up:
                continue  # (a cluster registered since the last pass has views from the next one)
            np = memo.get((key, c))
            if np is None:
                np = memo[key, c] = _steps(sched.np_view(app_id, c))
            out[c] = (np, _steps(sched.p_view(app_id, c)) if preemptive else None)
        return out

    # convenience for callers and tests --------------------------------------------------------------
    def held_preemptibly(self, app_id: str, cluster: str) -> int:
        app = self.apps.get(app_id)
        if app is None:
            return 0
        return sum(
            r.nodes for r in app.requests.values() if r.preemptible and r.state is STARTED and r.cluster == cluster
        )

    def iter_started(self, cluster: str) -> Iterable[Request]:
        return (r for r in self._started_in_order() if r.cluster == cluster)
