"""What the policy core remembers between events: applications (sessions) and their requests.

Plain mutable objects with slots; only :mod:`coorm.services.policy_engine.core` changes them (a request's
phase only through its lifecycle table, :mod:`coorm.services.policy_engine.lifecycle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from coorm.services.policy_engine.lifecycle import Phase
from coorm.shared.events import EndReason
from coorm.shared.requests import Relation, RequestType
from coorm.shared.stepfn import INF


class RequestState(StrEnum):
    WAITING = "waiting"
    STARTED = "started"
    ENDED = "ended"


_STATE = {Phase.WAITING: RequestState.WAITING, Phase.BLOCKED: RequestState.WAITING,
          Phase.RUNNING: RequestState.STARTED, Phase.HANDING_OVER: RequestState.STARTED,
          Phase.ENDED: RequestState.ENDED}


@dataclass(slots=True, eq=False)
class Request:
    id: str
    app: str
    type: RequestType
    cluster: str
    nodes: int
    duration: float  # INF when unbounded (preemptible only)
    related_to: str | None
    related_how: Relation
    submitted_at: float
    seq: int
    # where it is in its life (services/policy_engine/lifecycle.py: changed only by the core's moves)
    phase: Phase = Phase.WAITING
    start: float = INF  # scheduled start while waiting, actual start once started
    end: float = INF  # planned end once started, actual end once ended
    container: str | None = None  # the explicit pre-allocation a started request runs inside
    placed_in: str | None = None  # the pre-allocation a waiting request is placed inside, this pass
    successor: str | None = None  # the NEXT request that follows this one
    released: tuple[str, ...] = ()  # node IDs named in done
    done_at: float | None = None  # done, but kept running until its NEXT successor takes its nodes over
    end_reason: EndReason | None = None
    # left to the RMS (the request named no cluster): the rule that chooses its cluster and the clusters
    # allowed (empty: any); ``cluster`` is "" until the first pass that places it chooses one
    placement: str | None = None
    allowed: tuple[str, ...] = ()

    @property
    def state(self) -> RequestState:
        """Its phase as the services and the wire see it: waiting (or blocked), started (or handing
        over), ended."""
        return _STATE[self.phase]

    @property
    def blocked(self) -> bool:
        return self.phase is Phase.BLOCKED

    @property
    def preemptible(self) -> bool:
        return self.type is RequestType.PREEMPTIBLE

    @property
    def is_preallocation(self) -> bool:
        return self.type is RequestType.PRE_ALLOCATION

    @property
    def unplaced(self) -> bool:
        """Its cluster is the RMS's to choose and not chosen yet."""
        return not self.cluster

    @property
    def constrained(self) -> bool:
        return self.related_how is not Relation.FREE and self.related_to is not None


@dataclass(slots=True, eq=False)
class App:
    id: str
    opened_at: float
    seq: int
    user: str = ""
    name: str = ""
    kind: str = ""
    # it reads its views and may re-select (moldable, CEM, malleable, evolving); a rigid job does not: the
    # RMS knows its need, it gets no views and no fair-start hold is kept for it
    adapts: bool = True
    # live (waiting or started) requests in submission order
    requests: dict[str, Request] = field(default_factory=dict)
    # the preemptible ones among them, same order (the preemptible phase of a pass reads only these)
    preemptible: dict[str, Request] = field(default_factory=dict)
    # when its first request started: KOALA's FPSMA and EGS rank malleable applications by it
    started_at: float = INF
    # cluster -> time by which preemptible nodes above the preemptive view must be released
    deadlines: dict[str, float] = field(default_factory=dict)
    # cluster -> the nodes its pending deadline allows: what giving back meets that shrink (a view worked out
    # again later may be lower -- the wants changed -- and that is a new shrink, with a grace of its own)
    shrink_to: dict[str, int] = field(default_factory=dict)
    # its ended requests (the core's ``ended`` entries for them go when the session does)
    ended: list[str] = field(default_factory=list)

    @property
    def priority(self) -> tuple[float, int]:
        return (self.opened_at, self.seq)


@dataclass(slots=True, frozen=True)
class Hold:
    """Fair-start: nodes freed by ``done`` stay occupied in the non-preemptive profile until ``until``.
    ``physical`` holds also keep the node IDs themselves (they were allocated); a pre-allocation's
    reservation is held only in the profile."""

    cluster: str
    begin: float
    until: float
    nodes: int
    physical: bool
    request: str
    # the applications that may re-select on the freed nodes and have not answered yet (the core takes each
    # out as it answers): the hold ends once none is left
    awaiting: set[str] = field(default_factory=set)
