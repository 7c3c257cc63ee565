"""The snapshot's schema: what of the cores' state a snapshot carries, as JSON, and how each version of it
becomes the next.

A snapshot is one JSON object, ``{"version": N, "policy": {...}, "allocator": {...}}``, written compactly.
The rules, so that a person or a program in another language can read it:

* an object of the cores (an application, a hold, a node, the last schedule) is a JSON object with its
  fields by name -- except requests, the bulk of a snapshot, which are tables:
  ``{"fields": ["id", "app", ...], "rows": [["r1", "a1", ...], ...]}`` (a row is a request's fields in the
  order ``fields`` names them);
* a tuple is a JSON array (``[opened_at, seq, app]``);
* a mapping is an array of ``[key, value]`` pairs in the order the core keeps it (that order decides
  ties: JSON objects are unordered, and some parsers reorder keys such as ``"1"``); a mapping from ids to
  the objects that carry those ids (applications, nodes; requests) is the array (the table) of the
  objects;
* a number is a JSON number, except the infinities, written ``"inf"`` and ``"-inf"`` (JSON has none);
  finite floats are written as Python's ``repr`` -- the shortest text that reads back as the same float;
* a 64-bit hash (views' signatures) is a decimal string: JavaScript's numbers are exact only to 2**53;
* an application's live requests, and the ids a few other fields hold, are the ids of the core's
  requests (one object each, shared as in memory).

:func:`describe` lists every field and its type (``tests/core/data/snapshot_schema.txt`` records it). The
settings are not carried: the running engine's replace them. :data:`CARRIED` names, for every class of the
cores' state, the attribute each JSON field comes from, and :data:`NOT_CARRIED` the attributes deliberately
left out and why: ``tests/core/test_snapshot.py`` fails when a class gains or loses an attribute that
neither names.

**Changing the schema**: a change to what the cores keep is a new version. Bump :data:`SCHEMA_VERSION`,
change the models, :func:`dump` and :func:`build`, and add to :data:`UPGRADES` the function that turns a
document of the previous version into one of the new (plain JSON in, plain JSON out: the old models are
not kept); record the new version's schema and golden file (``COORM_RECORD_SNAPSHOT=1 pytest
tests/core/test_snapshot.py`` writes ``tests/core/data/snapshot_schema.txt`` and ``snapshot_v<N>.json``).
The golden files of the older versions stay: each must still load through the upgrades. That is the one
place a change of the state goes.
"""

from __future__ import annotations

import enum
import json
import types
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal, NamedTuple, Union, get_args, get_origin, get_type_hints

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, WithJsonSchema

from coorm.services.coupled import CoupledCores
from coorm.services.node_allocator.core import Node, NodeAllocator, sizes_of, up_of
from coorm.services.policy_engine.core import PolicyCore, PolicySettings
from coorm.services.policy_engine.lifecycle import Phase
from coorm.services.policy_engine.negotiation import Negotiation, NegotiationBook, Offer
from coorm.services.policy_engine.reuse import Kept, Unit
from coorm.services.policy_engine.schedule import PreemptibleDemand, Schedule
from coorm.services.policy_engine.state import App, Hold, Request, RequestState
from coorm.shared.events import EndReason
from coorm.shared.negotiation import NegotiationTerms
from coorm.shared.requests import Relation, RequestType
from coorm.shared.stepfn import INF

SCHEMA_VERSION = 5

Doc = dict[str, Any]


def _v2_koala(doc: Doc) -> Doc:
    """Version 2 (KOALA's malleability policies): an application's ``started_at``, a demand's ``held``
    intervals, the schedule's ``threshold``. Version 1 kept none of them: an application started when its
    earliest live started request did (the best it knew; "inf" if none); a version 1 schedule was worked
    out under ``filling`` or ``strict``, which read neither holdings nor a threshold (the next pass works
    them out under the restoring engine's settings)."""
    policy = doc["policy"]
    fields = policy["requests"]["fields"]
    app_i, phase_i, start_i = fields.index("app"), fields.index("phase"), fields.index("start")
    first: dict[str, float] = {}
    for row in policy["requests"]["rows"]:
        if row[phase_i] in ("running", "handing over"):
            first[row[app_i]] = min(first.get(row[app_i], INF), float(row[start_i]))  # ("inf" reads as inf)
    for app in policy["apps"]:
        t = first.get(app["id"], INF)
        app["started_at"] = "inf" if t == INF else t
    schedule = policy.get("schedule")
    if schedule is not None:
        for _, demands in schedule["demands"]:
            for d in demands:
                d["held"] = []
        schedule["threshold"] = 0
    return doc


