"""The wire protocol: one pydantic model per message of DESIGN §3 (JSON over NATS).

Names follow the papers: ``subscribe`` is :class:`SessionOpen`, ``changeNotify`` :class:`ChangeNotify`,
``startNotify`` :class:`StartNotify`, CAPs are step functions sent as ``[[t, nodes], ...]`` (absolute
seconds; the last step lasts forever). Every request gets a reply: :class:`Ack` or :class:`ErrorReply`.
:func:`json_schemas` exports the JSON Schema of every model for launchers written in other languages.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from coorm.shared.events import (
    CapacityChanged,
    EndReason,
    EndRequest,
    ErrorCode,
    NodesAssigned,
    NodesFreed,
    PreemptionDeadline,
    SessionEnded,
    StartRequest,
)
from coorm.shared.jobids import JOB_ID_PATTERN
from coorm.shared.negotiation import MAX_NODES, Answer, NegotiationTerms
from coorm.shared.requests import MAX_BATCH, Identifier, RequestSpec

Steps = list[tuple[float, int]]
# a request's own id, chosen by its sender (random), for requests that must not be carried out twice
SENT_ID_PATTERN = r"^[A-Za-z0-9_-]{16,64}$"


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Filter(_Msg):
    """FILTER: which clusters an application can use, and which views it wants (an application that never
    asks for preemptible nodes -- a rigid or moldable one -- spares the RMS computing its preemptive view)."""

    clusters: list[Identifier] | None = None
    preemptive_views: bool = True
    # False: the application never reads its views (a rigid job: the RMS knows its need); it gets none, and
    # no node freed early is held for it to re-select (fair-start)
    views: bool = True
    min_nodes: int = Field(default=0, ge=0)
    min_cores_per_node: int = Field(default=0, ge=0)
    min_memory_mb_per_node: int = Field(default=0, ge=0)


class SessionOpen(_Msg):
    filter: Filter = Field(default_factory=Filter)
    name: str = Field(default="", max_length=128)
    kind: str = Field(default="", max_length=32)
    # True: the launcher reads its heartbeats' answers (HeartbeatAck) and beats at the interval they tell;
    # a launcher that says nothing keeps its opening's interval (it parses the plain Ack)
    paced: bool = False


class SessionSubjects(_Msg):
    request: str
    done: str
    close: str
    heartbeat: str
    change: str
    start: str
    kill: str


class SessionOpenReply(_Msg):
    app: Identifier
    token: str
    subjects: SessionSubjects
    heartbeat_interval: float
    # a session silent this long is reaped: a heartbeat waits for its answer a fraction of it, so that one
    # sent to a leader that just died is followed by another (to the next leader) in time
    session_timeout: float | None = None


class InfoQuery(_Msg):
    """``listClustersInfo`` / ``listInterClusterInfo`` take no argument: ``{}``."""


class ClusterInfo(_Msg):
    """CINFO."""

    id: Identifier
    nodes: int = Field(ge=0)
    cores_per_node: int = Field(ge=0)
    memory_mb_per_node: int = Field(ge=0)
    speed: float = Field(default=1.0, gt=0)


class ClustersInfoReply(_Msg):
    clusters: list[ClusterInfo]


class Link(_Msg):
    """ICINFO between two clusters."""

    a: Identifier
    b: Identifier
    latency_ms: float = Field(ge=0)
    bandwidth_mbps: float = Field(gt=0)


class InterClusterInfoReply(_Msg):
    links: list[Link]


class Authenticated(_Msg):
    # printable ASCII, bounded (the engine's tokens are 32 URL-safe characters): anything else cannot be a
    # session's, and comparing it in constant time (which takes ASCII strings only) would fail
    token: str = Field(min_length=1, max_length=256, pattern=r"^[!-~]+$")


class RequestMsg(Authenticated):
    """``request``; with ``replaces``, an atomic replace of waiting requests (``started``: refused, nothing
    changed)."""

    requests: list[RequestSpec] = Field(min_length=1, max_length=MAX_BATCH)
    replaces: list[Identifier] = Field(default_factory=list, max_length=MAX_BATCH)


class DoneMsg(Authenticated):
    request: Identifier
    released: list[Identifier] = Field(default_factory=list)


class CloseMsg(Authenticated):
    pass


class HeartbeatMsg(Authenticated):
    pass


_HEARTBEAT_HEAD, _HEARTBEAT_TAIL = b'{"token":"', b'"}'
_TOKEN_CHARS = bytes(c for c in range(0x21, 0x7F) if c not in b'"\\')  # printable ASCII, nothing to unescape


def heartbeat_token(data: bytes) -> bytes | None:
    """The token of a heartbeat as a client sends it -- ``{"token":"..."}``, nothing else --, read without
    parsing: a policy engine answers thousands a second. None for anything else, which
    :class:`HeartbeatMsg` then judges (it accepts all this accepts, and gives every refusal its code)."""
    if not (data.startswith(_HEARTBEAT_HEAD) and data.endswith(_HEARTBEAT_TAIL)):
        return None
    token = data[len(_HEARTBEAT_HEAD):-len(_HEARTBEAT_TAIL)]
    if not 0 < len(token) <= 256 or token.translate(None, _TOKEN_CHARS):
        return None
    return token


class NegotiateMsg(Authenticated):
    """Open (or revise) a negotiation: the adaptive-RMS paper's request with a negotiable size."""

    terms: NegotiationTerms


