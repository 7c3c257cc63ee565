"""Events into the cores and decisions out of them: the contract of the sans-IO policy core.

Every event carries the time it happened (``at``, seconds) and a ``stimulus_id``; every decision names the
stimulus that caused it, so that a request's story can be told. The live services and the simulator
construct exactly these objects; there is no other way to change a core's state.

Infinite times (a request that can never start, an unbounded duration) are ``math.inf`` inside the
cores and ``None`` on the wire.
"""

from __future__ import annotations

import itertools
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from coorm.shared.negotiation import MAX_NODES, Answer, NegotiationTerms
from coorm.shared.requests import MAX_BATCH, Identifier, RequestSpec, RequestType

_counter = itertools.count()


def _next_stimulus() -> str:
    return f"s{next(_counter)}"


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float = Field(ge=0, allow_inf_nan=False)
    stimulus_id: str = Field(default_factory=_next_stimulus)


class OpenSession(_Event):
    """``subscribe``: an application connects; the opening time is its priority."""

    kind: Literal["open"] = "open"
    app: Identifier
    user: str = ""
    name: str = ""
    app_kind: str = ""
    adapts: bool = True  # it reads its views and may re-select (False: a rigid job, which gets no views)


class CloseSession(_Event):
    """The application leaves: its waiting requests are cancelled, its running ones ended."""

    kind: Literal["close"] = "close"
    app: Identifier
    reason: str = "closed"


class Submit(_Event):
    """``request``: add requests (one batch, accepted or refused as a whole). ``replaces``: waiting requests of
    the application this batch replaces -- cancelled in the same step as the batch is accepted, so that no pass
    runs between the two (none of them can start after it); if one of them has started (or ended, or is not
    the application's), the whole submission is refused and nothing changes."""

    kind: Literal["submit"] = "submit"
    app: Identifier
    requests: list[RequestSpec] = Field(min_length=1)
    replaces: tuple[Identifier, ...] = Field(default=(), max_length=MAX_BATCH)


class Done(_Event):
    """``done``: end a running request now (releasing ``released`` node IDs when a NEXT successor
    keeps the rest) or cancel one not yet started."""

    kind: Literal["done"] = "done"
    app: Identifier
    request: Identifier
    released: tuple[str, ...] = ()


class NodesChanged(_Event):
    """A cluster's number of up nodes changed (registration, node failure, repair). ``lost_requests`` are
    the started requests that held a node that went down (the allocator knows which)."""

    kind: Literal["nodes"] = "nodes"
    cluster: Identifier
    up: int = Field(ge=0)
    lost_requests: tuple[str, ...] = ()
    lost_held: int = Field(default=0, ge=0)  # nodes held for fair-start that went down


class Tick(_Event):
    """Time passes: the shell calls back at the time the core asked for."""

    kind: Literal["tick"] = "tick"


class Negotiate(_Event):
    """The adaptive-RMS paper's negotiation opened (or revised) by the application: a request ``negotiation``
    (its id once an offer is accepted) of ``type`` on ``cluster`` whose size may be anything from
    ``min_nodes`` to ``max_nodes`` that ``sizes`` allows (none: any). The RMS answers with an offer, each
    to be answered within ``respond_within`` seconds. ``standing``: if nothing can be given now, the RMS
    offers when nodes free up, instead of offering a later start (:mod:`coorm.shared.negotiation`)."""

    kind: Literal["negotiate"] = "negotiate"
    app: Identifier
    terms: NegotiationTerms


class Respond(_Event):
    """The application's answer to an offer: ``accept`` (the offer becomes its request), ``counter`` with
    ``nodes`` (a new round: the RMS offers again, at most that), or ``reject`` (the negotiation ends)."""

    kind: Literal["respond"] = "respond"
    app: Identifier
    offer: Identifier
    answer: Answer
    nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)


PolicyEvent = Annotated[
    OpenSession | CloseSession | Submit | Done | NodesChanged | Tick | Negotiate | Respond,
    Field(discriminator="kind")
]