def _v3_negotiation(doc: Doc) -> Doc:
    """Version 3 (the adaptive-RMS paper's negotiation): the policy's ``negotiations``. Version 2 had none:
    no negotiation is open, no offer was made."""
    doc["policy"]["negotiations"] = {"open": [], "offers": [], "recent": [], "promised": []}
    return doc


def _v4_placement(doc: Doc) -> Doc:
    """Version 4 (the RMS chooses a request's cluster, KOALA's worst-fit): a request's ``placement`` and
    ``allowed`` clusters. Version 3 had none: every request named its cluster."""
    policy = doc["policy"]
    for table in (policy["requests"], policy["pending_ends"]):
        table["fields"] = [*table["fields"], "placement", "allowed"]
        table["rows"] = [[*row, None, []] for row in table["rows"]]
    return doc


def _v5_shrink_to(doc: Doc) -> Doc:
    """Version 5: what each pending preemption deadline allows (``shrink_to``). Version 4 did not keep it: a
    holder's ``done`` is judged against its view worked out again, as version 4's engine judged it, until its
    next shrink."""
    for app in doc["policy"]["apps"]:
        app["shrink_to"] = []
    return doc


# version N -> the function that turns a document of version N - 1 into one of version N. Each takes and
# returns plain JSON (dicts, lists, str, numbers); it may assume its input is a valid document of N - 1.
UPGRADES: dict[int, Callable[[Doc], Doc]] = {2: _v2_koala, 3: _v3_negotiation, 4: _v4_placement,
                                             5: _v5_shrink_to}


def upgrade(doc: Doc, version: int, upgrades: dict[int, Callable[[Doc], Doc]] | None = None,
            current: int = SCHEMA_VERSION) -> Doc:
    """``doc``, of schema ``version`` (at most ``current``), as a document of version ``current``: each
    upgrade in turn, from the one to ``version + 1``."""
    chain = UPGRADES if upgrades is None else upgrades
    for v in range(version + 1, current + 1):
        doc = chain[v](doc)
        doc["version"] = v
    return doc


# ==================================================================================================
# values
# ==================================================================================================
def _num(v: object) -> object:
    if v == "inf":
        return INF
    if v == "-inf":
        return -INF
    if isinstance(v, str):
        raise ValueError('a number, or "inf" or "-inf"')
    if isinstance(v, float) and v != v:
        raise ValueError("not a number (NaN)")
    return v


def _u64(v: object) -> object:
    if not (isinstance(v, str) and v.isascii() and v.isdigit() and int(v) < 1 << 64):
        raise ValueError("a 64-bit unsigned integer written as a decimal string")
    return int(v)


Num = Annotated[float, BeforeValidator(_num),
                WithJsonSchema({"anyOf": [{"type": "number"}, {"enum": ["inf", "-inf"]}]})]
U64 = Annotated[int, BeforeValidator(_u64), WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,20}$"})]
Interval = tuple[Num, Num, int]  # begin, end, nodes


def _n(x: float) -> float | str:
    """A float as the schema writes it: the infinities as strings (JSON has none)."""
    if x == INF:
        return "inf"
    if x == -INF:
        return "-inf"
    return x


def _nn(x: float | None) -> float | str | None:
    return None if x is None else _n(x)


def _ivs(items: list[tuple[float, float, int]]) -> list[list]:
    return [[_n(b), _n(e), n] for b, e, n in items]


# ==================================================================================================
# the models of the current version (what a snapshot is checked against before it is built)
# ==================================================================================================
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestRow(NamedTuple):
    """A request, as one row of a table (requests are the bulk of a snapshot: a row names no field)."""

    id: str
    app: str
    type: RequestType
    cluster: str
    nodes: int
    duration: Num
    related_to: str | None
    related_how: Relation
    submitted_at: Num
    seq: int
    phase: Phase
    start: Num
    end: Num
    container: str | None
    placed_in: str | None
    successor: str | None
    released: tuple[str, ...]
    done_at: Num | None
    end_reason: EndReason | None
    placement: str | None  # the rule that chose (or, while its cluster is "", chooses) its cluster; null: it named it
    allowed: tuple[str, ...]