class OfferMsg(_Msg):
    """An offer of the RMS: ``nodes`` of ``cluster`` from ``start`` (absolute seconds; ``null``: nothing can
    be given as things stand), to be answered by ``deadline`` with ``offer``'s id. As the reply to a
    negotiation or a counter, ``offer`` is ``null`` when a standing negotiation has nothing to be given
    now (``waiting``): the offer comes later, as a notification (``unsolicited``). A notification with
    ``lapsed`` says the offer was not answered in time: its nodes are free again, its negotiation ended."""

    app: Identifier
    negotiation: Identifier
    offer: Identifier | None = None
    cluster: Identifier
    nodes: int = Field(default=0, ge=0, le=MAX_NODES)
    start: float | None = None
    deadline: float | None = None
    round: int = Field(default=0, ge=0)
    unsolicited: bool = False
    waiting: bool = False
    lapsed: bool = False


class RespondMsg(Authenticated):
    """The answer to an offer: ``accept`` (``nodes`` absent, or the offer's), ``counter`` (``nodes``: the
    size asked for instead, one the negotiation allows) or ``reject``."""

    offer: Identifier
    answer: Answer
    nodes: int | None = Field(default=None, ge=1, le=MAX_NODES)


class RespondReply(_Msg):
    """``request``: the request an accepted offer became (it starts as offered); ``offer``: the next
    round's offer after a counter."""

    ok: Literal[True] = True
    request: Identifier | None = None
    offer: OfferMsg | None = None


class Ack(_Msg):
    ok: Literal[True] = True
    requests: list[str] = Field(default_factory=list)


class HeartbeatAck(Ack):
    """A heartbeat's answer; to a paced session, the interval and the timeout it must follow from now on (the
    engine holds heartbeats to a rate: with many sessions, each beats less often)."""

    heartbeat_interval: float | None = Field(default=None, gt=0)
    session_timeout: float | None = Field(default=None, gt=0)


class ErrorBody(_Msg):
    code: ErrorCode
    message: str


class ErrorReply(_Msg):
    ok: Literal[False] = False
    error: ErrorBody


class ChangeType(StrEnum):
    INFO = "info"
    INTERINFO = "interinfo"
    NON_PREEMPTIVE = "non_preemptive"
    PREEMPTIVE = "preemptive"


class Change(_Msg):
    """CHANGE {CID, type, CAP}: for info changes the launcher pulls the info again; CAP is absent."""

    cluster: Identifier
    type: ChangeType
    cap: Steps | None = None


