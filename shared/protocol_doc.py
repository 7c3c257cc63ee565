"""``docs/protocol.md``, rendered from the endpoint table (:mod:`coorm.shared.endpoints`) and the pydantic
models' JSON Schemas: a specification in the manner of Flux RFC 27 (one section per message, its keys,
its error codes, a JSON example). ``coorm protocol doc --out docs/protocol.md`` writes it; a test fails when
the file in the repository is not what this renders."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping

from pydantic import BaseModel

from coorm.shared import subjects
from coorm.shared.credentials import SIGNATURE_HEADER
from coorm.shared.endpoints import (
    APP,
    BROADER_THAN_NEEDED,
    ENDPOINTS,
    ERROR_MEANINGS,
    USER,
    Endpoint,
    Kind,
    Part,
    Role,
    permissions,
)
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import ErrorReply
from coorm.shared.requests import MAX_BATCH

COMMAND = "coorm protocol doc --out docs/protocol.md"
WIDTH = 100  # an example's line is folded beyond this
_IDENTIFIER = r"^[A-Za-z0-9_.:@-]+$"

# an error reply as it goes on the wire (validated by the tests like the endpoints' examples)
ERROR_EXAMPLE: Mapping[str, object] = {"ok": False, "error": {"code": "bad_token",
                                                              "message": "wrong session token for a7"}}

# what a key means, where the model's field carries no description of its own ("Model.field")
FIELD_NOTES: Mapping[str, str] = {
    "Filter.clusters": "the clusters the application may use (null: every one)",
    "Filter.preemptive_views": "whether the application wants preemptive views (a rigid or moldable one does not)",
    "Filter.min_nodes": "clusters with fewer nodes are of no use to it",
    "Filter.min_cores_per_node": "clusters whose nodes have fewer cores are of no use to it",
    "Filter.min_memory_mb_per_node": "clusters whose nodes have less memory (MiB) are of no use to it",
    "SessionSubjects.request": "``app.<app>.request``",
    "SessionSubjects.done": "``app.<app>.done``",
    "SessionSubjects.close": "``app.<app>.close``",
    "SessionSubjects.heartbeat": "``app.<app>.heartbeat``",
    "SessionSubjects.change": "``app.<app>.notify.change``",
    "SessionSubjects.start": "``app.<app>.notify.start``",
    "SessionSubjects.kill": "``app.<app>.notify.kill``",
    "ClustersInfoReply.clusters": "one CINFO per cluster with registered nodes",
    "InterClusterInfoReply.links": "one ICINFO per pair of clusters",
    "Link.a": "a cluster id",
    "Link.b": "the other cluster id",
    "Link.latency_ms": "one-way latency (ms)",
    "Link.bandwidth_mbps": "bandwidth (Mbit/s)",
    "ClusterInfo.id": "the cluster id",
    "SessionOpen.filter": "FILTER: which clusters and views the application wants",
    "SessionOpen.name": "a name for people",
    "SessionOpen.kind": "what sort of application (rigid, moldable, malleable, evolving...)",
    "SessionOpen.paced": "the launcher follows the heartbeat interval its heartbeats' answers tell",
    "HeartbeatAck.requests": "always empty",
    "HeartbeatAck.heartbeat_interval": "to a paced session: seconds between two heartbeats from now on",
    "HeartbeatAck.session_timeout": "to a paced session: it is reaped after this long silent",
    "SessionOpenReply.app": "the application id: the ``<app>`` of its subjects",
    "SessionOpenReply.token": "the session token: every later request of the session carries it; keep it secret",
    "SessionOpenReply.subjects": "the session's own subjects",
    "SessionOpenReply.heartbeat_interval": "seconds between two heartbeats",
    "ClusterInfo.nodes": "nodes up now",
    "ClusterInfo.cores_per_node": "the fewest cores of its up nodes",
    "ClusterInfo.memory_mb_per_node": "the least memory of its up nodes (MiB)",
    "ClusterInfo.speed": "relative speed (1.0: the reference)",
    "Authenticated.token": "the session token",
    "RequestMsg.token": "the session token",
    "RequestMsg.requests": f"the batch, accepted or refused as a whole (at most {MAX_BATCH})",
    "RequestMsg.replaces": "waiting requests of the application the batch replaces, cancelled in the same step "
                           "(none of them can start after it); if one has started the message is refused "
                           "(``started``) and nothing changes",
    "RequestSpec.id": "the request id: `<app>.<name>` (unique for the life of the system); others must be "
                      "unique among the open sessions' requests",
    "RequestSpec.type": "how the RMS may treat it",
    "RequestSpec.nodes": "how many nodes",
    "RequestSpec.duration": "seconds; null: unbounded (preemptible only)",
    "RequestSpec.related_to": "a request of the same application (required unless FREE)",
    "RequestSpec.related_how": "FREE: no constraint; COALLOC: start together; NEXT: start at its end, on its nodes",
    "RequestSpec.cluster": "the cluster; null: the RMS chooses it, by ``placement``",
    "RequestSpec.placement": "(with no cluster) the rule by which the RMS chooses the cluster, the first time it "
                             "places the request -- ``worst-fit`` (KOALA's: the most idle nodes at the earliest "
                             "start, less COORM_LOCAL_THRESHOLD) or ``first-fit`` (the first by name where it starts "
                             "first) -- and keeps it; the start notification names it. Only a FREE "
                             "non-preemptible request or pre-allocation",
    "RequestSpec.clusters": "(with a placement) the clusters it may go to, at least one; null: those of its "
                            "session's filter, or any",
    "DoneMsg.token": "the session token",
    "DoneMsg.request": "the request to end (or cancel)",
    "DoneMsg.released": "node IDs given back now (an update to fewer nodes)",
    "CloseMsg.token": "the session token",
    "HeartbeatMsg.token": "the session token",
    "Ack.ok": "always true",
    "Ack.requests": "the request ids the message was about (``request``, ``done``), else empty",
    "ErrorReply.ok": "always false",
    "ErrorBody.code": "an error code (section 4)",
    "ErrorBody.message": "what was wrong, for people",
    "ChangeNotify.epoch": "the scheduling pass the views come from (grows)",
    "ChangeNotify.now": "the RMS's wall clock when the views were computed",
    "ChangeNotify.changes": "one CHANGE per cluster and view type that changed",
    "Change.type": "which view (``info``/``interinfo``: pull the information again)",
    "Change.cap": "the view: ``[[t, nodes], ...]``, absolute times; the last step lasts for ever",
    "StartNotify.nodes": "the node IDs it may use (empty for a pre-allocation)",
    "StartNotify.cluster": "the cluster it started on (the RMS's choice for a request with a placement)",
    "StartNotify.kept": "those of them it kept from its NEXT predecessor",
    "StartNotify.end": "planned end, wall clock (null: none)",
    "KillNotify.reason": "why it ended",
    "KillNotify.nodes": "the node IDs it held",
    "LaunchMsg.token": "the session token (the agent compares its SHA-256 with the assignment's)",
    "LaunchMsg.argv": "the program and its arguments",
    "LaunchMsg.env": "what the user exported: over the user's HOME, USER, LOGNAME, SHELL, PATH",
    "LaunchMsg.cwd": "working directory, absolute, one the user can enter (null: the user's home)",
    "LaunchReply.pids": "the process started (its process group's id)",
    "KillMsg.grace": "seconds between TERM and KILL",
    "KillMsg.reason": "why (logged)",
    "KillReply.killed": "the pids that were killed",
    "NodeAssign.token_sha256": "SHA-256 (hex) of the session token that may launch",
    "NodeAssign.end": "end of the allocation, wall clock (null: none); processes are killed after it",
    "NodeAssign.previous": "a NEXT predecessor whose processes go on under this request",
    "AgentRegister.agent": "the agent's id",
    "NodeInfo.memory_mb": "MiB",
    "AgentHeartbeat.processes": "processes it runs now",
    "ProcessExited.code": "exit status, or minus the signal that ended it",
    "ProcessExited.killed": "the agent killed it (told to, or the allocation's end passed)",
    "ProcessOutput.request": "the request the process runs under now",
    "ProcessOutput.data": "a line (or a piece of a long one), UTF-8",
    "ViewsEpoch.views": "application -> cluster -> its views",
    "ViewsEpoch.closed": "sessions that ended",
    "ViewsEpoch.shared": "views seen by many applications, sent once: key -> views",
    "ViewsEpoch.refs": "application -> cluster -> its views' key in shared",
    "ViewsEpoch.full": "every application's views (not only those that changed)",
    "AppViews.preemptive": "null: the application asked for no preemptive views",
    "NodesEvent.kind": "the nodes came up (register) or went down",
    "Lifecycle.at": "wall clock",
    "Lifecycle.nodes": "the request's size",
    "Lifecycle.reason": "for ``ended``: the end reason; for ``session_ended``: why",
    "Lifecycle.allowed": "for ``preemption``: the preemptible nodes the application may keep",
    "Lifecycle.deadline": "for ``preemption``: when it must have released the others",
    "AllocatorDecisions.decisions": "in the order the cores decided them; ``kind`` tells which",
    "StatusReply.leader": "the policy engine instance that answered",
    "StatusReply.now": "the engine's clock",
    "StatusReply.epoch": "the last scheduling pass",
    "ClusterStatus.up": "up nodes (the sum of the five counts after it)",
    "ClusterStatus.non_preemptible": "nodes running non-preemptible requests",
    "ClusterStatus.pre_allocated_unused": "idle nodes that started pre-allocations keep for their application",
    "ClusterStatus.preemptible": "nodes held by preemptible requests (on pre-allocated nodes too)",
    "ClusterStatus.held": "nodes held for fair-start",
    "ClusterStatus.idle": "nodes free for anyone",
    "AppStatus.opened": "when its session opened (its priority)",
    "AppStatus.waiting": "its waiting requests",
    "AppStatus.running": "its started requests",
    "AppStatus.nodes": "node IDs it holds now",
    "RequestStatus.state": "``waiting`` or ``started``",
    "RequestStatus.submitted": "when it was submitted",
    "RequestStatus.start": "scheduled start (waiting; null: never, it is bigger than the platform) or actual",
    "RequestStatus.end": "planned end (null: unbounded)",
    "RequestStatus.type": "the request's type",
    "RequestStatus.nodes": "its size",
    "RequestStatus.related_to": "the request it relates to",
    "RequestStatus.related_how": "FREE, COALLOC or NEXT",
    "StatusReply.clusters": "one per cluster",
    "StatusReply.apps": "every open session",
    "StatusReply.requests": "every waiting and started request",
    "RequestStatus.blocked": "it waits on a relation",
    "RequestStatus.node_ids": "the node IDs it holds",
    "RequestStatus.cluster": "its cluster; null: left to the RMS, which has not chosen it yet",
    "RequestStatus.placement": "the rule the RMS chooses (or chose) its cluster by; null: the request named it",
    "AgentHeartbeat.nodes": "its node IDs",
    "AgentRegister.nodes": "its nodes",
    "NodeInfo.id": "the node id",
    "NodeInfo.cores": "cores",
    "NodeAssign.nodes": "every node of the assignment (this one among them)",
    "ProcessOutput.stream": "which pipe",
    "ChangeNotify.app": "the application id",
    "Lifecycle.kind": "which step",
    "Lifecycle.type": "the request's type",
    "Lifecycle.user": "the session's user",
    "Lifecycle.app_kind": "the session's kind",
    "Lifecycle.submitted_at": "when the request was submitted",
    "Lifecycle.started_at": "when the request started",
    "DeadLetter.stream": "the stream the message is in",
    "DeadLetter.consumer": "the durable consumer that set it aside",
    "DeadLetter.sequence": "the message's sequence in the stream (where to read all of it)",
    "DeadLetter.subject": "the subject it was published on",
    "DeadLetter.deliveries": "how many times it was delivered, the last included",
    "DeadLetter.error": "why it could not be processed",
    "DeadLetter.size": "the message's length in bytes",
    "DeadLetter.data": "its first 64 KiB, as UTF-8 (undecodable bytes replaced)",
    "NodesEvent.nodes": "the node IDs",
    "ViewsEpoch.epoch": "the scheduling pass",
    "ViewsEpoch.now": "the engine's clock",
    "AppViews.non_preemptive": "the non-preemptive view (a CAP)",
}


# what a key means wherever it appears, unless FIELD_NOTES says otherwise
KEY_NOTES: Mapping[str, str] = {
    "app": "the application id",
    "request": "the request id",
    "cluster": "the cluster id",
    "node": "the node id",
    "pid": "the process id (its process group's id)",
    "stimulus_id": "the event that caused it",
    "kind": "which message of the union this is",
    "ok": "always true",
    "agent": "the agent's id",
    "user": "the session's user",
    "name": "the session's name",
}

# ================================================================================================
# JSON
# ================================================================================================
def example_json(value: object, indent: int = 0) -> str:
    """JSON folded to :data:`WIDTH`: what fits on a line stays on it."""
    flat = json.dumps(value, ensure_ascii=False)
    if len(flat) + indent <= WIDTH or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {example_json(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + example_json(v, indent + 2) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


# ================================================================================================
# fields, from the JSON Schema
# ================================================================================================
def _def_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type_of(schema: Mapping[str, object], defs: Mapping[str, Mapping[str, object]]) -> str:
    """A schema in words (``identifier``, ``integer ≥ 0``, ``array of RequestSpec``...)."""
    if "$ref" in schema:
        name = _def_name(str(schema["$ref"]))
        target = defs[name]
        if "enum" in target:
            return _enum(target["enum"])
        return f"`{name}`"
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema.get("oneOf")
        assert isinstance(options, list)
        words = [_type_of(o, defs) for o in options if o.get("type") != "null"]
        nullable = any(o.get("type") == "null" for o in options)
        return " or ".join(words) + (" or null" if nullable else "")
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return _enum(schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        if "prefixItems" in schema:
            parts = schema["prefixItems"]
            assert isinstance(parts, list)
            return "[" + ", ".join(_type_of(p, defs) for p in parts) + "]"
        items = schema.get("items", {})
        assert isinstance(items, Mapping)
        return "array of " + _type_of(items, defs) + _bounds(schema, "minItems", "maxItems", "items")
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping):
            return "object: string → " + _type_of(values, defs)
        return "object"
    if kind == "string":
        if schema.get("pattern") == _IDENTIFIER:
            return "identifier"
        return "string" + _bounds(schema, "minLength", "maxLength", "characters")
    if kind in ("integer", "number"):
        return str(kind) + _range(schema)
    return str(kind)


def _enum(values: object) -> str:
    assert isinstance(values, list)
    return " \\| ".join(f"`{json.dumps(v)}`" for v in values)


def _bounds(schema: Mapping[str, object], low: str, high: str, unit: str) -> str:
    lo, hi = schema.get(low), schema.get(high)
    if lo is not None and hi is not None:
        return f", {lo} to {hi} {unit}"
    if lo is not None:
        return f", at least {lo} {unit}"
    if hi is not None:
        return f", at most {hi} {unit}"
    return ""


def _range(schema: Mapping[str, object]) -> str:
    out = []
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")):
        if key in schema:
            out.append(f"{sign} {schema[key]}")
    return " " + ", ".join(out) if out else ""


def _note(model: str, key: str, prop: Mapping[str, object]) -> str:
    own = prop.get("description")
    return _md(str(own) if own else FIELD_NOTES.get(f"{model}.{key}", KEY_NOTES.get(key, "")))


def _md(text: str) -> str:
    """Docstring prose (reStructuredText literals, hard line breaks) as one Markdown paragraph."""
    text = re.sub(r":(?:class|func|mod|meth|attr):`~?([^`]+)`", r"`\1`", text)
    return " ".join(text.replace("``", "`").split())


def _tags(schema: object) -> set[tuple[str, str]]:
    """(definition, key) of every discriminated union's members: the tag key, defaulted in the model, is
    REQUIRED on the wire (it tells the members apart)."""
    found: set[tuple[str, str]] = set()
    if isinstance(schema, Mapping):
        d = schema.get("discriminator")
        if isinstance(d, Mapping) and isinstance(d.get("mapping"), Mapping):
            found |= {(_def_name(str(ref)), str(d["propertyName"])) for ref in d["mapping"].values()}
        for v in schema.values():
            found |= _tags(v)
    elif isinstance(schema, list):
        for v in schema:
            found |= _tags(v)
    return found


def _field_rows(name: str, schema: Mapping[str, object], defs: Mapping[str, Mapping[str, object]],
                tags: set[tuple[str, str]]) -> list[str]:
    props = schema.get("properties", {})
    required = schema.get("required", [])
    assert isinstance(props, Mapping) and isinstance(required, list)
    required = [*required, *(key for n, key in tags if n == name)]
    if not props:
        return ["The message has no keys: it is the empty object `{}`."]
    rows = ["| key | type | required | meaning |", "| --- | --- | --- | --- |"]
    for key, prop in props.items():
        assert isinstance(prop, Mapping)
        need = "REQUIRED" if key in required else f"optional (default `{json.dumps(prop.get('default'))}`)"
        if key not in required and "default" not in prop:
            need = "optional"
        note = _note(name, key, prop).replace("|", "\\|")
        rows.append(f"| `{key}` | {_type_of(prop, defs)} | {need} | {note} |")
    return rows


def _objects(model: type[BaseModel]) -> list[tuple[str, Mapping[str, object], Mapping[str, Mapping[str, object]]]]:
    """The model and the objects inside it (not the enums), each with the definitions its types refer to."""
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    assert isinstance(defs, Mapping)
    out: list[tuple[str, Mapping[str, object], Mapping[str, Mapping[str, object]]]] = [(model.__name__, schema, defs)]
    for name, d in defs.items():
        if d.get("type") == "object":
            out.append((name, d, defs))
    return out


def _describe(model: type[BaseModel]) -> Iterator[str]:
    tags = _tags(model.model_json_schema())
    for i, (name, schema, defs) in enumerate(_objects(model)):
        doc = _md(str(schema.get("description", "")))
        title = f"`{name}`" if i == 0 else f"`{name}` (inside `{model.__name__}`)"
        yield f"**{title}**" + (f": {doc}" if doc else "")
        yield ""
        yield from _field_rows(name, schema, defs, tags)
        yield ""


# ================================================================================================
# the document
# ================================================================================================
def _roles(roles: tuple[Role, ...]) -> str:
    return ", ".join(r.value for r in roles) or "none"


def _codes(codes: tuple[ErrorCode, ...]) -> str:
    return ", ".join(f"`{c.value}`" for c in codes)


def _anchor(e: Endpoint) -> str:
    return e.short.replace(".", "-").replace("<", "").replace(">", "")


def _s(subject: str) -> str:
    """A subject in the prose, linked to its section (the subject must have an entry in the table)."""
    e = next(e for e in ENDPOINTS if e.subject == subject)
    return f"[`{e.short}`](#{_anchor(e)})"


def _header() -> list[str]:
    app, node = APP, "<node>"
    return [
        "# The CooRM wire protocol, version 1",
        "",
        f"<!-- Generated from coorm/shared/endpoints.py by `{COMMAND}`: do not edit by hand. -->",
        "",
        "This document specifies the messages that CooRM's launchers, node agents and services exchange "
        "over NATS: for each subject, who publishes and who subscribes, the keys of its message and of its "
        "reply, the error codes it can answer with, and an example. It is written in the manner of Flux RFC "
        "27 and generated from the code: the endpoint table `coorm/shared/endpoints.py`, the subjects of "
        "`coorm/shared/subjects.py` and the pydantic models of `coorm/shared/protocol.py`. The tests validate "
        "every example against its model and hold the servers' generated configuration to the permissions of "
        "section 5.",
        "",
        "## 1. Language",
        "",
        "The key words MUST, MUST NOT, REQUIRED, SHALL, SHALL NOT, SHOULD, SHOULD NOT, RECOMMENDED, MAY and "
        "OPTIONAL are to be interpreted as described in RFC 2119.",
        "",
        "## 2. Related documents",
        "",
        "- [architecture.md](architecture.md): what each service owns, a request's life, the policy and its "
        "invariants.",
        "- The papers: CooRM (`subscribe`, `listClustersInfo`, `listInterClusterInfo`, `request`, `done`, "
        "`changeNotify`, `startNotify`) and CooRMv2 (pre-allocations, preemptible requests, updates).",
        "- The JSON Schema of every message: `coorm protocol schema` (for launchers in other languages).",
        "",
        "## 3. Conventions",
        "",
        f"- Every message is a UTF-8 JSON object sent over NATS. Every subject begins with `{subjects.PREFIX}`: "
        "the version of the protocol. A new major version gets new subjects; the old ones keep their meaning.",
        "- A message MUST carry the keys marked REQUIRED and MUST NOT carry keys its section does not list: an "
        "unknown key is refused like a missing one (`bad_message`).",
        f"- In subjects, `{USER}` stands for a user's name (one token: a letter or `_`, then letters, digits, "
        f"`_` or `-`), `{app}` for an application id (two tokens: the RMS names a user's applications "
        f"`<user>.a1`, `<user>.a2`...), `{node}` for a node id (one token), `<request>` for a request id (MAY "
        "hold dots). "
        f"An *identifier* is a string of 1 to 128 characters of `A-Za-z0-9_.:@-`.",
        "- Times are wall-clock seconds since the epoch (floats); durations are seconds. Unbounded times are "
        "`null`.",
        "- A view (CAP) is a step function sent as `[[t, nodes], ...]`: from time `t` on, `nodes` are "
        "available, until the next step; the last step lasts for ever.",
        "- **Request/reply.** A request MUST be sent with a reply subject (NATS request/reply); it always gets "
        "one reply: the subject's reply model (an `Ack` `{\"ok\": true, \"requests\": [...]}` for most) or an "
        "`ErrorReply` `{\"ok\": false, \"error\": {\"code\", \"message\"}}`, never silence. A client tells "
        "them apart by `ok`: an `ErrorReply` is the only reply whose `ok` is `false`. Example:",
        "",
        "```json",
        example_json(ERROR_EXAMPLE),
        "```",
        "",
        "- When no process serves a subject (no policy engine leader yet, a node whose agent is gone), NATS "
        "answers the request with its *no responders* status at once; a client SHOULD retry later. That is "
        "no `ErrorReply`.",
        "- **Publish** and **notification** subjects get no reply. Notifications are not stored: a launcher "
        "MUST subscribe before it can miss one (section 7).",
        "- **JetStream streams** keep what is published on their subject for their durable consumers, "
        "which acknowledge each message once they acted on it; publishers de-duplicate with the "
        "`Nats-Msg-Id` header.",
        "",
    ]


def _errors(endpoints: tuple[Endpoint, ...]) -> list[str]:
    used: dict[ErrorCode, list[str]] = {}
    for e in endpoints:
        for c in e.errors:
            used.setdefault(c, []).append(f"`{e.short}`")
    rows = ["## 4. Error codes", "",
            "The `code` of an `ErrorReply`, with the subjects that can answer it.", "",
            "| code | meaning | subjects |", "| --- | --- | --- |"]
    for c in ErrorCode:
        rows.append(f"| `{c.value}` | {_md(ERROR_MEANINGS[c])} | {', '.join(used.get(c, [])) or '(none)'} |")
    return [*rows, ""]


def _permissions() -> list[str]:
    rows = [
        "## 5. Identities and permissions",
        "",
        "Every connection is authenticated: NATS admits only the nkeys of the operator's credential store "
        "(`coorm.shared.credentials`; `coorm user add NAME` issues a user's), each with the permissions "
        "below, generated from the endpoint table and nothing else. The identities: `service` (policy engine, "
        "view publisher, node allocator, accounting), `agent` (node agents), and one per user, whose "
        "programs (the SDK, the command line) act as `launcher` on that user's own subjects only: every "
        "subject a user sends or reads names the user (`<user>` below is the user's name in the user's "
        "grants), and an application's id is `<user>.a<N>`. Each identity reads replies (and JetStream's "
        "deliveries) on its own inbox prefix only (a client MUST connect with it: nats-py's "
        "`inbox_prefix`); `$JS.>` is the JetStream API. *Replies* means the identity answers the requests "
        "it receives (`allow_responses`, and publishes on `_INBOX.>` because nats-server forgets the replies "
        "owed when it reloads its users: a request in flight across `coorm user add` is still answered).",
        "",
        "| identity | publishes | subscribes | replies |",
        "| --- | --- | --- | --- |",
    ]
    for role in Role:
        p = permissions(role, USER if role is Role.LAUNCHER else None)
        pub = "<br>".join(f"`{s}`" for s in sorted(p.publish))
        sub = "<br>".join(f"`{s}`" for s in sorted(p.subscribe))
        name = f"`{role.value}` (user `{USER}`)" if role is Role.LAUNCHER else f"`{role.value}`"
        rows.append(f"| {name} | {pub} | {sub} | {'yes' if p.responses else 'no'} |")
    rows += ["", "Grants broader than an identity needs: every agent shares the agent identity (agents run on "
             "the operator's hosts, as root, and are trusted with their nodes' processes):", ""]
    rows += [f"- `{b.role.value}` {b.action} `{b.pattern}`: {_md(b.why)}." for b in BROADER_THAN_NEEDED]
    rows += ["", f"The node allocator signs every {_s(subjects.node_assign('<node>'))} and "
             f"{_s(subjects.node_kill('<node>'))} with the services' nkey (header `{SIGNATURE_HEADER}`: the "
             "base64 ed25519 signature of the subject, a newline, and the body); an agent obeys neither without "
             "that signature (`forbidden`), whatever the server's permissions let through.", ""]
    return rows


def _token() -> list[str]:
    return [
        "## 6. The session token",
        "",
        f"The reply to {_s(subjects.session_open('<user>'))} carries a random session token. Every request of "
        f"the session on its own subjects ({_s(subjects.app_request(APP))}, {_s(subjects.app_done(APP))}, "
        f"{_s(subjects.app_heartbeat(APP))}, {_s(subjects.app_close(APP))}) MUST carry it in `token`; "
        "the policy engine answers `unknown_app` when the subject's application has no open session and "
        "`bad_token` when the token is not the session's. A launch on a node "
        f"({_s(subjects.node_launch('<node>', '<user>'))}) carries it too: the allocator gave the node's agent "
        f"the token's SHA-256 in {_s(subjects.node_assign('<node>'))}, and the agent refuses a launch whose "
        "token does not hash to it (`bad_token`). No notification carries the token. A launcher MUST keep it "
        "secret: with the user's identity, it is the proof that a message comes from the session.",
        "",
    ]


def _sequences() -> list[str]:
    app, node = APP, "<node>"
    return [
        "## 7. Sequences",
        "",
        "### 7.1 A launcher's session",
        "",
        f"1. `subscribe`: request {_s(subjects.session_open('<user>'))}; keep the application id, the token, the "
        "subjects and the heartbeat interval of the reply.",
        f"2. Subscribe to the notifications {_s(subjects.notify_change(app))}, {_s(subjects.notify_start(app))}, "
        f"{_s(subjects.notify_kill(app))}, and to the processes' {_s(subjects.app_output(app, '<request>'))} "
        f"(as `{subjects.app_output_any(app)}`) and {_s(subjects.app_exited(app))}.",
        f"3. Views: request {_s(subjects.app_views(app))} for every current view (the first `changeNotify` "
        "may have gone out before step 2), then follow `changeNotify`. Start sending "
        f"{_s(subjects.app_heartbeat(app))} every `heartbeat_interval` seconds. Optionally "
        f"{_s(subjects.CLUSTERS_INFO)} and {_s(subjects.CLUSTERS_INTERINFO)}.",
        f"4. `request`: request {_s(subjects.app_request(app))} with a batch chosen from the views. On a new "
        "view, until it starts, a moldable application may choose again: one `request` whose `replaces` names "
        "the waiting request(s) it chose before (an atomic replace: no pass can start them in between, as one "
        "may between a `request` and a `done`). Refused with `started`, nothing changed: the old request had "
        "started -- keep it, its `startNotify` comes or came.",
        f"5. `startNotify` on {_s(subjects.notify_start(app))}: the request started on these node IDs.",
        f"6. Launch on the nodes: request {_s(subjects.node_launch(node, '<user>'))} on each node, with the token.",
        f"7. Exits: the output comes on {_s(subjects.app_output(app, '<request>'))}, each process's end on "
        f"{_s(subjects.app_exited(app))}.",
        f"8. `done`: request {_s(subjects.app_done(app))}; the request's processes still running are killed and "
        f"{_s(subjects.notify_kill(app))} tells its end. A request the RMS ends (walltime, node failure, "
        "violation) is told the same way.",
        f"9. {_s(subjects.app_close(app))} ends the session (a launcher that stops sending heartbeats has it "
        "closed for it).",
        "",
        "### 7.2 Spontaneous update (CooRMv2)",
        "",
        "To change a running request's size now: `request(n', NEXT current)`, then `done(current)` (with "
        "`released` node IDs when shrinking). The successor starts as soon as it can and takes over the "
        "current request's nodes (`kept` in its `startNotify`); their processes go on under the successor.",
        "",
        "### 7.3 Announced update (CooRMv2)",
        "",
        "To change size after an interval Δ: `request(n_current, Δ, NEXT current)`, `request(n', NEXT that)`, "
        "then `done(current)`: the application keeps its nodes for Δ, then the second successor takes over.",
        "",
        "### 7.4 Malleable applications (CooRMv2)",
        "",
        "`r_min` non-preemptible, `r_extra` preemptible COALLOC `r_min`. When the preemptive view drops below "
        "what the application holds, it MUST give back node IDs (an update with `released`): at once if the "
        "view drops now, before the announced time otherwise. Preemptible nodes kept past the grace end the "
        "request with reason `violation`.",
        "",
    ]


def _summary(endpoints: tuple[Endpoint, ...]) -> list[str]:
    rows = ["## 8. Endpoints", "",
            "| subject | kind | from → to | paper |", "| --- | --- | --- | --- |"]
    for e in endpoints:
        paper = f"`{e.paper}`" if e.paper else ""
        rows.append(f"| [`{e.subject}`](#{_anchor(e)}) | {e.kind.value} | {_roles(e.publishers)} → "
                    f"{_roles(e.subscribers)} | {paper} |")
    return [*rows, ""]


def _section(number: str, e: Endpoint) -> list[str]:
    title = f"`{e.short}`" + (f" (`{e.paper}`)" if e.paper else "")
    out = [f'<a id="{_anchor(e)}"></a>', "", f"### {number} {title}", "", "| | |", "| --- | --- |",
           f"| subject | `{e.subject}` |",
           f"| in `subjects.py` | {', '.join(f'`{n}`' for n in e.names)} |",
           f"| kind | {e.kind.value} |",
           f"| published by | {_md(e.sent_by)}; role: {_roles(e.publishers)} |",
           f"| subscribed by | {_md(e.served_by)}; role: {_roles(e.subscribers)} |"]
    if e.subscribe_as:
        out.append(f"| subscription | `{e.subscribe_as}` |")
    if e.stream:
        out.append(f"| stream, consumer | `{e.stream}`, `{e.consumer}` |")
    out.append(f"| message | {f'`{e.request.__name__}`' if e.request else '`{}` (not read)'} |")
    if e.reply is not None:
        when = "" if e.kind is Kind.REQUEST else " (only when the message has a reply subject)"
        out.append(f"| reply | `{e.reply.__name__}` or `{ErrorReply.__name__}`{when} |")
    if e.errors:
        out.append(f"| error codes | {_codes(e.errors)} |")
    out += ["", _md(e.description), ""]
    if e.request is not None:
        out += list(_describe(e.request))
    out += ["Example:", "", "```json", example_json(e.example), "```", ""]
    if e.reply is not None:
        out += list(_describe(e.reply))
        if e.reply_example is not None:
            out += ["Example reply:", "", "```json", example_json(e.reply_example), "```", ""]
    return out


def render(endpoints: tuple[Endpoint, ...] = ENDPOINTS) -> str:
    """The document. With another ``endpoints`` than the table's, the error codes, the summary and the
    sections are those of ``endpoints``; the permissions and the prose still come from the table."""
    lines = [*_header(), *_errors(endpoints), *_permissions(), *_token(), *_sequences(), *_summary(endpoints)]
    number = 9
    for part in Part:
        entries = [e for e in endpoints if e.part is part]
        if not entries:
            continue
        lines += [f"## {number}. {part.value}", ""]
        for i, e in enumerate(entries, 1):
            lines += _section(f"{number}.{i}", e)
        number += 1
    return "\n".join(lines).rstrip("\n") + "\n"