REQUEST_FIELDS = list(RequestRow._fields)


def _request_fields(v: list[str]) -> list[str]:
    if v != REQUEST_FIELDS:
        raise ValueError(f"the request table's fields must be {REQUEST_FIELDS}")
    return v


class RequestTable(_Model):
    """Requests as a table: ``fields`` names the columns (always :data:`REQUEST_FIELDS`), each row is a
    request."""

    fields: Annotated[list[str], AfterValidator(_request_fields),
                      WithJsonSchema({"const": REQUEST_FIELDS})]
    rows: list[RequestRow]


class AppDoc(_Model):
    id: str
    opened_at: Num
    seq: int
    user: str
    name: str
    kind: str
    adapts: bool
    started_at: Num
    requests: list[str]  # ids of live requests (policy.requests), in the application's order
    preemptible: list[str]  # the preemptible ones among them, same order
    deadlines: list[tuple[str, Num]]
    shrink_to: list[tuple[str, int]]
    ended: list[str]


class HoldDoc(_Model):
    cluster: str
    begin: Num
    until: Num
    nodes: int
    physical: bool
    request: str
    awaiting: list[str]  # a set: sorted


class DemandDoc(_Model):
    app: str
    priority: tuple[Num, int]
    intervals: list[Interval]
    held: list[Interval]


class ScheduleDoc(_Model):
    epoch: int
    now: Num
    policy: str
    up: list[tuple[str, int]]
    base: list[tuple[str, list[Interval]]]
    log: list[tuple[str, Num, Num, int]]
    log_ids: list[str]
    marks: list[tuple[str, int]]
    np_signature: list[tuple[str, U64]]
    np_usage: list[tuple[str, list[Interval]]]
    demands: list[tuple[str, list[DemandDoc]]]
    p_signature: U64
    priorities: list[tuple[str, tuple[Num, int]]]
    used_now: list[tuple[str, int]]
    threshold: int


class OfferDoc(_Model):
    id: str
    nodes: int
    start: Num
    made_at: Num
    deadline: Num


class NegotiationDoc(_Model):
    app: str
    terms: NegotiationTerms  # as on the wire (shared/negotiation.py)
    opened_at: Num
    round: int
    offer: OfferDoc | None
    at_most: int | None


class NegotiationBookDoc(_Model):
    open: list[NegotiationDoc]  # in opening order
    offers: list[tuple[str, str]]  # open offer -> its negotiation
    recent: list[tuple[str, tuple[str, str]]]  # closed offer -> [app, "lapsed"|"answered"], oldest first
    promised: list[str]


class PolicyDoc(_Model):
    now: Num
    clusters: list[tuple[str, int]]
    apps: list[AppDoc]
    order: list[tuple[Num, int, str]]
    requests: RequestTable  # the live ones
    ended: list[tuple[str, tuple[str, EndReason, Num]]]
    holds: list[HoldDoc]
    pending_ends: RequestTable  # ended since the last pass: its end decisions tell the allocator
    pending_sessions: list[tuple[str, str]]
    seq: int
    dirty: bool
    last_pass: Num
    recent_passes: list[Num]
    released_holds: list[HoldDoc]
    epoch: int
    timer: Num
    schedule: ScheduleDoc | None
    signatures: list[tuple[str, tuple[U64, U64]]]
    stories: list[tuple[str, list[tuple[Num, str, str]]]]
    ended_stories: list[str]
    negotiations: NegotiationBookDoc


class NodeDoc(_Model):
    id: str
    cluster: str
    order: int
    state: Literal["free", "allocated", "held", "parked", "down", "drained"]
    owner: str | None
    held_until: Num
    drain: str | None


class AllocatorDoc(_Model):
    now: Num
    nodes: list[NodeDoc]
    free: list[tuple[str, list[tuple[int, str]]]]
    allocations: list[tuple[str, list[str]]]
    owner_app: list[tuple[str, str]]
    parked: list[tuple[str, list[str]]]
    held: list[tuple[Num, str]]
    held_for: list[tuple[str, list[str]]]
    order: int


class SnapshotDoc(_Model):
    version: int
    policy: PolicyDoc
    allocator: AllocatorDoc