class ChangeNotify(_Msg):
    app: Identifier
    epoch: int = Field(ge=0)
    now: float
    changes: list[Change]


class StartNotify(_Msg):
    app: Identifier
    request: Identifier
    cluster: Identifier
    nodes: list[Identifier]
    kept: list[Identifier] = Field(default_factory=list)
    end: float | None = None


class KillNotify(_Msg):
    app: Identifier
    request: Identifier
    reason: EndReason
    nodes: list[Identifier] = Field(default_factory=list)


# a file a launch's output goes to: absolute, no NUL, at most PATH_MAX (4096) characters
OutputPath = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$")]


class LaunchMsg(Authenticated):
    app: Identifier
    request: Identifier
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    # the launcher's name for this launch: sent again (its first attempt timed out: the agent may have
    # started it), the agent answers with the pids it started then instead of starting it twice
    launch_id: Identifier | None = None
    # where the process's output goes instead of ``app_output`` (a batch job's ``-o``/``-e`` files): files the
    # agent's child opens *as the user* (after dropping root's rights: a user cannot make the agent write a
    # file the user may not write), created 0644 less the agent's umask. ``stderr`` None with ``stdout`` set:
    # the same file as ``stdout`` (as sbatch does); ``stdout`` None with ``stderr`` set: stdout is published,
    # stderr goes to the file; both None: both published. A stream that goes to a file publishes nothing (the
    # exit is published as ever). A file that cannot be opened refuses the launch (``bad_output``).
    stdout: OutputPath | None = None
    stderr: OutputPath | None = None
    # ``append`` (O_APPEND: the processes of a job appending to one file interleave whole writes safely) or
    # ``truncate`` (O_TRUNC at each process's start: the launcher's business to truncate once -- a job's
    # processes sharing one file would otherwise truncate what the earlier ones wrote; launch the first with
    # ``truncate`` and the others with ``append``, or give each its own file)
    open_mode: Literal["append", "truncate"] = "append"


class LaunchReply(_Msg):
    ok: Literal[True] = True
    pids: list[int]


class KillMsg(_Msg):
    """Kill the request's processes on the node (TERM, then KILL after ``grace``); the node no longer
    belongs to the request."""

    request: Identifier
    grace: float = Field(default=5.0, ge=0)
    reason: str = ""


class KillReply(_Msg):
    ok: Literal[True] = True
    killed: list[int] = Field(default_factory=list)


class NodeAssign(_Msg):
    """The node now belongs to ``request`` of ``app`` until ``end`` (wall-clock seconds; None: no end).
    Only a launch carrying the token whose SHA-256 is ``token_sha256`` may start processes on it. Processes
    the same application started under ``previous`` (a NEXT predecessor) go on under ``request``."""

    app: Identifier
    request: Identifier
    nodes: list[Identifier] = Field(min_length=1)
    token_sha256: str = Field(min_length=64, max_length=64)
    end: float | None = None
    previous: Identifier | None = None


class NodeInfo(_Msg):
    id: Identifier
    cores: int = Field(ge=1)
    memory_mb: int = Field(ge=1)


class AgentRegister(_Msg):
    agent: Identifier
    cluster: Identifier
    nodes: list[NodeInfo] = Field(min_length=1)


class AllocationsQuery(Authenticated):
    """What became of the application's started requests: asked by a launcher whose connection was cut
    (a nats-server restart), as notifications sent meanwhile are lost."""


class AllocationRecord(_Msg):
    """A request that started (its startNotify), and whether it ended since (its kill notification)."""

    request: Identifier
    cluster: Identifier
    nodes: list[Identifier] = Field(default_factory=list)
    kept: list[Identifier] = Field(default_factory=list)
    end: float | None = None
    ended: EndReason | None = None  # None: it still runs


class AllocationsReply(_Msg):
    ok: Literal[True] = True
    allocations: list[AllocationRecord] = Field(default_factory=list)