# ------------------------------------------------------------------------------------------------
# decisions
# ------------------------------------------------------------------------------------------------
class ErrorCode(StrEnum):
    BAD_REQUEST = "bad_request"
    UNKNOWN_APP = "unknown_app"
    UNKNOWN_CLUSTER = "unknown_cluster"
    UNKNOWN_REQUEST = "unknown_request"
    NOT_YOURS = "not_yours"
    DUPLICATE = "duplicate"
    BAD_RELATION = "bad_relation"
    BAD_RELEASE = "bad_release"
    ENDED = "ended"
    BAD_MESSAGE = "bad_message"  # not JSON, or not the subject's message (wrong fields or types)
    BAD_TOKEN = "bad_token"  # the session token does not match the application
    NOT_OWNER = "not_owner"  # a launch on a node the application's request does not hold now
    UNAVAILABLE = "unavailable"  # the service cannot take it now (no leader yet): retry
    COMMAND_NOT_FOUND = "command_not_found"  # a launch's argv[0] does not exist (a shell's 127)
    NOT_EXECUTABLE = "not_executable"  # a launch's argv[0] exists but cannot be executed (a shell's 126)
    UNKNOWN_USER = "unknown_user"  # a launch for a user the node does not know
    FORBIDDEN = "forbidden"  # not this user's to do (another user's processes, a variable the operator denies)
    BAD_CWD = "bad_cwd"  # a launch's working directory is missing, or the user cannot enter it
    BAD_OUTPUT = "bad_output"  # a launch's output file cannot be opened by the user (permissions, no directory)
    UNKNOWN_JOB = "unknown_job"  # the batch queue has no such job (or it ended long ago)
    TOO_LARGE = "too_large"  # more nodes than the cluster has, up or down: it could never start
    UNKNOWN_OFFER = "unknown_offer"  # no such offer (never made, or answered already)
    OFFER_LAPSED = "offer_lapsed"  # the offer's deadline passed before the answer came: its nodes are free again
    BAD_COUNTER = "bad_counter"  # a counter-offer outside the negotiation's range or sizes
    STARTED = "started"  # a request a submission replaces has started: nothing was changed, it runs


class EndReason(StrEnum):
    DONE = "done"
    CANCELLED = "cancelled"  # done before it started
    WALLTIME = "walltime"
    NEXT = "next"  # reached its end and its NEXT successor took its nodes over
    NODE_FAILURE = "node_failure"
    VIOLATION = "violation"  # kept preemptible nodes past the grace
    SESSION_CLOSED = "session_closed"
    CONTAINER_ENDED = "container_ended"  # its pre-allocation ended under it


class _Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stimulus_id: str


class Accepted(_Decision):
    kind: Literal["accepted"] = "accepted"
    app: str
    requests: tuple[str, ...] = ()


class Rejected(_Decision):
    kind: Literal["rejected"] = "rejected"
    code: ErrorCode
    reason: str


class StartRequest(_Decision):
    """Start ``request`` now on ``nodes`` nodes of ``cluster``. With ``carry_from``, the allocator keeps
    ``carried`` nodes of that (NEXT) predecessor and adds the rest."""

    kind: Literal["start"] = "start"
    app: str
    request: str
    type: RequestType
    cluster: str
    nodes: int
    at: float
    end: float | None
    carry_from: str | None = None
    carried: int = 0


class EndRequest(_Decision):
    """``request`` ended at ``at``. Its freed nodes (other than those carried to ``successor``) stay held
    for fair-start until ``hold_until`` when ``hold_nodes`` > 0. ``released`` are the node IDs the
    application named in its ``done``."""

    kind: Literal["end"] = "end"
    app: str
    request: str
    type: RequestType
    cluster: str
    nodes: int
    started: bool
    reason: EndReason
    at: float
    started_at: float | None = None  # when it started (None: it never did)
    successor: str | None = None
    carried: int = 0  # nodes the successor keeps; the others are freed now
    released: tuple[str, ...] = ()
    hold_nodes: int = 0
    hold_until: float | None = None


class SessionEnded(_Decision):
    kind: Literal["session_ended"] = "session_ended"
    app: str
    reason: str


class PreemptionDeadline(_Decision):
    """``app`` holds more preemptible nodes of ``cluster`` than its preemptive view allows: it must
    release down to ``allowed`` by ``deadline`` or be killed."""

    kind: Literal["preempt"] = "preempt"
    app: str
    cluster: str
    held: int
    allowed: int
    deadline: float