def describe() -> str:
    """The current version's schema in a few lines, one per kind of object: every field and its type, in
    the notation ``str``, ``int``, ``bool``, ``num`` (a number, ``"inf"`` or ``"-inf"``), ``u64`` (a
    decimal string), ``null``, ``"a"|"b"`` (those strings), ``[T, ...]`` (an array of T), ``[T, U]``
    (an array of a T and a U), ``A | B``; an object's fields between braces, a row's (an array) between
    brackets. tests/core/data/snapshot_schema.txt records it: a version's schema must not change once
    recorded."""
    todo: list[type] = [SnapshotDoc]
    done: list[type] = []
    lines = [f"version {SCHEMA_VERSION}"]

    def name(tp: Any) -> str:
        origin, args = get_origin(tp), get_args(tp)
        if tp == Num:
            return "num"
        if tp == U64:
            return "u64"
        if origin is Annotated:
            return name(args[0])
        if tp is type(None):
            return "null"
        if tp in (str, int, float, bool):
            return str(tp.__name__)
        if origin in (Union, types.UnionType):
            return " | ".join(name(a) for a in args)
        if origin is Literal:
            return "|".join(json.dumps(a) for a in args)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return "|".join(json.dumps(m.value) for m in tp)
        if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
            return f"[{name(args[0])}, ...]"
        if origin is tuple:
            return "[" + ", ".join(name(a) for a in args) + "]"
        if isinstance(tp, type) and (issubclass(tp, BaseModel) or hasattr(tp, "_fields")):
            if tp not in todo and tp not in done:
                todo.append(tp)
            return tp.__name__
        raise TypeError(f"the schema has a type describe() does not know: {tp!r}")

    while todo:
        model = todo.pop(0)
        done.append(model)
        hints = get_type_hints(model, include_extras=True)
        row = hasattr(model, "_fields")  # a NamedTuple: an array, its fields in this order
        lines.append(f"{model.__name__} " + ("[" if row else "{"))
        names: list[str] = list(getattr(model, "_fields" if row else "model_fields"))
        lines.extend(f"  {f}: {name(hints[f])}" for f in names)
        lines.append("]" if row else "}")
    return "\n".join(lines) + "\n"


# ==================================================================================================
# what is carried, what is not (tests/core/test_snapshot.py checks both against the classes)
# ==================================================================================================
def _same(names: str) -> dict[str, str]:
    return {n: n for n in names.split()}


# class -> {attribute: JSON field}
CARRIED: dict[type, dict[str, str]] = {
    CoupledCores: _same("policy allocator"),
    PolicyCore: {
        **_same("now clusters apps requests ended holds dirty last_pass recent_passes released_holds epoch "
                "schedule stories negotiations"),
        "_order": "order", "_pending_ends": "pending_ends", "_pending_sessions": "pending_sessions",
        "_seq": "seq", "_timer": "timer", "_signatures": "signatures", "_ended_stories": "ended_stories",
    },
    Request: _same("id app type cluster nodes duration related_to related_how submitted_at seq phase start end "
                   "container placed_in successor released done_at end_reason placement allowed"),
    App: _same("id opened_at seq user name kind adapts started_at requests preemptible deadlines shrink_to ended"),
    Hold: _same("cluster begin until nodes physical request awaiting"),
    Schedule: _same("epoch now policy up base log log_ids marks np_signature np_usage demands p_signature "
                    "priorities used_now threshold"),
    PreemptibleDemand: _same("app priority intervals held"),
    NodeAllocator: {
        **_same("now nodes allocations"),
        "_free": "free", "_owner_app": "owner_app", "_parked": "parked", "_held": "held",
        "_held_for": "held_for", "_order": "order",
    },
    Node: _same("id cluster order state owner held_until drain"),
    NegotiationBook: _same("open offers recent promised"),
    Negotiation: _same("app terms opened_at round offer at_most"),
    Offer: _same("id nodes start made_at deadline"),
}
MODEL_OF: dict[type, type[BaseModel]] = {
    PolicyCore: PolicyDoc, App: AppDoc, Hold: HoldDoc, Schedule: ScheduleDoc,
    PreemptibleDemand: DemandDoc, NodeAllocator: AllocatorDoc, Node: NodeDoc,
    NegotiationBook: NegotiationBookDoc, Negotiation: NegotiationDoc, Offer: OfferDoc,
}
FIELDS_OF: dict[type, list[str]] = {cls: list(model.model_fields) for cls, model in MODEL_OF.items()}
FIELDS_OF[Request] = REQUEST_FIELDS
# class -> {attribute: why a snapshot does not carry it}
NOT_CARRIED: dict[type, dict[str, str]] = {
    CoupledCores: {},
    PolicyCore: {
        "settings": "the running engine's settings replace the writer's",
        "validate": "a choice of the process that restores (Snapshot.cores(validate=...))",
        "started": "an index of the requests' started ones, rebuilt from them",
        "started_per_app": "a count of those per application, rebuilt from them",
        "_by_priority": "the applications in priority order, rebuilt from the order when first read",
        "answered_at": "when each application last answered the fair-start holds: only a shortcut past the "
                       "holds it has answered (without it, every hold is looked at)",
        "reuse": "a choice of the process that restores (a benchmark turns it off to time full passes)",
        "_kept": "the last placement, for the next pass to keep what did not change: without it the first pass "
                 "after a restore places everything (reuse.py)",
        "_touched": "the applications and clusters changed since the last placement: without a placement kept, "
                    "nothing to compare with",
        "_started_since": "the requests started since the last placement: likewise",
    },
    NodeAllocator: {"validate": "a choice of the process that restores (Snapshot.cores(validate=...))",
                    "_sizes": "a count of the nodes per cluster, rebuilt from them",
                    "_up": "a count of those up per cluster, rebuilt from them"},
}
# classes reachable from the cores whose instances are not carried field by field
VALUE_CLASSES: dict[type, str] = {
    PolicySettings: "not carried (PolicyCore.settings)",
    deque: "PolicyCore._ended_stories: an array",
    NegotiationTerms: "Negotiation.terms: an object, as on the wire",
    Kept: "PolicyCore._kept: not carried",
    Unit: "PolicyCore._kept's units: not carried",
}