class AgentRegistered(_Msg):
    """The reply to a registration: the current assignment of each of the agent's nodes that has one (a
    restarted agent learns whom its nodes belong to; an agent that was cut off learns which allocations
    ended meanwhile). A node not listed belongs to no request: the agent kills what runs there."""

    ok: Literal[True] = True
    assignments: list[NodeAssign] = Field(default_factory=list)


class AgentHeartbeat(_Msg):
    agent: Identifier
    nodes: list[Identifier]
    processes: int = Field(ge=0)


class ProcessExited(_Msg):
    """``code``: the exit status, or minus the signal that ended it (as Python's ``returncode``); None when
    it is unknown (the process ended while no agent watched it: its agent had been killed)."""

    node: Identifier
    app: Identifier
    request: Identifier
    pid: int
    code: int | None
    killed: bool = False  # the agent killed it (told to, or the allocation's end passed)
    # why the agent killed it: the RMS's reason (``done``, ``next``, ``cancelled`` when the application
    # released the node; ``walltime``, ``node_failure``, ... when the RMS ended the request) or the agent's
    # own (:data:`AGENT_KILL_REASONS`); None when it was not killed
    reason: str | None = Field(default=None, max_length=64)


AGENT_KILL_REASONS = {
    "agent_stopping": "the node agent was stopped",
    "allocation_ended": "the allocation's end passed without word from the RMS",
    "reassigned": "the node was given to another request",
    "agent_restarted": "the node agent was restarted: what its predecessor ran was killed",
}
# kills that follow the application's own release of its nodes: no failure of its work
RELEASE_KILL_REASONS = frozenset({"done", "next", "cancelled"})


class ExitsQuery(Authenticated):
    """The application's processes that ended on the node lately (the agent keeps the last ones): asked by
    a launcher whose connection was cut, as exits published meanwhile are lost."""

    app: Identifier


class ExitsReply(_Msg):
    ok: Literal[True] = True
    exits: list[ProcessExited] = Field(default_factory=list)


class ProcessOutput(_Msg):
    node: Identifier
    request: Identifier
    pid: int
    stream: Literal["stdout", "stderr"]
    data: str


class LifecycleKind(StrEnum):
    SESSION_OPENED = "session_opened"
    SUBMITTED = "submitted"
    STARTED = "started"
    ENDED = "ended"
    PREEMPTION = "preemption"  # told to release preemptible nodes (a deadline)
    SESSION_ENDED = "session_ended"


class Lifecycle(_Msg):
    """One step of an allocation's (or a session's) life, published by the policy engine on the durable
    JetStream stream for accounting. ``at`` is wall-clock seconds; ``nodes`` the request's size; for
    ``ended``, ``started_at`` and ``reason`` (an :class:`EndReason` value); for ``preemption`` the number of
    nodes the application may keep (``allowed``) and its ``deadline``."""

    kind: LifecycleKind
    at: float
    app: Identifier
    user: str = ""
    app_kind: str = ""
    request: Identifier | None = None
    type: str | None = None
    cluster: Identifier | None = None
    nodes: int = 0
    submitted_at: float | None = None
    started_at: float | None = None
    reason: str | None = None
    allowed: int | None = None
    deadline: float | None = None


class SystemStopping(_Msg):
    """The RMS is stopping as a whole (not one service restarting): sessions end, their processes are
    killed. Sent once to every launcher, before the servers go."""

    reason: str = Field(max_length=1000)


class DeadLetter(_Msg):
    """A stream message its consumer could not process -- not a valid message, or failing every one of its
    deliveries -- set aside on ``deadletter.<stream>`` and never delivered again (a poison message must not
    hold a consumer for ever). The message itself stays in its stream at ``sequence`` until the stream's
    max_age; ``data`` is its beginning, as text."""

    stream: str
    consumer: str
    sequence: int = Field(ge=0)  # the message's sequence in the stream
    subject: str
    deliveries: int = Field(ge=1)  # how many times it was delivered, the last included
    error: str
    size: int = Field(ge=0)  # the message's length in bytes
    data: str  # its first bytes (64 KiB), as UTF-8 with undecodable bytes replaced