class ViewsChanged(_Decision):
    kind: Literal["views"] = "views"
    apps: tuple[str, ...]


class PassDone(_Decision):
    kind: Literal["pass"] = "pass"
    epoch: int
    at: float
    waiting: int
    running: int
    next_wakeup: float | None


class HoldReleased(_Decision):
    """A fair-start hold ended before its time (every application it waited for answered): the nodes
    ``request``'s end left held are free now."""

    kind: Literal["hold_released"] = "hold_released"
    request: str
    cluster: str


class Offered(_Decision):
    """An offer of the RMS in a negotiation: ``nodes`` of ``cluster`` from ``start`` (``None``: nothing can
    be given as things stand), to be answered by ``deadline``. An offer starting at the time it is made
    sets its nodes aside until its deadline; a later one reserves nothing (accepted, its request is placed
    by the backfilling like any other). ``unsolicited``: made in a pass for a standing negotiation, not
    as the answer to a command."""

    kind: Literal["offer"] = "offer"
    app: str
    negotiation: str
    offer: str
    cluster: str
    nodes: int
    start: float | None
    deadline: float
    round: int
    unsolicited: bool = False


class OfferLapsed(_Decision):
    """An offer was not answered by its deadline: its nodes are free again and its negotiation ended."""

    kind: Literal["offer_lapsed"] = "offer_lapsed"
    app: str
    negotiation: str
    offer: str
    cluster: str


PolicyDecision = (
    Accepted
    | Offered
    | OfferLapsed
    | Rejected
    | StartRequest
    | EndRequest
    | SessionEnded
    | PreemptionDeadline
    | ViewsChanged
    | PassDone
    | HoldReleased
)


# ------------------------------------------------------------------------------------------------
# node allocator
# ------------------------------------------------------------------------------------------------
class RegisterNodes(_Event):
    """An agent brings ``nodes`` of ``cluster`` up (first registration or return)."""

    kind: Literal["register"] = "register"
    cluster: Identifier
    nodes: tuple[Identifier, ...] = Field(min_length=1)


class NodeDown(_Event):
    """A node failed or its agent went silent."""

    kind: Literal["node_down"] = "node_down"
    node: Identifier


class NodeDrain(_Event):
    """An operator drains a node (``drain``: running work finishes, nothing new starts on it) or resumes it."""

    kind: Literal["node_drain"] = "node_drain"
    node: Identifier
    drain: bool = True
    reason: str = Field(default="", max_length=256)


class NodesAssigned(_Decision):
    """``startNotify``: ``request`` may use ``nodes``; ``kept`` of them come from its NEXT predecessor."""

    kind: Literal["assigned"] = "assigned"
    app: str
    request: str
    cluster: str
    nodes: tuple[str, ...]
    kept: tuple[str, ...] = ()


class NodesFreed(_Decision):
    """``request`` no longer owns ``nodes``: their processes must be killed. ``held`` of them stay out of
    the free pool until ``held_until`` (fair-start)."""

    kind: Literal["freed"] = "freed"
    app: str
    request: str
    cluster: str
    nodes: tuple[str, ...]
    reason: str
    held: tuple[str, ...] = ()
    held_until: float | None = None


class CapacityChanged(_Decision):
    """Feed to the policy core as :class:`NodesChanged`."""

    kind: Literal["capacity"] = "capacity"
    cluster: str
    up: int
    lost_requests: tuple[str, ...] = ()
    lost_held: int = 0

    def as_event(self, at: float) -> NodesChanged:
        return NodesChanged(
            at=at, stimulus_id=self.stimulus_id, cluster=self.cluster, up=self.up,
            lost_requests=self.lost_requests, lost_held=self.lost_held,
        )


# what the allocator core takes and gives, and what the coupled cores give
AllocatorEvent = StartRequest | EndRequest | HoldReleased | RegisterNodes | NodeDown | NodeDrain | Tick
AllocatorOutput = NodesAssigned | NodesFreed | CapacityChanged
Decision = PolicyDecision | AllocatorOutput