# ==================================================================================================
# cores -> JSON
# ==================================================================================================
def dump(cores: CoupledCores) -> Doc:
    """The cores' state as a document of the current version (plain JSON values)."""
    return {"version": SCHEMA_VERSION, "policy": _dump_policy(cores.policy),
            "allocator": _dump_allocator(cores.allocator)}


def _dump_requests(requests: Iterable[Request]) -> Doc:
    return {"fields": REQUEST_FIELDS, "rows": [
        [r.id, r.app, r.type.value, r.cluster, r.nodes, _n(r.duration), r.related_to, r.related_how.value,
         _n(r.submitted_at), r.seq, r.phase.value, _n(r.start), _n(r.end), r.container, r.placed_in, r.successor,
         r.released, _nn(r.done_at), None if r.end_reason is None else r.end_reason.value, r.placement,
         list(r.allowed)]
        for r in requests]}


def _dump_app(a: App) -> Doc:
    return {
        "id": a.id, "opened_at": _n(a.opened_at), "seq": a.seq, "user": a.user, "name": a.name, "kind": a.kind,
        "adapts": a.adapts, "started_at": _n(a.started_at), "requests": list(a.requests),
        "preemptible": list(a.preemptible),
        "deadlines": [[c, _n(t)] for c, t in a.deadlines.items()],
        "shrink_to": [[c, n] for c, n in a.shrink_to.items()], "ended": list(a.ended),
    }


def _dump_hold(h: Hold) -> Doc:
    return {"cluster": h.cluster, "begin": _n(h.begin), "until": _n(h.until), "nodes": h.nodes,
            "physical": h.physical, "request": h.request, "awaiting": sorted(h.awaiting)}


def _dump_schedule(s: Schedule) -> Doc:
    return {
        "epoch": s.epoch, "now": _n(s.now), "policy": s.policy, "up": [[c, n] for c, n in s.up.items()],
        "base": [[c, _ivs(items)] for c, items in s.base.items()],
        "log": [[c, _n(b), _n(e), n] for c, b, e, n in s.log], "log_ids": list(s.log_ids),
        "marks": [[a, m] for a, m in s.marks.items()],
        "np_signature": [[a, str(sig)] for a, sig in s.np_signature.items()],
        "np_usage": [[c, _ivs(items)] for c, items in s.np_usage.items()],
        "demands": [[c, [{"app": d.app, "priority": [_n(d.priority[0]), d.priority[1]], "intervals": _ivs(d.intervals),
                          "held": _ivs(d.held)}
                         for d in ds]] for c, ds in s.demands.items()],
        "p_signature": str(s.p_signature),
        "priorities": [[a, [_n(t), seq]] for a, (t, seq) in s.priorities.items()],
        "used_now": [[c, n] for c, n in s.used_now.items()],
        "threshold": s.threshold,
    }