# -- between services --------------------------------------------------------------------------------
class AppViews(_Msg):
    """One application's views on one cluster."""

    non_preemptive: Steps
    preemptive: Steps | None = None  # None: the application did not ask for preemptive views


class ViewsEpoch(_Msg):
    """policy engine -> view publisher, after a pass: the views of the applications whose views changed
    (all of them when ``full``), and the applications that left. A view many applications see (a thousand
    idle launchers see the same non-preemptive view) goes once, in ``shared``, and each of them names it in
    ``refs``; an application's own views are in ``views``. (A view publisher that knows ``shared`` reads
    both forms: upgrade it before the policy engine.)"""

    epoch: int = Field(ge=0)
    now: float
    views: dict[str, dict[str, AppViews]] = Field(default_factory=dict)
    shared: dict[str, AppViews] = Field(default_factory=dict)
    refs: dict[str, dict[str, str]] = Field(default_factory=dict)

    def app_views(self) -> dict[str, dict[str, AppViews]]:
        """Every application's views, ``refs`` resolved (a shared view is one object for all who see it)."""
        out = {app: dict(per) for app, per in self.views.items()}
        for app, per in self.refs.items():
            mine = out.setdefault(app, {})
            for cluster, key in per.items():
                views = self.shared.get(key)
                if views is not None:  # (a key the sender did not fill names nothing: that cluster is left out)
                    mine[cluster] = views
        return out
    closed: list[str] = Field(default_factory=list)
    full: bool = False
    more: bool = False  # (a reply to a ViewsQuery) there are applications after this page


AllocatorDecision = Annotated[
    StartRequest | EndRequest | NodesAssigned | NodesFreed | CapacityChanged | SessionEnded | PreemptionDeadline,
    Field(discriminator="kind"),
]


class AllocatorDecisions(_Msg):
    """policy engine -> node allocator, on the durable stream ``subjects.DECISIONS``: what the node side acts
    on after one event, in the order the cores decided it (one message per event, not per decision: each
    message costs a store, an acknowledgement and a delivery)."""

    decisions: list[AllocatorDecision] = Field(min_length=1)


class ViewsQuery(_Msg):
    """view publisher -> policy engine: every current view (after a restart), a page of applications at a
    time (``offset`` in the engine's order of applications; the reply's ``more`` says whether to go on):
    a reply must fit in one message."""

    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=500, ge=1, le=5000)


class NodesEvent(_Msg):
    """node allocator -> policy engine: an agent's nodes came up (``register``) or went down; an operator
    (``coorm node drain``, with the services' identity) drains nodes or resumes them."""

    kind: Literal["register", "down", "drain", "resume"]
    cluster: Identifier
    nodes: list[Identifier] = Field(min_length=1)
    reason: str = Field(default="", max_length=256)


# -- queries (coorm status, apps, requests, estimate) --------------------------------------------------
class StatusQuery(_Msg):
    """What the policy engine knows now (``coorm status`` and friends). Applications and requests come a
    page at a time (the same ``offset`` and ``limit`` for both lists, each in a fixed order), so that a
    reply fits in one message whatever their number; the totals come with every page."""

    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=1000, ge=0, le=5000)
    # only these applications' (and their requests'): the batch queue asks for its queued jobs' start times
    apps: list[Identifier] | None = Field(default=None, max_length=5000)


class ClusterStatus(_Msg):
    """A partition of the cluster's up nodes (the counts add up to ``up``)."""

    cluster: Identifier
    up: int
    non_preemptible: int  # nodes running non-preemptible requests
    pre_allocated_unused: int  # idle nodes that started pre-allocations keep for their application
    preemptible: int  # nodes held by preemptible requests (on pre-allocated nodes too)
    held: int  # fair-start holds
    idle: int  # free for anyone


