"""Every endpoint of the wire protocol, as data: one :class:`Endpoint` per NATS subject pattern of
:mod:`coorm.shared.subjects` (DESIGN §3). ``docs/protocol.md`` is rendered from this table
(:mod:`coorm.shared.protocol_doc`, ``coorm protocol doc``), and the tests hold the table to the code: every
subject of ``subjects.py`` has an entry, every example validates against its model, and the NATS users
that :mod:`coorm.shared.credentials` generates grant each identity what :func:`permissions` derives from the
table and nothing else (besides the grants :data:`BROADER_THAN_NEEDED` records).

Rules of the table
* Subjects are built by the functions and constants of ``subjects.py``, with placeholder tokens
  (:data:`USER`, :data:`APP`, :data:`NODE`, :data:`REQUEST`) where an id goes: a subject is defined there,
  once.
* ``publishers`` and ``subscribers`` are roles (the identities of :mod:`coorm.shared.credentials`), and say what
  the code does, not what the configuration happens to allow. For a JetStream stream, ``subscribers`` are
  the roles that consume it (through the JetStream API, not by subscribing to the subject).
* ``errors`` are the codes the subject's handler can answer with, read from the handlers
  (``services/*/service.py``, the policy core's ``CommandError``s, ``node_agent/agent.py`` and
  ``node_agent/state.py``); ``bus.serve`` adds ``bad_message`` (undecodable), ``bad_request`` (an id in the
  subject that is not one, a value refused by a model the handler builds) and ``unavailable`` (the handler
  failed) to every request/reply subject it serves.
* A pure data module: no NATS, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel

from coorm.shared import subjects
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import (
    Ack,
    AgentHeartbeat,
    AgentRegister,
    AgentRegistered,
    AllocationsQuery,
    AllocationsReply,
    AllocatorDecisions,
    BatchControl,
    BatchControlReply,
    BatchQuery,
    BatchQueryReply,
    BatchSubmit,
    BatchSubmitReply,
    ChangeNotify,
    CloseMsg,
    ClustersInfoReply,
    DeadLetter,
    DoneMsg,
    ExitsQuery,
    ExitsReply,
    HeartbeatAck,
    HeartbeatMsg,
    InfoQuery,
    InterClusterInfoReply,
    KillMsg,
    KillNotify,
    KillReply,
    LaunchMsg,
    LaunchReply,
    Lifecycle,
    NegotiateMsg,
    NodeAssign,
    NodesEvent,
    OfferMsg,
    ProcessExited,
    ProcessOutput,
    RequestMsg,
    RespondMsg,
    RespondReply,
    SessionOpen,
    SessionOpenReply,
    StartNotify,
    StatusQuery,
    StatusReply,
    SystemStopping,
    ViewsEpoch,
    ViewsQuery,
)

# placeholder tokens: where an id goes in a subject pattern
USER = "<user>"
APP = f"{USER}.<app>"  # an application id is two tokens: its user's name and the engine's a<N>
NODE = "<node>"
REQUEST = "<request>"
STREAM = "<stream>"
# how each placeholder reads as a NATS wildcard: a user name, the engine's a<N> and a node id are one token
# each (a node id with a dot would not match the agents' permissions), a request id may hold dots
# (``Identifier`` allows them) and comes last, so it takes the rest of the subject; a stream's name is one
# token. In a user's own permissions the user placeholder is that user's name (:func:`permissions`).
WILDCARDS: Mapping[str, str] = {USER: "*", "<app>": "*", NODE: "*", REQUEST: ">", STREAM: "*"}

# where each connection gets its replies (and JetStream its deliveries): its own prefix (subjects.inbox_*)
INBOXES: Mapping[str, str] = {"service": subjects.INBOX_SERVICE + ".>", "agent": subjects.INBOX_AGENT + ".>"}
JETSTREAM = "$JS.>"  # the JetStream API, acknowledgements and flow control
# where a responder may publish its replies besides allow_responses: nats-server forgets the replies a
# responder owes whenever it reloads its users (``coorm user add``), so a request in flight across a reload
# would never be answered under allow_responses alone
REPLIES = "_INBOX.>"


class Role(StrEnum):
    """Who a NATS connection is (:mod:`coorm.shared.credentials` issues an identity per role; a launcher's
    is a user's own)."""

    SERVICE = "service"  # policy engine, view publisher, node allocator, accounting
    AGENT = "agent"  # node agents
    LAUNCHER = "launcher"  # a user's programs: the SDK and the command line (coorm submit, launch, status...)


class Kind(StrEnum):
    REQUEST = "request/reply"  # the reply is the subject's reply model or an ErrorReply, never silence
    PUBLISH = "publish"  # no reply
    NOTIFICATION = "notification"  # RMS -> launcher, no reply
    STREAM = "JetStream stream"  # published to a durable stream, consumed through a durable consumer


class Part(StrEnum):
    """The protocol document's parts, in order."""

    LAUNCHER = "Launcher to RMS"
    NOTIFY = "RMS to launcher: notifications"
    NODES = "Launcher and allocator to node agents"
    PROCESSES = "Node agents to launcher: output and exits"
    AGENTS = "Node agents to RMS"
    INTERNAL = "Between services"
    STREAMS = "JetStream streams"


Json = Mapping[str, object]


@dataclass(frozen=True, eq=False)
class Endpoint:
    subject: str  # the pattern, with placeholders
    names: tuple[str, ...]  # the names in subjects.py that build it (its wildcard forms included)
    part: Part
    kind: Kind
    request: type[BaseModel] | None  # None: the body is ``{}`` and is not read
    reply: type[BaseModel] | None
    publishers: tuple[Role, ...]
    subscribers: tuple[Role, ...]
    sent_by: str  # the programs that publish, in words
    served_by: str  # the programs that subscribe (or consume), in words
    errors: tuple[ErrorCode, ...]
    description: str
    example: Json
    reply_example: Json | None = None
    paper: str = ""  # the message's name in the CooRM papers
    subscribe_as: str | None = None  # the pattern subscribers subscribe to, when it is not the subject
    stream: str = ""  # JetStream: the stream that captures the subject
    consumer: str = ""  # JetStream: the durable consumer that reads it

    @property
    def short(self) -> str:
        """The subject without the version prefix (a section's title)."""
        return self.subject.removeprefix(subjects.PREFIX + ".")

    @property
    def pattern(self) -> str:
        """The subject as a NATS wildcard pattern (what a permission names)."""
        return nats_pattern(self.subject)

    @property
    def subscription(self) -> str:
        """The NATS pattern its subscribers subscribe to."""
        return nats_pattern(self.subscribe_as or self.subject)


def nats_pattern(subject: str, user: str | None = None) -> str:
    """The subject as a NATS pattern: each placeholder a wildcard, the user's own name for ``<user>`` when
    ``user`` is given."""
    own = {**WILDCARDS, USER: user} if user is not None else WILDCARDS
    return ".".join(own.get(token, token) for token in subject.split("."))


# the codes every request/reply subject served through bus.serve (or the node agent's loop) can answer
_SERVED = (ErrorCode.BAD_MESSAGE, ErrorCode.UNAVAILABLE)
# bus.serve also refuses an id in a wildcard subject that is not one (``app.>.views``), and a value the models
# the handler builds from what it was sent refuse
_BUS = (*_SERVED, ErrorCode.BAD_REQUEST)
# a launcher's session check (PolicyEngine._check) on every token-carrying subject
_SESSION = (ErrorCode.UNKNOWN_APP, ErrorCode.BAD_TOKEN)

_TOKEN = "kq3XbN0cY1vH8mWfR2pLzT6sJ4aEdG7u"  # an example session token (the engine draws 24 random bytes)
_SHA = "9f2c4e1a7b3d5f60819a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70"  # an example SHA-256, hex
_T0 = 1767225600.0
_LAUNCHERS = "launchers (the SDK, the command line, the batch service for its users' jobs)"
# what a launcher does, the batch service does for the users' batch jobs: it holds the services' identity
_AS_LAUNCHER = (Role.LAUNCHER, Role.SERVICE)

ENDPOINTS: tuple[Endpoint, ...] = (
    # -- launcher -> RMS ----------------------------------------------------------------------------------
    Endpoint(
        subject=subjects.session_open(USER), names=("session_open", "SESSION_OPEN_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST,
        request=SessionOpen, reply=SessionOpenReply, publishers=_AS_LAUNCHER, subscribers=(Role.SERVICE,),
        sent_by=_LAUNCHERS, served_by="policy engine (the leader)", paper="subscribe",
        # DUPLICATE: the core refuses an application id it already has (only if the id counter in Redis were
        # lost while the engine's state was not)
        errors=(*_BUS, ErrorCode.DUPLICATE),
        description=(
            "Open a session. The subject names the user (only that user may publish to it: the NATS "
            "permissions of :mod:`coorm.shared.credentials`), which the policy engine records for status and "
            "accounting; the filter names the clusters the application may use and whether it wants "
            "preemptive views; ``name`` and ``kind`` are recorded too. The reply gives the application id "
            "(``<user>.a<N>``), the session token that every later request of the session carries, the "
            "session's own subjects, and how often the launcher must send a heartbeat. The opening time is "
            "the application's priority. Answered \"no responders\" after 1, 2, 4, 8... attempts, the SDK "
            "asks the policy engine's status (``QUERY_STATUS``) through each other server of its URL list over "
            "a connection of its own, and moves to one where it is answered: its own server may be cut from "
            "the cluster."),
        example={"filter": {"clusters": ["c0"], "preemptive_views": False}, "name": "sim-42", "kind": "rigid"},
        reply_example={"app": "alice.a7", "token": _TOKEN, "heartbeat_interval": 5.0, "subjects": {
            "request": subjects.app_request("alice.a7"), "done": subjects.app_done("alice.a7"),
            "close": subjects.app_close("alice.a7"), "heartbeat": subjects.app_heartbeat("alice.a7"),
            "change": subjects.notify_change("alice.a7"), "start": subjects.notify_start("alice.a7"),
            "kill": subjects.notify_kill("alice.a7")}},
    ),
    Endpoint(
        subject=subjects.app_views(APP), names=("app_views", "APP_VIEWS_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=InfoQuery, reply=ChangeNotify, publishers=_AS_LAUNCHER,
        subscribers=(Role.SERVICE,), sent_by=_LAUNCHERS, served_by="view publisher", errors=_BUS,
        description=(
            "Every current view of the application, as one ``changeNotify`` (the same message the "
            "notification subject carries). A launcher asks once it has subscribed to its notifications, "
            "because the first ``changeNotify`` may have gone out before it listened. The view publisher "
            "then sends only changes again. The body is ``{}``: only the application's user may ask (the "
            "subject names the user)."),
        example={},
        reply_example={"app": "alice.a7", "epoch": 12, "now": _T0, "changes": [
            {"cluster": "c0", "type": "non_preemptive", "cap": [[_T0, 16], [_T0 + 600, 64]]}]},
    ),
    Endpoint(
        subject=subjects.app_allocations(APP), names=("app_allocations", "APP_ALLOCATIONS_ANY"),
        part=Part.LAUNCHER, kind=Kind.REQUEST, request=AllocationsQuery, reply=AllocationsReply,
        publishers=_AS_LAUNCHER, subscribers=(Role.SERVICE,), sent_by=_LAUNCHERS, served_by="node allocator",
        errors=(*_BUS, ErrorCode.UNKNOWN_APP, ErrorCode.BAD_TOKEN),
        description=(
            "Every request of the application that started, with its nodes, and its end reason if it ended: "
            "what its ``startNotify`` and kill notifications said. A launcher whose connection was cut (a "
            "nats-server restart loses what was sent meanwhile) asks on reconnecting, and takes what it did "
            "not hear of as if it had (the SDK does). Records stay an hour after the session's end."),
        example={"token": _TOKEN},
        reply_example={"ok": True, "allocations": [
            {"request": "alice.a7.run", "cluster": "c0", "nodes": ["c0n0", "c0n1"], "kept": [], "end": _T0 + 3600,
             "ended": None},
            {"request": "alice.a7.pre", "cluster": "c0", "nodes": ["c0n2"], "kept": [], "end": None,
             "ended": "walltime"}]},
    ),
    Endpoint(
        subject=subjects.CLUSTERS_INFO, names=("CLUSTERS_INFO",), part=Part.LAUNCHER, kind=Kind.REQUEST,
        request=InfoQuery, reply=ClustersInfoReply, publishers=_AS_LAUNCHER, subscribers=(Role.SERVICE,),
        sent_by=_LAUNCHERS, served_by="view publisher", errors=_BUS, paper="listClustersInfo",
        description=(
            "CINFO of every cluster: its up nodes and, per node, the fewest cores and the least memory among "
            "them; its relative speed (from the operator's inventory). The body is ``{}``."),
        example={},
        reply_example={"clusters": [{"id": "c0", "nodes": 64, "cores_per_node": 32, "memory_mb_per_node": 131072,
                                     "speed": 1.0}]},
    ),
    Endpoint(
        subject=subjects.CLUSTERS_INTERINFO, names=("CLUSTERS_INTERINFO",), part=Part.LAUNCHER, kind=Kind.REQUEST,
        request=InfoQuery, reply=InterClusterInfoReply, publishers=_AS_LAUNCHER, subscribers=(Role.SERVICE,),
        sent_by=_LAUNCHERS, served_by="view publisher", errors=_BUS, paper="listInterClusterInfo",
        description=(
            "ICINFO of every pair of clusters: latency and bandwidth, from the operator's inventory (defaults "
            "for pairs it does not name). The body is ``{}``."),
        example={},
        reply_example={"links": [{"a": "c0", "b": "c1", "latency_ms": 12.0, "bandwidth_mbps": 10000.0}]},
    ),
    Endpoint(
        subject=subjects.app_request(APP), names=("app_request", "APP_REQUEST_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=RequestMsg, reply=Ack, publishers=_AS_LAUNCHER, subscribers=(Role.SERVICE,),
        sent_by=_LAUNCHERS, served_by="policy engine (the leader)", paper="request",
        errors=(*_BUS, *_SESSION, ErrorCode.UNKNOWN_CLUSTER, ErrorCode.DUPLICATE,
                ErrorCode.BAD_RELATION, ErrorCode.UNKNOWN_REQUEST, ErrorCode.NOT_YOURS, ErrorCode.ENDED,
                ErrorCode.TOO_LARGE, ErrorCode.STARTED),
        description=(
            "Add a batch of requests, accepted or refused as a whole. Each names its type, cluster, number of "
            "nodes, duration (seconds; absent only for a preemptible request: unbounded) and may relate to "
            "another request of the same application (``COALLOC``: start together; ``NEXT``: start at its end "
            "and take its nodes over). Request ids are the application's: prefixed with its id (as the SDK "
            "does), they are unique for the life of the system; the RMS refuses only an id a request of an "
            "open session has (it forgets a session's ids when it closes). The ``Ack`` lists the ids accepted. "
            "A request may instead leave its cluster to the RMS (an opt-in delegation of the application's "
            "choice): no ``cluster``, a ``placement`` rule (``worst-fit``, KOALA's; ``first-fit``) and the "
            "``clusters`` it allows; the RMS chooses when it first places the request and keeps the choice, "
            "which the startNotify's ``cluster`` tells (a malleable application grows there). "
            "**Replace**: ``replaces`` names waiting requests of the application the batch replaces (a moldable "
            "application that chose another configuration): they are cancelled and the batch accepted in one "
            "step, so no scheduling pass runs between -- none of them can start after it (a ``request`` then a "
            "``done`` leaves that window open: the old request may start, then be ended at once). If one of them "
            "has started (its startNotify may still be on its way), the whole message is refused with "
            "``started`` and nothing changes: the application keeps what started. ``ended`` (one of them "
            "ended), ``not_yours``, ``unknown_request`` (none such), ``bad_request`` (named twice) and "
            "``bad_relation`` (a new request related to one it replaces) change nothing either. A "
            "replaced ``NEXT`` successor frees its predecessor for the new one. The ``Ack`` lists the new ids; "
            "each replaced request ends as ``cancelled``."),
        example={"token": _TOKEN, "requests": [
            {"id": "alice.a7.run", "type": "non-preemptible", "cluster": "c0", "nodes": 16, "duration": 3600.0},
            {"id": "alice.a7.extra", "type": "preemptible", "cluster": "c0", "nodes": 8, "related_to": "alice.a7.run",
             "related_how": "COALLOC"}]},
        reply_example={"ok": True, "requests": ["alice.a7.run", "alice.a7.extra"]},
    ),
    Endpoint(
        subject=subjects.app_done(APP), names=("app_done", "APP_DONE_ANY"), part=Part.LAUNCHER, kind=Kind.REQUEST,
        request=DoneMsg, reply=Ack, publishers=_AS_LAUNCHER, subscribers=(Role.SERVICE,),
        sent_by=_LAUNCHERS, served_by="policy engine (the leader)", paper="done",
        errors=(*_BUS, *_SESSION, ErrorCode.UNKNOWN_REQUEST, ErrorCode.NOT_YOURS, ErrorCode.ENDED,
                ErrorCode.BAD_RELEASE),
        description=(
            "End a started request now, or cancel one not started yet. ``released`` names node IDs the "
            "application gives back when a ``NEXT`` successor keeps the others (an update to fewer nodes); "
            "they must be nodes the request holds. A request with a waiting ``NEXT`` successor keeps its "
            "nodes until the successor starts on them."),
        example={"token": _TOKEN, "request": "alice.a7.run", "released": ["c0n12", "c0n13"]},
        reply_example={"ok": True, "requests": ["alice.a7.run"]},
    ),
    Endpoint(
        subject=subjects.app_negotiate(APP), names=("app_negotiate", "APP_NEGOTIATE_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=NegotiateMsg, reply=OfferMsg, publishers=_AS_LAUNCHER,
        subscribers=(Role.SERVICE,), sent_by=_LAUNCHERS, served_by="policy engine (the leader)",
        paper="negotiation (adaptive RMS)",
        errors=(*_BUS, *_SESSION, ErrorCode.UNKNOWN_CLUSTER, ErrorCode.DUPLICATE),
        description=(
            "Open a negotiation (the adaptive-RMS paper's, §5.1): a request named ``negotiation`` of ``type`` "
            "on ``cluster``, for ``duration`` seconds (absent: unbounded, preemptible only), whose size may be "
            "any of ``sizes`` (absent or empty: any) from ``min_nodes`` to ``max_nodes``. The reply is the RMS's "
            "first offer: the largest allowed size it can give now -- idle nodes, without delaying any "
            "request already placed -- set aside until the offer's ``deadline`` (``respond_within`` seconds "
            "later); if none fits now, the earliest ``start`` at which the smallest allowed size fits and the "
            "largest size then (such a later offer sets nothing aside); ``start`` null and ``nodes`` 0 if "
            "nothing ever fits as things stand. A ``standing`` negotiation with nothing to be given now gets "
            "``offer`` null and ``waiting``: the RMS offers as soon as nodes free up, on "
            "``app.<app>.notify.offer``. Answer each offer on ``app.<app>.respond`` by its deadline; an "
            "offer not answered in time lapses (its nodes are free again, the negotiation ends). Asking again "
            "under the name of an open negotiation revises it (its offer is withdrawn); an application has at "
            "most 64 negotiations open (``bad_request`` beyond). The application "
            "computes ``sizes`` from what it holds: a power-of-two application on 4 nodes growing to at most "
            "32 sends 4, 12, 28."),
        example={"token": _TOKEN, "terms": {"negotiation": "alice.a7.grow", "cluster": "c0", "type": "non-preemptible",
                                            "min_nodes": 1, "max_nodes": 14, "duration": 600.0,
                                            "respond_within": 5.0}},
        reply_example={"app": "alice.a7", "negotiation": "alice.a7.grow", "offer": "alice.a7.grow.o1", "cluster": "c0",
                       "nodes": 6, "start": _T0, "deadline": _T0 + 5, "round": 1},
    ),
    Endpoint(
        subject=subjects.app_respond(APP), names=("app_respond", "APP_RESPOND_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=RespondMsg, reply=RespondReply, publishers=_AS_LAUNCHER,
        subscribers=(Role.SERVICE,), sent_by=_LAUNCHERS, served_by="policy engine (the leader)",
        paper="accept / counter offer / reject (adaptive RMS)",
        errors=(*_BUS, *_SESSION, ErrorCode.UNKNOWN_OFFER, ErrorCode.OFFER_LAPSED, ErrorCode.NOT_YOURS,
                ErrorCode.BAD_COUNTER, ErrorCode.DUPLICATE),
        description=(
            "Answer an offer. ``accept``: the offer becomes the application's request, named after the "
            "negotiation (``request`` in the reply); one offered now starts on the nodes the offer set aside, "
            "at the next pass, before any other waiting request. ``counter`` with ``nodes``, a size the "
            "negotiation allows: the offer is withdrawn and the reply carries the next round's offer, of at "
            "most that size (``waiting`` for a standing negotiation with nothing now). ``reject``: the "
            "negotiation ends. As many rounds as the application wants; each offer has its own deadline. A "
            "refused answer (an unknown, answered or lapsed offer, another application's, a counter outside "
            "the range) changes nothing."),
        example={"token": _TOKEN, "offer": "alice.a7.grow.o1", "answer": "accept"},
        reply_example={"ok": True, "request": "alice.a7.grow", "offer": None},
    ),
    Endpoint(
        subject=subjects.app_heartbeat(APP), names=("app_heartbeat", "APP_HEARTBEAT_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=HeartbeatMsg, reply=HeartbeatAck, publishers=_AS_LAUNCHER,
        subscribers=(Role.SERVICE,), sent_by=_LAUNCHERS, served_by="policy engine (the leader)",
        errors=(*_BUS, *_SESSION),
        description=(
            "The session is alive. A launcher sends one every ``heartbeat_interval`` seconds (from the "
            "session's reply); a session silent for the engine's ``session_timeout`` is closed (reaped): its "
            "waiting requests are cancelled, its running ones ended and their processes killed. The engine "
            "holds heartbeats to ``COORM_HEARTBEAT_RATE`` a second over all sessions: with more sessions, the "
            "interval and the timeout double (up to ``COORM_HEARTBEAT_LONGEST`` seconds between beats). A "
            "session opened with ``paced`` is told the new interval and timeout in each answer, and beats at "
            "that interval from then on; any other is answered ``{\"ok\": true, \"requests\": []}`` and "
            "keeps its opening's."),
        example={"token": _TOKEN},
        reply_example={"ok": True, "requests": [], "heartbeat_interval": 4.0, "session_timeout": 20.0},
    ),
    Endpoint(
        subject=subjects.app_close(APP), names=("app_close", "APP_CLOSE_ANY"), part=Part.LAUNCHER, kind=Kind.REQUEST,
        request=CloseMsg, reply=Ack, publishers=_AS_LAUNCHER, subscribers=(Role.SERVICE,),
        sent_by=_LAUNCHERS, served_by="policy engine (the leader)", errors=(*_BUS, *_SESSION),
        description=(
            "End the session: its waiting requests are cancelled, its running ones end (reason "
            "``session_closed``) and the agents kill their processes."),
        example={"token": _TOKEN},
        reply_example={"ok": True, "requests": []},
    ),
    # -- the batch queue ----------------------------------------------------------------------------------
    Endpoint(
        subject=subjects.batch_submit(USER), names=("batch_submit", "BATCH_SUBMIT_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=BatchSubmit, reply=BatchSubmitReply, publishers=(Role.LAUNCHER,),
        subscribers=(Role.SERVICE,), sent_by="coorm batch, coorm submit", served_by="batch service",
        errors=(*_BUS, ErrorCode.UNKNOWN_CLUSTER, ErrorCode.TOO_LARGE, ErrorCode.FORBIDDEN),
        description=(
            "``sbatch``: queue a job, or an array of jobs, as the user the subject names. Written down before "
            "it is answered: the reply's id is a job the batch service will run (when its dependencies and "
            "hold allow, as the RMS's policy decides) even if the service restarts. ``argv`` runs on every node "
            "the job gets -- or ``script`` (its text, copied now), with ``argv`` as its arguments, or ``wrap`` "
            "(sbatch --wrap: a command line ``/bin/sh -c`` runs), both once on the first node -- in ``cwd``, "
            "with ``env`` (what the user exported), writing ``output``/``error`` (Slurm's ``%j %A %a %u %x``; "
            "default ``coorm-%j.out``, ``coorm-%A_%a.out`` for an array) as the user. ``array``: Slurm's "
            "``0-999%50``; ``dependency``: ``after``, ``afterok``, ``afternotok``, ``afterany`` (``:id...``), "
            "``singleton``, joined by ``,`` (all) or ``?`` (any). More nodes than the cluster has, up or down: "
            "``too_large`` (unless the operator lets such a job wait). ``attach`` (``coorm submit``, srun's way): "
            "a subject of the submitter's own inbox (``_INBOX.u.<user>.``...; another's: ``forbidden``; not with "
            "``array``) where the batch service sends the job's ``BatchAttached`` events -- ``started``, each "
            "``output`` of its processes (no file is written), ``ended`` last with its state and exit code -- "
            "and which it probes every 2 s with an empty request: answered \"no responders\" for 10 s (nobody "
            "listens: the command was killed), the job is cancelled."),
        example={"argv": [], "script": "#!/bin/sh\nsrun-like-work\n", "nodes": 2, "walltime": 600.0,
                 "cluster": "c0", "name": "sweep", "output": "sweep-%A_%a.out", "array": "0-99%10",
                 "dependency": "afterok:41", "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/home/alice/run"},
        reply_example={"job": "42", "tasks": 100},
    ),
    Endpoint(
        subject=subjects.batch_cancel(USER), names=("batch_cancel", "BATCH_CANCEL_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=BatchControl, reply=BatchControlReply, publishers=(Role.LAUNCHER,),
        subscribers=(Role.SERVICE,), sent_by="coorm cancel", served_by="batch service",
        errors=(*_BUS, ErrorCode.UNKNOWN_JOB, ErrorCode.FORBIDDEN),
        description=(
            "``scancel``: end the user's jobs -- named by id (a job, an array task ``42_7``, a whole array "
            "``42``), or all of the user's that match a name and states. A job waiting in the queue ends at once; "
            "one in the RMS through its session (its request cancelled, or its processes killed). Another "
            "user's job is ``forbidden``, and nothing changes."),
        example={"jobs": ["42", "43_1"]},
        reply_example={"ok": True, "jobs": ["42_0", "42_1", "43_1"], "unchanged": []},
    ),
    Endpoint(
        subject=subjects.batch_hold(USER), names=("batch_hold", "BATCH_HOLD_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=BatchControl, reply=BatchControlReply, publishers=(Role.LAUNCHER,),
        subscribers=(Role.SERVICE,), sent_by="coorm hold", served_by="batch service",
        errors=(*_BUS, ErrorCode.UNKNOWN_JOB, ErrorCode.FORBIDDEN),
        description="Hold the user's jobs that have not entered the RMS yet (the others are ``unchanged``).",
        example={"name": "sweep"},
        reply_example={"ok": True, "jobs": ["42_5", "42_6"], "unchanged": ["42_0"]},
    ),
    Endpoint(
        subject=subjects.batch_release(USER), names=("batch_release", "BATCH_RELEASE_ANY"), part=Part.LAUNCHER,
        kind=Kind.REQUEST, request=BatchControl, reply=BatchControlReply, publishers=(Role.LAUNCHER,),
        subscribers=(Role.SERVICE,), sent_by="coorm release", served_by="batch service",
        errors=(*_BUS, ErrorCode.UNKNOWN_JOB, ErrorCode.FORBIDDEN),
        description="Release the user's held jobs: each goes on as its dependencies allow.",
        example={"jobs": ["42"]},
        reply_example={"ok": True, "jobs": ["42_5", "42_6"], "unchanged": []},
    ),
    Endpoint(
        subject=subjects.BATCH_QUERY, names=("BATCH_QUERY",), part=Part.LAUNCHER, kind=Kind.REQUEST,
        request=BatchQuery, reply=BatchQueryReply, publishers=(Role.LAUNCHER,), subscribers=(Role.SERVICE,),
        sent_by="coorm queue, coorm history, coorm show job", served_by="batch service", errors=_BUS,
        description=(
            "``squeue`` (``ended`` false: the jobs not ended, with their state and the reason they wait) or "
            "``sacct`` (``ended`` true: the history since ``since``, with exit codes). Every user's jobs, as "
            "``squeue`` shows them; ``user``, ``states`` and ``jobs`` narrow it."),
        example={"user": "alice", "states": ["queued", "running"]},
        reply_example={"now": _T0, "total": 1, "jobs": [
            {"id": "42_3", "user": "alice", "name": "sweep", "state": "queued", "reason": "waiting for resources",
             "cluster": "c0", "nodes": 2, "walltime": 600.0, "submitted": _T0 - 60, "start_estimate": _T0 + 300,
             "array_id": "42", "task": 3, "command": "(script #!/bin/sh)", "cwd": "/home/alice/run",
             "output": "/home/alice/run/sweep-42_3.out"}]},
    ),
    Endpoint(
        subject=subjects.QUERY_STATUS, names=("QUERY_STATUS",), part=Part.LAUNCHER, kind=Kind.REQUEST,
        request=StatusQuery, reply=StatusReply, publishers=(Role.LAUNCHER, Role.SERVICE),
        subscribers=(Role.SERVICE,),
        sent_by="``coorm status``, ``apps``, ``requests``, ``estimate`` (as a launcher); the in-process stack "
                "waiting for its nodes (``services/stack.py``, as a service)",
        served_by="policy engine (the leader)", errors=_BUS,
        description=(
            "What the policy engine knows now: per cluster a partition of its up nodes, every open session, "
            "every waiting and started request with its scheduled (or actual) start and planned end. Sessions "
            "and requests come a page at a time (``offset``, ``limit``: at most 5,000 of each; ``limit`` 0 for "
            "the counts only), so that a reply fits in a message; the totals come with every page."),
        example={"offset": 0, "limit": 1000},
        reply_example={"now": _T0, "epoch": 12, "leader": "policy-1f2e3d4c",
                       "clusters": [{"cluster": "c0", "up": 64, "non_preemptible": 16, "pre_allocated_unused": 0,
                                     "preemptible": 8, "held": 0, "idle": 40}],
                       "apps": [{"app": "alice.a7", "user": "alice", "name": "sim-42", "kind": "malleable",
                                 "opened": _T0 - 60, "waiting": 0, "running": 2, "nodes": 24}],
                       "requests": [{"app": "alice.a7", "request": "alice.a7.run", "type": "non-preemptible",
                                     "cluster": "c0",
                                     "nodes": 16, "state": "started", "submitted": _T0 - 50, "start": _T0 - 49,
                                     "end": _T0 + 3551}],
                       "total_apps": 1, "total_requests": 1, "waiting": 0, "running": 1},
    ),
    # -- RMS -> launcher ----------------------------------------------------------------------------------
    Endpoint(
        subject=subjects.notify_change(APP), names=("notify_change",), part=Part.NOTIFY, kind=Kind.NOTIFICATION,
        request=ChangeNotify, reply=None, publishers=(Role.SERVICE,), subscribers=_AS_LAUNCHER,
        sent_by="view publisher", served_by="the application's launcher", errors=(), paper="changeNotify",
        description=(
            "CHANGE events: for each cluster and view type (``non_preemptive``, ``preemptive``) whose view "
            "changed, the new view as a CAP, a step function ``[[t, nodes], ...]`` of absolute times (the last "
            "step lasts for ever): how many nodes a new request of the application could get from time t on. "
            "Sent when, and only when, one of the application's views changed; the policy engine paces them. A "
            "launcher that asked for no preemptive views gets none."),
        example={"app": "alice.a7", "epoch": 13, "now": _T0, "changes": [
            {"cluster": "c0", "type": "preemptive", "cap": [[_T0, 8], [_T0 + 30, 2]]}]},
    ),
    Endpoint(
        subject=subjects.notify_start(APP), names=("notify_start",), part=Part.NOTIFY, kind=Kind.NOTIFICATION,
        request=StartNotify, reply=None, publishers=(Role.SERVICE,), subscribers=_AS_LAUNCHER,
        sent_by="node allocator", served_by="the application's launcher", errors=(), paper="startNotify",
        description=(
            "A request started: its node IDs (empty for a pre-allocation, which holds no node IDs), those of "
            "them it ``kept`` from its ``NEXT`` predecessor, and its planned end (``null``: none). The agents of "
            "the nodes heard of the assignment before this notification went out, so the launcher may launch "
            "on them at once."),
        example={"app": "alice.a7", "request": "alice.a7.run", "cluster": "c0", "nodes": ["c0n0", "c0n1"], "kept": [],
                 "end": _T0 + 3600},
    ),
    Endpoint(
        subject=subjects.notify_kill(APP), names=("notify_kill",), part=Part.NOTIFY, kind=Kind.NOTIFICATION,
        request=KillNotify, reply=None, publishers=(Role.SERVICE,), subscribers=_AS_LAUNCHER,
        sent_by="node allocator", served_by="the application's launcher", errors=(),
        description=(
            "A started request ended, whatever the reason: its own ``done``, a ``NEXT`` hand-over, its "
            "walltime, a node failure, a protocol violation (preemptible nodes kept past the grace), the "
            "session's end, or the end of the pre-allocation it ran in. ``nodes`` are the node IDs it held; "
            "their processes are being killed (the agents publish each exit)."),
        example={"app": "alice.a7", "request": "alice.a7.extra", "reason": "violation", "nodes": ["c0n16", "c0n17"]},
    ),
    Endpoint(
        subject=subjects.notify_offer(APP), names=("notify_offer",), part=Part.NOTIFY, kind=Kind.NOTIFICATION,
        request=OfferMsg, reply=None, publishers=(Role.SERVICE,), subscribers=_AS_LAUNCHER,
        sent_by="policy engine (the leader)", served_by="the application's launcher", errors=(),
        paper="offer (adaptive RMS)",
        description=(
            "An offer the application did not ask for in that message: to a standing negotiation, once nodes "
            "freed up (``unsolicited``) -- answer it on ``app.<app>.respond`` by its ``deadline`` -- or the "
            "news that an offer ``lapsed`` unanswered (its nodes are free again, its negotiation ended). Not "
            "durable: an offer lost with a connection lapses, and the lapse notice may be lost too; a launcher "
            "that hears nothing before a deadline it knows treats the offer as lapsed."),
        example={"app": "alice.a7", "negotiation": "alice.a7.grow2", "offer": "alice.a7.grow2.o1", "cluster": "c0",
                 "nodes": 4, "start": _T0, "deadline": _T0 + 5, "round": 1, "unsolicited": True},
    ),
    Endpoint(
        subject=subjects.SYSTEM_STOPPING, names=("SYSTEM_STOPPING",), part=Part.NOTIFY, kind=Kind.NOTIFICATION,
        request=SystemStopping, reply=None, publishers=(Role.SERVICE,), subscribers=_AS_LAUNCHER,
        sent_by="coorm up, when it stops", served_by="every launcher", errors=(),
        description=(
            "CooRM as a whole is stopping (not one service restarting: a standby or a restarted service "
            "goes on): every session ends and its processes are killed. Sent once, with the reason, before "
            "the servers go; the SDK ends its session with the reason (``RMSStopped``), and ``coorm submit`` "
            "exits 3."),
        example={"reason": "coorm up was stopped (SIGTERM)"},
    ),
    # -- to the node agents -------------------------------------------------------------------------------
    Endpoint(
        subject=subjects.node_assign(NODE), names=("node_assign",), part=Part.NODES, kind=Kind.PUBLISH,
        request=NodeAssign, reply=Ack, publishers=(Role.SERVICE,), subscribers=(Role.AGENT,),
        subscribe_as=subjects.node_any(NODE),
        sent_by="node allocator", served_by="the node's agent",
        errors=(*_SERVED, ErrorCode.BAD_REQUEST, ErrorCode.FORBIDDEN),
        description=(
            "The node now belongs to ``request`` of ``app`` until ``end`` (``null``: no end): only a launch "
            "carrying the session token whose SHA-256 is ``token_sha256`` may start processes on it. Processes "
            "of any other request there are killed, except those of ``previous`` (a ``NEXT`` predecessor of "
            "the same application), which go on under ``request``. The allocator publishes it without asking "
            "for a reply; the agent answers ``Ack`` (or an ``ErrorReply``) when a reply subject is given. An "
            "agent subscribes once per node to ``node.<node>.>``, so that an assignment and the launch after it "
            "are handled in the order they were sent."),
        example={"app": "alice.a7", "request": "alice.a7.run", "nodes": ["c0n0", "c0n1"], "token_sha256": _SHA,
                 "end": _T0 + 3600, "previous": None},
        reply_example={"ok": True, "requests": []},
    ),
    Endpoint(
        subject=subjects.node_launch(NODE, USER), names=("node_launch", "node_any"), part=Part.NODES,
        kind=Kind.REQUEST,
        request=LaunchMsg, reply=LaunchReply, publishers=_AS_LAUNCHER, subscribers=(Role.AGENT,),
        subscribe_as=subjects.node_any(NODE),
        sent_by=_LAUNCHERS, served_by="the node's agent",
        errors=(*_SERVED, ErrorCode.NOT_OWNER, ErrorCode.BAD_TOKEN, ErrorCode.BAD_REQUEST,
                ErrorCode.COMMAND_NOT_FOUND, ErrorCode.NOT_EXECUTABLE, ErrorCode.UNKNOWN_USER, ErrorCode.FORBIDDEN,
                ErrorCode.BAD_CWD, ErrorCode.BAD_OUTPUT),
        description=(
            "Start ``argv`` on the node for a request that holds it now, in its own process group, as the "
            "application's user: an agent running as root drops to the user's uid, gid and groups; one that "
            "does not starts processes only for its own user (``forbidden`` otherwise; ``unknown_user``: no "
            "such user on the node). The subject names the user, and only that user may publish to it: a "
            "launch for an application of another user is ``not_owner``. The process starts in ``cwd`` (the "
            "user's home by default), which the user must be able to enter (``bad_cwd``), with a clean "
            "environment -- never the agent's own: the user's ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, a "
            "default ``PATH``, then ``env`` (what the user exported; a name the operator denies, "
            "``LD_PRELOAD`` and ``LD_AUDIT`` by default, is ``forbidden``), then ``COORM_NODE``, "
            "``COORM_NODES``, ``COORM_REQUEST``, ``COORM_APP``. ``not_owner``: the node is not the request's "
            "now; ``bad_token``: the token is not the session's; ``command_not_found`` / ``not_executable``: "
            "``argv[0]`` does not exist / cannot be executed (a shell's 127 / 126: the launcher fails the job "
            "at once); ``bad_request``: the program could not be started otherwise; ``unavailable``: the "
            "agent is stopping. A launch with a ``launch_id`` the agent saw for the node and application is "
            "answered with the pids it started then (a launcher's retry after a timeout starts nothing twice); "
            "one that comes while the agent is (re)registering waits for the allocator's answer. The "
            "process's output and exit come on ``app.<user>.<app>.output.<request>`` and "
            "``app.<user>.<app>.exited``."),
        example={"token": _TOKEN, "app": "alice.a7", "request": "alice.a7.run", "argv": ["./sim", "--steps", "1000"],
                 "env": {"OMP_NUM_THREADS": "32"}, "cwd": "/home/alice/sim"},
        reply_example={"ok": True, "pids": [41873]},
    ),
    Endpoint(
        subject=subjects.node_kill(NODE), names=("node_kill",), part=Part.NODES, kind=Kind.REQUEST,
        request=KillMsg, reply=KillReply, publishers=(Role.SERVICE,), subscribers=(Role.AGENT,),
        subscribe_as=subjects.node_any(NODE),
        sent_by="node allocator", served_by="the node's agent", errors=(*_SERVED, ErrorCode.FORBIDDEN),
        description=(
            "The node no longer belongs to ``request``: TERM to each of its process groups there, KILL after "
            "``grace`` seconds. The reply comes once they are all dead, with their pids. (A launcher cannot "
            "kill: it ends a request with ``done``.)"),
        example={"request": "alice.a7.run", "grace": 5.0, "reason": "done"},
        reply_example={"ok": True, "killed": [41873]},
    ),
    Endpoint(
        subject=subjects.node_exits(NODE, USER), names=("node_exits", "node_any"), part=Part.NODES,
        kind=Kind.REQUEST,
        request=ExitsQuery, reply=ExitsReply, publishers=_AS_LAUNCHER, subscribers=(Role.AGENT,),
        subscribe_as=subjects.node_any(NODE),
        sent_by=_LAUNCHERS, served_by="the node's agent",
        errors=(*_SERVED, ErrorCode.BAD_TOKEN, ErrorCode.NOT_OWNER),
        description=(
            "The application's processes that ended on the node lately (the agent keeps the last 256 exits "
            "of each node), as their ``app.<app>.exited`` messages said. A launcher whose connection was cut "
            "(exits published meanwhile are lost) asks the nodes where it awaits exits, on reconnecting. "
            "``bad_token``: the token is not the one the processes were launched with."),
        example={"token": _TOKEN, "app": "alice.a7"},
        reply_example={"ok": True, "exits": [{"node": "c0n0", "app": "alice.a7", "request": "alice.a7.run",
                       "pid": 41873,
                                              "code": 0, "killed": False, "reason": None}]},
    ),
    # -- node agents -> launcher -----------------------------------------------------------------------------
    Endpoint(
        subject=subjects.app_output(APP, REQUEST), names=("app_output", "app_output_any"), part=Part.PROCESSES,
        kind=Kind.PUBLISH, request=ProcessOutput, reply=None, publishers=(Role.AGENT,), subscribers=_AS_LAUNCHER,
        subscribe_as=subjects.app_output_any(APP), sent_by="node agents", served_by="the application's launcher",
        errors=(),
        description=(
            "What a launched process prints, line by line (a line longer than 64 KiB in pieces), on "
            "``stdout`` or ``stderr``, decoded as UTF-8 (undecodable bytes replaced). ``request`` is the request "
            "the process runs under now (a ``NEXT`` hand-over changes it). A launcher subscribes to "
            "``app.<app>.output.>`` before it launches. No reply; nothing is kept for a launcher that is not "
            "listening."),
        example={"node": "c0n0", "request": "alice.a7.run", "pid": 41873, "stream": "stdout",
                 "data": "step 10 of 1000\n"},
    ),
    Endpoint(
        subject=subjects.app_exited(APP), names=("app_exited",), part=Part.PROCESSES, kind=Kind.PUBLISH,
        request=ProcessExited, reply=None, publishers=(Role.AGENT,), subscribers=_AS_LAUNCHER,
        sent_by="node agents", served_by="the application's launcher", errors=(),
        description=(
            "A launched process ended, after its output was sent: its exit status (minus the signal that "
            "ended it), and whether the agent killed it (told to, or the allocation's end passed). What it "
            "left running in its process group was killed. The same message goes to ``agent.exited``."),
        example={"node": "c0n0", "app": "alice.a7", "request": "alice.a7.run", "pid": 41873, "code": 0,
                 "killed": False},
    ),
    # -- node agents -> RMS ---------------------------------------------------------------------------------
    Endpoint(
        subject=subjects.AGENT_REGISTER, names=("AGENT_REGISTER",), part=Part.AGENTS, kind=Kind.REQUEST,
        request=AgentRegister, reply=AgentRegistered, publishers=(Role.AGENT,), subscribers=(Role.SERVICE,),
        sent_by="node agents", served_by="node allocator", errors=_BUS,
        description=(
            "An agent's nodes are up: their ids, cores and memory, in one cluster. The allocator records them, "
            "brings them up in the policy engine and answers with the current assignment of each node that "
            "has one (a restarted agent learns whom its nodes belong to; one that was cut off learns that "
            "allocations ended meanwhile, and kills their processes). ``bad_request``: a node is already "
            "registered in another cluster; ``unavailable``: no policy engine leader yet (the agent registers "
            "again, with back-off, until it is answered). Unanswered (no responders, or no reply in time), at "
            "once and then 1, 2, 4, 8 s apart at most, an agent whose URL list names other NATS servers sends "
            "a heartbeat through each over a connection of its own, and moves to one where it is answered: "
            "its own server may be cut from the cluster."),
        example={"agent": "agent-c0", "cluster": "c0", "nodes": [{"id": "c0n0", "cores": 32, "memory_mb": 131072},
                                                                 {"id": "c0n1", "cores": 32, "memory_mb": 131072}]},
        reply_example={"ok": True, "assignments": [
            {"app": "alice.a7", "request": "alice.a7.run", "nodes": ["c0n0", "c0n1"], "token_sha256": _SHA,
             "end": _T0 + 3600,
             "previous": None}]},
    ),
    Endpoint(
        subject=subjects.AGENT_HEARTBEAT, names=("AGENT_HEARTBEAT",), part=Part.AGENTS, kind=Kind.REQUEST,
        request=AgentHeartbeat, reply=Ack, publishers=(Role.AGENT,), subscribers=(Role.SERVICE,),
        sent_by="node agents", served_by="node allocator", errors=_BUS,
        description=(
            "The agent is alive, with its nodes and how many processes it runs, every ``agent_heartbeat`` "
            "seconds. An agent silent for the allocator's ``agent_timeout`` has its nodes marked down (their "
            "requests end with ``node_failure``); a heartbeat from an agent the allocator does not know (or knows "
            "as down) makes it publish ``agent.hello``. Answered ``Ack`` when it asks for a reply: a heartbeat "
            "unanswered while the agent's connection lives says its NATS server may be cut from the cluster, "
            "and the agent sends one through each other server of its URL list, moving to one through which "
            "it is answered. A heartbeat published without a reply subject (an agent older than the answer) "
            "is heard the same."),
        example={"agent": "agent-c0", "nodes": ["c0n0", "c0n1"], "processes": 2},
        reply_example={"ok": True, "requests": []},
    ),
    Endpoint(
        subject=subjects.AGENT_EXITED, names=("AGENT_EXITED",), part=Part.AGENTS, kind=Kind.PUBLISH,
        request=ProcessExited, reply=None, publishers=(Role.AGENT,), subscribers=(),
        sent_by="node agents", served_by="no CooRM program today (for operators' tools)", errors=(),
        description=(
            "Every process exit of every agent, in one place (the same message as ``app.<app>.exited``). No "
            "CooRM service subscribes to it."),
        example={"node": "c0n1", "app": "alice.a7", "request": "alice.a7.run", "pid": 41874, "code": -15,
                 "killed": True},
    ),
    Endpoint(
        subject=subjects.AGENT_HELLO, names=("AGENT_HELLO",), part=Part.AGENTS, kind=Kind.PUBLISH,
        request=None, reply=None, publishers=(Role.SERVICE,), subscribers=(Role.AGENT,),
        sent_by="node allocator", served_by="node agents", errors=(),
        description=(
            "Register again, now: the allocator publishes it when it starts (agents that registered before it "
            "ran) and when it hears a heartbeat from an agent it does not know as up. The body is ``{}`` and "
            "is not read."),
        example={},
    ),
    # -- between services ----------------------------------------------------------------------------------
    Endpoint(
        subject=subjects.SCHEDULE_EPOCH, names=("SCHEDULE_EPOCH",), part=Part.INTERNAL, kind=Kind.PUBLISH,
        request=ViewsEpoch, reply=None, publishers=(Role.SERVICE,), subscribers=(Role.SERVICE,),
        sent_by="policy engine (the leader)", served_by="view publisher", errors=(),
        description=(
            "After a scheduling pass, in paced rounds: the views of the applications whose views changed (of "
            "the clusters of each one's filter; every application when ``full``), and the sessions that "
            "ended. A round too big for one message is split. The view publisher compares them with what it "
            "last sent each application and sends the differences as ``changeNotify``."),
        example={"epoch": 13, "now": _T0, "views": {"alice.a7": {"c0": {"non_preemptive": [[_T0, 16]],
                                                                  "preemptive": [[_T0, 8], [_T0 + 30, 2]]}}},
                 "closed": ["a3"], "full": False},
    ),
    Endpoint(
        subject=subjects.VIEWS_QUERY, names=("VIEWS_QUERY",), part=Part.INTERNAL, kind=Kind.REQUEST,
        request=ViewsQuery, reply=ViewsEpoch, publishers=(Role.SERVICE,), subscribers=(Role.SERVICE,),
        sent_by="view publisher (after it starts)", served_by="policy engine (the leader)", errors=_BUS,
        description=(
            "Every current view of every application (``full``): a view publisher that (re)started asks until "
            "a leader answers, a page of applications at a time (``offset``, ``limit``) while the reply says "
            "``more``."),
        example={"offset": 0, "limit": 500},
        reply_example={"epoch": 13, "now": _T0, "views": {"alice.a7": {"c0": {"non_preemptive": [[_T0, 16]],
                                                                        "preemptive": None}}},
                       "closed": [], "full": True, "more": False},
    ),
    Endpoint(
        subject=subjects.NODES_EVENT, names=("NODES_EVENT",), part=Part.INTERNAL, kind=Kind.REQUEST,
        request=NodesEvent, reply=Ack, publishers=(Role.SERVICE,), subscribers=(Role.SERVICE,),
        sent_by="node allocator", served_by="policy engine (the leader)", errors=_BUS,
        description=(
            "An agent's nodes came up (``register``) or went down (``down``: the agent went silent). The "
            "``Ack`` comes once the event is in the engine's log and applied."),
        example={"kind": "register", "cluster": "c0", "nodes": ["c0n0", "c0n1"]},
        reply_example={"ok": True, "requests": []},
    ),
    # -- JetStream ---------------------------------------------------------------------------------------
    Endpoint(
        subject=subjects.DECISIONS, names=("DECISIONS", "DECISIONS_STREAM"), part=Part.STREAMS, kind=Kind.STREAM,
        request=AllocatorDecisions, reply=None, publishers=(Role.SERVICE,), subscribers=(Role.SERVICE,),
        stream=subjects.DECISIONS_STREAM, consumer="node-allocator",
        sent_by="policy engine (the leader)", served_by="node allocator (durable push consumer, explicit ack)",
        errors=(),
        description=(
            "What the node side acts on after one event, in the order the cores decided it: requests that "
            "start and end, nodes assigned and freed, capacity changes, sessions ended, preemption deadlines. "
            "One message per event, with the header ``Nats-Msg-Id: <incarnation>.<stimulus id>``: a new leader "
            "republishes the decisions of the last events it replays and the stream drops the duplicates (a "
            "two-minute window). The allocator acknowledges a message once it acted on it."),
        example={"decisions": [
            {"kind": "start", "stimulus_id": "e41", "app": "alice.a7", "request": "alice.a7.run",
             "type": "non-preemptible",
             "cluster": "c0", "nodes": 2, "at": _T0, "end": _T0 + 3600},
            {"kind": "assigned", "stimulus_id": "e41", "app": "alice.a7", "request": "alice.a7.run", "cluster": "c0",
             "nodes": ["c0n0", "c0n1"]}]},
    ),
    Endpoint(
        subject=subjects.LIFECYCLE, names=("LIFECYCLE", "LIFECYCLE_STREAM"), part=Part.STREAMS, kind=Kind.STREAM,
        request=Lifecycle, reply=None, publishers=(Role.SERVICE,), subscribers=(Role.SERVICE,),
        stream=subjects.LIFECYCLE_STREAM, consumer="accounting",
        sent_by="policy engine (the leader)", served_by="accounting (durable pull consumer, explicit ack)",
        errors=(),
        description=(
            "One step of an allocation's or a session's life, for accounting: a session opened or ended, a "
            "request started or ended (with its times, size and end reason), a preemption deadline. "
            "De-duplicated by ``Nats-Msg-Id`` like the decisions; kept seven days."),
        example={"kind": "ended", "at": _T0 + 3600, "app": "alice.a7", "user": "alice", "app_kind": "rigid",
                 "request": "alice.a7.run", "type": "non-preemptible", "cluster": "c0", "nodes": 16,
                 "started_at": _T0, "reason": "done"},
    ),
    Endpoint(
        subject=subjects.deadletter(STREAM), names=("deadletter",), part=Part.STREAMS, kind=Kind.PUBLISH,
        request=DeadLetter, reply=None, publishers=(Role.SERVICE,), subscribers=(Role.SERVICE,),
        sent_by="the streams' consumers: accounting, node allocator",
        served_by="no CooRM program: operators, with the services' identity (``nats sub 'coorm.v1.deadletter.>'``)",
        errors=(),
        description=(
            "A poison message set aside: a message of the stream that its consumer could not process -- not "
            "a valid message (at once), or failing every one of ``bus.MAX_DELIVERIES`` (5) deliveries, a "
            "server being unreachable aside -- is published here, counted in ``coorm_dead_letters_total``, "
            "logged and terminated, so that it is never delivered again and the consumer goes on. The "
            "message itself stays in the stream at ``sequence`` until the stream's max_age; ``data`` is its "
            "first 64 KiB, as text. Accounting also keeps the invalid ones in Redis (``keys.ACCT_REJECTED``)."),
        example={"stream": subjects.LIFECYCLE_STREAM, "consumer": "accounting", "sequence": 4121,
                 "subject": subjects.LIFECYCLE, "deliveries": 1, "size": 16,
                 "error": "not a lifecycle event: not JSON: NaN is not a JSON number", "data": '{"at": NaN}'},
    ),
)


# ================================================================================================
# roles
# ================================================================================================
@dataclass(frozen=True)
class Permissions:
    """What a role needs of the NATS server: the patterns it publishes to and subscribes to, and whether
    it replies to requests it receives (``allow_responses``)."""

    publish: frozenset[str]
    subscribe: frozenset[str]
    responses: bool


def permissions(role: Role, user: str | None = None) -> Permissions:
    """The role's needs, derived from the table. A launcher's are a user's own: ``user`` names it, and every
    ``<user>`` of a subject is that name, so that no user may publish or read another's subjects."""
    if (role is Role.LAUNCHER) != (user is not None):
        raise ValueError("a launcher's permissions are a user's: name the user (and only for a launcher)")
    inbox = INBOXES[role] if user is None else subjects.inbox_user(user) + ".>"
    publish: set[str] = set()
    subscribe: set[str] = set()
    responses = False
    for e in ENDPOINTS:
        if role in e.publishers:
            publish.add(nats_pattern(e.subject, user))
            if e.kind in (Kind.REQUEST, Kind.STREAM):
                subscribe.add(inbox)  # a reply, or JetStream's acknowledgement of the publish
            if e.kind is Kind.STREAM:
                publish.add(JETSTREAM)  # the publisher creates the stream (services.runtime.ensure_streams)
        if role in e.subscribers:
            if e.kind is Kind.STREAM:
                # a consumer works through the JetStream API; its messages arrive on an inbox
                publish.add(JETSTREAM)
                subscribe.add(inbox)
            else:
                subscribe.add(nats_pattern(e.subscribe_as or e.subject, user))
                responses = responses or e.reply is not None
    if responses:
        publish.add(REPLIES)
    return Permissions(frozenset(publish), frozenset(subscribe), responses)


@dataclass(frozen=True)
class BroadGrant:
    """A grant knowingly broader than what the role needs: every agent shares the agent identity."""

    role: Role
    action: Literal["publish", "subscribe"]
    pattern: str
    why: str


# every agent shares one identity (agents run on the operator's hosts, as root: they are trusted with the
# nodes' processes); an identity per agent host, scoped to its nodes, would close these
BROADER_THAN_NEEDED: tuple[BroadGrant, ...] = (
    BroadGrant(Role.AGENT, "publish", nats_pattern(subjects.app_output(APP, REQUEST)),
               "an agent publishes for the applications on its nodes, but may publish for any"),
    BroadGrant(Role.AGENT, "publish", nats_pattern(subjects.app_exited(APP)),
               "an agent publishes for the applications on its nodes, but may publish for any"),
    BroadGrant(Role.AGENT, "subscribe", nats_pattern(subjects.node_any(NODE)),
               "an agent needs its own nodes' subjects, but may read every node's, launch tokens included"),
)


ERROR_MEANINGS: Mapping[ErrorCode, str] = {
    ErrorCode.BAD_MESSAGE: "not JSON (``NaN``, ``Infinity`` and numbers beyond a float are not), more than 8 MiB "
                           "or nested deeper than 32 levels, or not the subject's message (a missing, unknown or "
                           "ill-typed field)",
    ErrorCode.BAD_REQUEST: "well-formed but refused: an id in the subject that is not one (``app.>.views``), a "
                           "request batch the policy cannot take as a whole (e.g. a cycle of relations), a node "
                           "registered in another cluster, a program that cannot be started, an assignment that "
                           "does not name the node",
    ErrorCode.UNKNOWN_APP: "no open session for the application of the subject",
    ErrorCode.BAD_TOKEN: "the session token does not match the application",
    ErrorCode.UNKNOWN_CLUSTER: "a request names a cluster the RMS does not know",
    ErrorCode.UNKNOWN_REQUEST: "no request with that id",
    ErrorCode.NOT_YOURS: "the request belongs to another application",
    ErrorCode.DUPLICATE: "the id is already used by a request of an open session (prefix request ids with the "
                         "application's id, as the SDK's ``<app>.<n>`` do: application ids are never reused, so "
                         "such ids are unique for the life of the system)",
    ErrorCode.BAD_RELATION: "a relation the policy refuses: NEXT after a request of another type or cluster, a "
                            "second NEXT successor, a non-preemptible request co-allocated with a preemptible one",
    ErrorCode.BAD_RELEASE: "``released`` names a node twice, nodes the request does not hold, or more nodes than "
                           "it has",
    ErrorCode.ENDED: "the request (or the one it relates to, or one it replaces) has already ended",
    ErrorCode.STARTED: "a request the message replaces (``replaces``) has started: nothing was changed -- the "
                       "application keeps it (its startNotify comes, or came)",
    ErrorCode.NOT_OWNER: "a launch on a node the request does not hold now (never assigned, given to another, "
                         "or its allocation's end passed)",
    ErrorCode.UNAVAILABLE: "the service cannot take it now (no leader yet, stopping, or an internal error): "
                           "retry",
    ErrorCode.COMMAND_NOT_FOUND: "a launch's program does not exist (`argv[0]`): the job fails with 127, as in "
                                 "a shell",
    ErrorCode.NOT_EXECUTABLE: "a launch's program exists but cannot be executed (permissions, format): the job "
                              "fails with 126, as in a shell",
    ErrorCode.UNKNOWN_USER: "a launch for a user the node does not know (user names are the same on every node)",
    ErrorCode.FORBIDDEN: "not the sender's to do: an assignment or kill the services did not sign, a launch for "
                         "another user by an agent that does not run as root, an environment variable the "
                         "operator denies (``LD_PRELOAD``, ``LD_AUDIT`` by default), another user's batch job",
    ErrorCode.BAD_CWD: "a launch's working directory does not exist, is not a directory, or the user cannot enter it",
    ErrorCode.BAD_OUTPUT: "a launch's output file (``stdout``, ``stderr``) cannot be opened for writing by the user "
                          "the process runs as (its directory is missing or closed to them, the file is "
                          "not theirs to write): nothing was started",
    ErrorCode.UNKNOWN_JOB: "the batch queue has no job with that id (ended jobs leave it after five minutes: "
                           "``coorm history`` has them)",
    ErrorCode.TOO_LARGE: "a request (or a batch job) asks for more nodes than its cluster has, up or down: it could "
                         "never start (unless the operator lets such requests wait: ``COORM_OVERSIZE_WAITS``)",
    ErrorCode.UNKNOWN_OFFER: "no open offer with that id: never made, or answered already (or its session's)",
    ErrorCode.OFFER_LAPSED: "the offer's deadline passed before the answer came: its nodes are free again and its "
                            "negotiation ended (negotiate again)",
    ErrorCode.BAD_COUNTER: "a counter-offer of a size the negotiation does not allow (outside its minimum and "
                           "maximum, or not one of its sizes): the offer still stands",
}