def _dump_policy(p: PolicyCore) -> Doc:
    return {
        "now": _n(p.now),
        "clusters": [[c, n] for c, n in p.clusters.items()],
        "apps": [_dump_app(a) for a in p.apps.values()],
        "order": [[_n(t), seq, a] for t, seq, a in p._order],
        "requests": _dump_requests(p.requests.values()),
        "ended": [[rid, [app, reason.value, _n(at)]] for rid, (app, reason, at) in p.ended.items()],
        "holds": [_dump_hold(h) for h in p.holds],
        "pending_ends": _dump_requests(p._pending_ends),
        "pending_sessions": [[a, why] for a, why in p._pending_sessions],
        "seq": p._seq,
        "dirty": p.dirty,
        "last_pass": _n(p.last_pass),
        "recent_passes": [_n(t) for t in p.recent_passes],
        "released_holds": [_dump_hold(h) for h in p.released_holds],
        "epoch": p.epoch,
        "timer": _n(p._timer),
        "schedule": None if p.schedule is None else _dump_schedule(p.schedule),
        "signatures": [[a, [str(np), str(pp)]] for a, (np, pp) in p._signatures.items()],
        "stories": [[rid, [[_n(t), what, detail] for t, what, detail in story]] for rid, story in p.stories.items()],
        "ended_stories": list(p._ended_stories),
        "negotiations": _dump_negotiations(p.negotiations),
    }


def _dump_offer(o: Offer | None) -> Doc | None:
    if o is None:
        return None
    return {"id": o.id, "nodes": o.nodes, "start": _n(o.start), "made_at": _n(o.made_at), "deadline": _n(o.deadline)}


def _dump_negotiations(b: NegotiationBook) -> Doc:
    return {
        "open": [{"app": n.app, "terms": n.terms.model_dump(mode="json"), "opened_at": _n(n.opened_at),
                  "round": n.round, "offer": _dump_offer(n.offer), "at_most": n.at_most} for n in b.open.values()],
        "offers": [[o, n] for o, n in b.offers.items()],
        "recent": [[o, [app, outcome]] for o, (app, outcome) in b.recent.items()],
        "promised": list(b.promised),
    }


def _dump_allocator(a: NodeAllocator) -> Doc:
    return {
        "now": _n(a.now),
        "nodes": [{"id": n.id, "cluster": n.cluster, "order": n.order, "state": n.state, "owner": n.owner,
                   "held_until": _n(n.held_until), "drain": n.drain} for n in a.nodes.values()],
        "free": [[c, [[order, nid] for order, nid in pool]] for c, pool in a._free.items()],
        "allocations": [[r, list(ns)] for r, ns in a.allocations.items()],
        "owner_app": [[r, app] for r, app in a._owner_app.items()],
        "parked": [[r, list(ns)] for r, ns in a._parked.items()],
        "held": [[_n(t), nid] for t, nid in a._held],
        "held_for": [[r, list(ns)] for r, ns in a._held_for.items()],
        "order": a._order,
    }


# ==================================================================================================
# JSON (validated, current version) -> cores
# ==================================================================================================
class Inconsistent(ValueError):
    """A document that validates but does not hang together (an id that names nothing)."""


def build(doc: SnapshotDoc, settings: PolicySettings | None = None, *, validate: bool = False) -> CoupledCores:
    """Cores in the state ``doc`` describes, with ``settings`` (the running engine's)."""
    cores = CoupledCores(settings, validate=validate)
    _build_policy(cores.policy, doc.policy)
    _build_allocator(cores.allocator, doc.allocator)
    return cores


def _request(row: RequestRow) -> Request:
    return Request(**row._asdict())  # (a row's fields are the request's: CARRIED maps each to itself)


def _hold(d: HoldDoc) -> Hold:
    return Hold(d.cluster, d.begin, d.until, d.nodes, d.physical, d.request, set(d.awaiting))


def _pick(requests: dict[str, Request], ids: list[str], where: str) -> dict[str, Request]:
    out = {}
    for rid in ids:
        r = requests.get(rid)
        if r is None:
            raise Inconsistent(f"{where} names request {rid!r}, which is not among the live requests")
        out[rid] = r
    return out