class AppStatus(_Msg):
    app: Identifier
    user: str
    name: str
    kind: str
    opened: float
    waiting: int
    running: int
    nodes: int  # node IDs it holds now


class RequestStatus(_Msg):
    app: Identifier
    request: Identifier
    type: str
    cluster: Identifier | None  # None: left to the RMS (``placement``), which has not chosen it yet
    nodes: int
    state: str  # waiting | started
    submitted: float
    start: float | None  # scheduled (waiting; None: never, it is bigger than the platform) or actual
    end: float | None  # planned end (None: unbounded)
    related_to: str | None = None
    related_how: str = "FREE"
    blocked: bool = False
    node_ids: list[str] = Field(default_factory=list)
    placement: str | None = None  # the rule the RMS chose (or chooses) its cluster by


class StatusReply(_Msg):
    now: float
    epoch: int
    leader: str
    clusters: list[ClusterStatus]
    apps: list[AppStatus]
    requests: list[RequestStatus]
    # over every page
    total_apps: int = 0
    total_requests: int = 0
    waiting: int = 0
    running: int = 0


# -- the batch queue (coorm batch, submit --no-wait, cancel, hold, release, queue, history) ------------
# the batch queue's JobState values (services.batch.core; a test checks they agree)
BatchState = Literal["held", "blocked", "eligible", "queued", "running", "completed", "failed", "timeout",
                     "cancelled", "node_fail"]
_PATH = Field(default=None, min_length=1, max_length=4096, pattern=r"^[^\x00]+$")


