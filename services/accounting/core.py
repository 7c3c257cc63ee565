"""The pure core of accounting: lifecycle events to per-request records, and records to usage totals.

No I/O, no clock: the service and the Celery tasks read and write Redis around these functions, and the
report computes the same totals from the records when it must filter them by time.

Usage arithmetic (one finished request):

* node-seconds, by request type = ``nodes * (ended_at - started_at)`` (a request that never started has
  none); a pre-allocation and the non-preemptible requests run inside it are both counted, each under its
  own type;
* wait = ``started_at - submitted_at`` when both are known;
* walltime kills, violations and node failures count the requests that ended for that reason;
* waste (as the PSA experiments count it) = node-seconds of preemptible allocations ended by violation:
  the work on nodes the RMS had to take back by force;
* preemptions count the ``preemption`` events (a preemptive view dropping under a holder), per
  application and user.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from coorm.shared.events import EndReason
from coorm.shared.protocol import Lifecycle, LifecycleKind
from coorm.shared.requests import RequestType

NO_USER = "-"  # the user of a session that gave none
TYPES = tuple(t.value for t in RequestType)

# the per-request fields each kind of event fills in (the rest of the record comes from other events)
_REQUEST_KINDS = (LifecycleKind.SUBMITTED, LifecycleKind.STARTED, LifecycleKind.ENDED)


class Malformed(ValueError):
    """A lifecycle message that parses but cannot be accounted (e.g. ``ended`` without a request)."""


def user_of(user: str | None) -> str:
    return user or NO_USER


def event_id(life: Lifecycle, msg_id: str | None) -> str:
    """The event's identity for de-duplication: its ``Nats-Msg-Id``, else a digest of its content."""
    if msg_id:
        return msg_id
    return "sha1:" + hashlib.sha1(life.model_dump_json().encode()).hexdigest()


def check(life: Lifecycle) -> None:
    """Raise :class:`Malformed` if the event cannot be accounted."""
    if life.kind in _REQUEST_KINDS and not life.request:
        raise Malformed(f"a {life.kind.value} event needs a request id")
    if life.kind in (LifecycleKind.STARTED, LifecycleKind.ENDED) and life.type not in TYPES:
        raise Malformed(f"a {life.kind.value} event needs a request type in {', '.join(TYPES)}, not {life.type!r}")
    if life.kind is LifecycleKind.ENDED and not life.reason:
        raise Malformed("an ended event needs an end reason")  # any: a reason added later still counts
    if life.nodes < 0:
        raise Malformed(f"negative node count {life.nodes}")


def marker(life: Lifecycle) -> str:
    """The per-request field that says this kind of event was already recorded ('' when not per-request):
    the second ``ended`` of a request is a duplicate whatever its message id."""
    return f"seen:{life.kind.value}" if life.kind in _REQUEST_KINDS else ""


def _num(x: float) -> str:
    return repr(float(x))


def request_fields(life: Lifecycle) -> dict[str, str]:
    """What one event adds to its request's record (values as Redis strings; unknowns left out, so that a
    later event never blanks what an earlier one said)."""
    if life.kind not in _REQUEST_KINDS:
        return {}
    out = {"request": life.request or "", "app": life.app, "user": life.user, "app_kind": life.app_kind,
           "type": life.type or "", "cluster": life.cluster or "", "reason": life.reason or ""}
    out = {k: v for k, v in out.items() if v}
    if life.nodes > 0:
        out["nodes"] = str(life.nodes)
    if life.submitted_at is not None:
        out["submitted_at"] = _num(life.submitted_at)
    if life.kind is LifecycleKind.SUBMITTED:
        out["submitted_at"] = _num(life.at)
    if life.started_at is not None:
        out["started_at"] = _num(life.started_at)
    if life.kind is LifecycleKind.STARTED:
        out["started_at"] = _num(life.started_at if life.started_at is not None else life.at)
    if life.kind is LifecycleKind.ENDED:
        out["ended_at"] = _num(life.at)
    return out


def _float(x: str | None) -> float | None:
    if x is None or x == "":
        return None
    return float(x)


@dataclass(frozen=True)
class RequestRecord:
    request: str
    app: str
    user: str = ""
    app_kind: str = ""
    type: str = ""
    cluster: str = ""
    nodes: int = 0
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    reason: str = ""

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> RequestRecord | None:
        """The record from its Redis hash (``None`` for an empty hash)."""
        if not f.get("request"):
            return None
        return cls(request=f["request"], app=f.get("app", ""), user=f.get("user", ""),
                   app_kind=f.get("app_kind", ""), type=f.get("type", ""), cluster=f.get("cluster", ""),
                   nodes=int(f.get("nodes") or 0), submitted_at=_float(f.get("submitted_at")),
                   started_at=_float(f.get("started_at")), ended_at=_float(f.get("ended_at")),
                   reason=f.get("reason", ""))