def _schedule(d: ScheduleDoc) -> Schedule:
    return Schedule(
        epoch=d.epoch, now=d.now, policy=d.policy, up=dict(d.up),
        base={c: list(items) for c, items in d.base},
        log=list(d.log), log_ids=list(d.log_ids), marks=dict(d.marks), np_signature=dict(d.np_signature),
        np_usage={c: list(items) for c, items in d.np_usage},
        demands={c: [PreemptibleDemand(x.app, x.priority, list(x.intervals), list(x.held)) for x in ds]
                 for c, ds in d.demands},
        p_signature=d.p_signature, priorities=dict(d.priorities), used_now=dict(d.used_now), threshold=d.threshold,
    )


def _build_policy(p: PolicyCore, d: PolicyDoc) -> None:
    p.now = d.now
    p.clusters = dict(d.clusters)
    p.requests = {r.id: _request(r) for r in d.requests.rows}
    p.started = {r.id: r for r in p.requests.values() if r.state is RequestState.STARTED}
    p.started_per_app = dict(Counter(r.app for r in p.started.values()))
    p.apps = {}
    for a in d.apps:
        app = App(a.id, a.opened_at, a.seq, a.user, a.name, a.kind, a.adapts, started_at=a.started_at)
        app.requests = _pick(p.requests, a.requests, f"application {a.id}")
        app.preemptible = _pick(p.requests, a.preemptible, f"application {a.id}")
        app.deadlines = dict(a.deadlines)
        app.shrink_to = dict(a.shrink_to)
        app.ended = list(a.ended)
        p.apps[app.id] = app
    p._order = list(d.order)
    p.ended = dict(d.ended)
    p.holds = [_hold(h) for h in d.holds]
    p._pending_ends = [_request(r) for r in d.pending_ends.rows]
    p._pending_sessions = list(d.pending_sessions)
    p._seq = d.seq
    p.dirty = d.dirty
    p.last_pass = d.last_pass
    p.recent_passes = list(d.recent_passes)
    p.released_holds = [_hold(h) for h in d.released_holds]
    p.epoch = d.epoch
    p._timer = d.timer
    p.schedule = None if d.schedule is None else _schedule(d.schedule)
    p._signatures = dict(d.signatures)
    p.stories = {rid: list(story) for rid, story in d.stories}
    p._ended_stories = deque(d.ended_stories)
    book = p.negotiations = NegotiationBook()
    for n in d.negotiations.open:
        o = n.offer
        offer = None if o is None else Offer(o.id, o.nodes, o.start, o.made_at, o.deadline)
        book.open[n.terms.negotiation] = Negotiation(n.app, n.terms, n.opened_at, n.round, offer, n.at_most)
    book.offers = dict(d.negotiations.offers)
    book.recent = {o: (app, outcome) for o, (app, outcome) in d.negotiations.recent}
    book.promised = list(d.negotiations.promised)
    for offer_id, nid in book.offers.items():
        neg = book.open.get(nid)
        if neg is None or neg.offer is None or neg.offer.id != offer_id:
            raise Inconsistent(f"offer {offer_id!r} names negotiation {nid!r}, which is not open with it")


def _build_allocator(a: NodeAllocator, d: AllocatorDoc) -> None:
    a.now = d.now
    a.nodes = {n.id: Node(**n.__dict__) for n in d.nodes}
    a._sizes = sizes_of(a.nodes.values())
    a._up = up_of(a.nodes.values())
    a._free = {c: list(pool) for c, pool in d.free}
    a.allocations = {r: list(ns) for r, ns in d.allocations}
    a._owner_app = dict(d.owner_app)
    a._parked = {r: list(ns) for r, ns in d.parked}
    a._held = list(d.held)
    a._held_for = {r: list(ns) for r, ns in d.held_for}
    a._order = d.order
    named = [nid for _, pool in d.free for _, nid in pool] + [nid for _, ns in d.allocations for nid in ns]
    named += [nid for _, ns in d.parked for nid in ns] + [nid for _, nid in d.held]
    named += [nid for _, ns in d.held_for for nid in ns]
    unknown = sorted({nid for nid in named if nid not in a.nodes})
    if unknown:
        raise Inconsistent(f"the allocator names unknown node(s) {', '.join(unknown[:5])}")