class BatchSubmit(_Msg):
    """``sbatch``: a job, or an array of jobs, for the batch queue. The batch service runs it as its user
    (the subject names the user) once its dependencies allow; the RMS decides when it starts. The job runs
    ``argv`` -- or ``script``, when given, with ``argv`` as its arguments -- on every node it gets."""

    argv: list[Annotated[str, Field(max_length=65536)]] = Field(default_factory=list, max_length=4096)
    script: str | None = Field(default=None, min_length=2, max_length=100_000)  # "#!...": its text, copied now
    # sbatch --wrap: a command line /bin/sh runs on the job's first node (``argv``: its $1...), no script file
    wrap: str | None = Field(default=None, min_length=1, max_length=100_000)
    nodes: int = Field(default=1, ge=1, le=1_000_000)
    walltime: float = Field(gt=0, le=366 * 86400)
    cluster: Identifier | None = None  # None: the first cluster by name
    name: str = Field(default="", max_length=128, pattern=r"^[^\x00-\x1f]*$")
    output: str | None = _PATH  # Slurm's patterns (%j %A %a %u %x); relative to ``cwd``
    error: str | None = _PATH  # None: with the output
    open_mode: Literal["append", "truncate"] = "append"
    array: str | None = Field(default=None, min_length=1, max_length=4096)  # "0-999%50"
    dependency: str | None = Field(default=None, min_length=1, max_length=4096)  # "afterok:12,singleton"
    hold: bool = False
    env: dict[Annotated[str, Field(max_length=1024)], Annotated[str, Field(max_length=131072)]] = \
        Field(default_factory=dict, max_length=4096)
    cwd: str = Field(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$")
    # srun's way (``coorm submit``): the job's output and its end go to this subject of the submitter's own
    # inbox (``_INBOX.u.<user>.``) as :class:`BatchAttached` events, instead of files; the job is cancelled
    # when nothing listens there any more (the command was killed)
    attach: str | None = Field(default=None, max_length=256, pattern=r"^_INBOX\.u\.[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$")
    # the submitter's own id for this submission (random): sent again -- its reply lost or late, the service
    # stopped or moving -- it is answered with the job it made, not a second one (ids kept for 10 minutes)
    submission: str | None = Field(default=None, pattern=SENT_ID_PATTERN)


class BatchAttached(_Msg):
    """What an attached job (``BatchSubmit.attach``) tells its command, in this order: ``started`` (its
    nodes), ``output`` (a process's text, as it comes), ``ended`` (the last: its state, exit code -- as
    ``coorm submit`` exits -- and why)."""

    job: str
    event: Literal["started", "output", "ended"]
    nodes: list[str] = Field(default_factory=list)  # started
    node: str | None = None  # output
    stream: Literal["stdout", "stderr"] | None = None  # output
    data: str = ""  # output
    state: BatchState | None = None  # ended
    exit_code: int | None = None  # ended
    reason: str = ""  # ended


class BatchSubmitReply(_Msg):
    job: str  # the job's id, or the array's
    tasks: int = 1


class BatchControl(_Msg):
    """``scancel``, ``scontrol hold/release``: the user's own jobs that ``jobs`` name (a job, an array's task
    ``12_3``, a whole array ``12``), or, with no ``jobs``, all of the user's jobs that match ``name`` and
    ``states`` (at least one of the three)."""

    jobs: list[Annotated[str, Field(pattern=JOB_ID_PATTERN)]] = Field(default_factory=list,
                                                                                     max_length=100_000)
    name: str | None = Field(default=None, max_length=128)
    states: list[BatchState] | None = None
    # the sender's own id for this command (random): sent again -- its reply lost or late -- it is answered as
    # the first was, not carried out twice (a cancel that took effect would say "already ended")
    command: str | None = Field(default=None, pattern=SENT_ID_PATTERN)


class BatchControlReply(_Msg):
    ok: Literal[True] = True
    jobs: list[str]  # the jobs it changed
    unchanged: list[str] = Field(default_factory=list)  # named, but in a state it does not apply to


class BatchQuery(_Msg):
    """``squeue`` (``ended``: False) or ``sacct`` (``ended``: True, since ``since``)."""

    user: str | None = Field(default=None, max_length=64)
    states: list[BatchState] | None = None
    jobs: list[Annotated[str, Field(pattern=JOB_ID_PATTERN)]] | None = Field(default=None,
                                                                                            max_length=10_000)
    ended: bool = False
    since: float | None = None
    # a page at a time (one reply must fit in a NATS message): the jobs ``offset`` to ``offset + limit``
    offset: int = Field(default=0, ge=0)
    limit: int = Field(default=1000, ge=1, le=2000)


class BatchJob(_Msg):
    id: str
    user: str
    name: str
    state: BatchState
    reason: str = ""
    cluster: str
    nodes: int
    walltime: float
    submitted: float
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    start_estimate: float | None = None  # queued: when the RMS plans its start now
    app: str | None = None  # its session, once in the RMS
    node_ids: list[str] = Field(default_factory=list)
    array_id: str | None = None
    task: int | None = None
    command: str = ""
    cwd: str = ""
    output: str = ""
    error: str = ""
    dependency: str | None = None


class BatchQueryReply(_Msg):
    now: float
    jobs: list[BatchJob]
    total: int


WIRE_MODELS: tuple[type[BaseModel], ...] = (
    SessionOpen, InfoQuery, SessionOpenReply, ClustersInfoReply, InterClusterInfoReply, RequestMsg, DoneMsg, CloseMsg,
    HeartbeatMsg, Ack, HeartbeatAck, ErrorReply, ChangeNotify, StartNotify, KillNotify, LaunchMsg, LaunchReply, KillMsg,
    KillReply, NodeAssign, AgentRegister, AgentRegistered, AgentHeartbeat, ProcessExited, ProcessOutput, Lifecycle,
    ViewsEpoch, ViewsQuery, NodesEvent, StatusQuery, StatusReply, AllocatorDecisions, DeadLetter,
    SystemStopping, AllocationsQuery, AllocationsReply, ExitsQuery, ExitsReply, BatchSubmit, BatchSubmitReply,
    BatchControl, BatchControlReply, BatchQuery, BatchQueryReply, BatchAttached, NegotiateMsg, OfferMsg,
    RespondMsg, RespondReply,
)


def json_schemas() -> dict[str, dict[str, object]]:
    return {m.__name__: m.model_json_schema() for m in WIRE_MODELS}