@dataclass(frozen=True)
class PreemptionRecord:
    id: str
    app: str
    at: float
    user: str = ""
    app_kind: str = ""
    cluster: str = ""
    allowed: int | None = None
    deadline: float | None = None

    @classmethod
    def of(cls, eid: str, life: Lifecycle) -> PreemptionRecord:
        return cls(id=eid, app=life.app, at=life.at, user=life.user, app_kind=life.app_kind,
                   cluster=life.cluster or "", allowed=life.allowed, deadline=life.deadline)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PreemptionRecord:
        return cls(**json.loads(text))


_COUNTS = ("requests", "started", "waited", "walltime_kills", "violations", "node_failures", "preemptions")
_SECONDS = ("wait_seconds", "waste_node_seconds")


@dataclass
class Usage:
    """Totals for one user or one application (or the contribution of one request)."""

    node_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TYPES, 0.0))
    requests: int = 0  # finished requests (cancelled ones included)
    started: int = 0
    wait_seconds: float = 0.0  # summed over the ``waited`` requests whose submission time is known
    waited: int = 0
    walltime_kills: int = 0
    violations: int = 0
    node_failures: int = 0
    preemptions: int = 0
    waste_node_seconds: float = 0.0

    def add(self, other: Usage) -> None:
        for t, ns in other.node_seconds.items():
            self.node_seconds[t] = self.node_seconds.get(t, 0.0) + ns
        for name in _COUNTS + _SECONDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def mean_wait(self) -> float | None:
        return self.wait_seconds / self.waited if self.waited else None

    def to_fields(self) -> dict[str, float]:
        """Flat numeric fields, for a Redis hash (``HINCRBYFLOAT`` adds one to another)."""
        out = {f"ns:{t}": ns for t, ns in self.node_seconds.items()}
        out.update({name: float(getattr(self, name)) for name in _COUNTS + _SECONDS})
        return out

    @classmethod
    def from_fields(cls, f: Mapping[str, str]) -> Usage:
        u = cls()
        for k, v in f.items():
            if k.startswith("ns:"):
                u.node_seconds[k[3:]] = float(v)
            elif k in _COUNTS:
                setattr(u, k, round(float(v)))
            elif k in _SECONDS:
                setattr(u, k, float(v))
        return u


def usage_of(rec: RequestRecord) -> Usage:
    """One finished request's contribution (nothing for a request that has not ended)."""
    u = Usage()
    if rec.ended_at is None:
        return u
    u.requests = 1
    node_seconds = 0.0
    if rec.started_at is not None:
        u.started = 1
        node_seconds = rec.nodes * max(0.0, rec.ended_at - rec.started_at)
        u.node_seconds[rec.type] = u.node_seconds.get(rec.type, 0.0) + node_seconds
        if rec.submitted_at is not None:
            u.waited = 1
            u.wait_seconds = max(0.0, rec.started_at - rec.submitted_at)
    u.walltime_kills = int(rec.reason == EndReason.WALLTIME)
    u.violations = int(rec.reason == EndReason.VIOLATION)
    u.node_failures = int(rec.reason == EndReason.NODE_FAILURE)
    if rec.type == RequestType.PREEMPTIBLE and rec.reason == EndReason.VIOLATION:
        u.waste_node_seconds = node_seconds
    return u


def usage_of_preemption(_: PreemptionRecord) -> Usage:
    return Usage(preemptions=1)


@dataclass
class Totals:
    """Usage per user and per application; ``app_owner`` / ``app_kind`` say whose and what each app is."""

    users: dict[str, Usage] = field(default_factory=dict)
    apps: dict[str, Usage] = field(default_factory=dict)
    app_owner: dict[str, str] = field(default_factory=dict)
    app_kind: dict[str, str] = field(default_factory=dict)

    def add(self, user: str, app: str, app_kind: str, usage: Usage) -> None:
        user = user_of(user)
        self.users.setdefault(user, Usage()).add(usage)
        self.apps.setdefault(app, Usage()).add(usage)
        self.app_owner[app] = user
        if app_kind or app not in self.app_kind:
            self.app_kind[app] = app_kind


def rollup(requests: Iterable[RequestRecord], preemptions: Iterable[PreemptionRecord] = ()) -> Totals:
    """Records in, totals out. Requests that have not ended are left out; each request and each
    preemption counts once however many times it is given (by request id, by event id)."""
    totals = Totals()
    seen: set[str] = set()
    for rec in requests:
        if rec.ended_at is None or rec.request in seen:
            continue
        seen.add(rec.request)
        totals.add(rec.user, rec.app, rec.app_kind, usage_of(rec))
    seen.clear()
    for p in preemptions:
        if p.id in seen:
            continue
        seen.add(p.id)
        totals.add(p.user, p.app, p.app_kind, usage_of_preemption(p))
    return totals


def since_filter(requests: Iterable[RequestRecord], preemptions: Iterable[PreemptionRecord],
                 since: float) -> tuple[list[RequestRecord], list[PreemptionRecord]]:
    """The requests that ended at or after ``since`` and the preemptions announced at or after it."""
    return ([r for r in requests if r.ended_at is not None and r.ended_at >= since],
            [p for p in preemptions if p.at >= since])
