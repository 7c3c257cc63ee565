"""Snapshots of the scheduling cores, so that the event log does not grow for ever.

The policy engine appends every accepted event to the event log and a new leader replays it: without
snapshots the log grows by every request, ``done`` and tick (millions a day on a busy cluster) and so does a
take-over's replay. Every ``snapshot_every`` events the leader writes the cores' state as it stands after an
event (``keys.SNAPSHOT``: the state, the id of that event's log entry, the format, the number of events) and
trims the log up to that entry; a new leader loads the snapshot and replays only the entries after it.

The state is JSON of an explicit, versioned schema (:mod:`.snapshot_schema`), not a pickle of the objects:
another version of CooRM -- or a program in another language -- can read it. ``format`` is the schema
version (the document records it too). A snapshot of an older version is brought to the current one by the
schema's upgrade functions; one of a newer or unknown version, or a malformed one, is refused with a
:class:`SnapshotError` that says what to do -- rather than guessed at: the log before it is trimmed, so the
state cannot be rebuilt otherwise. Redis is trusted like the event log itself: whoever can write there can
already forge sessions and events."""

from __future__ import annotations

import contextlib
import enum
import gc
import json
import types
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import ValidationError

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine import snapshot_schema as schema
from coorm.services.policy_engine.core import PolicySettings
from coorm.shared import keys

SCHEMA_VERSION = schema.SCHEMA_VERSION
FORMAT = str(SCHEMA_VERSION)  # what the ``format`` field holds for a snapshot written now

# KEYS: lease, snapshot, event log; ARGV: instance, state, last entry id, format, events, first id to keep.
# Only the leader writes (a deposed leader must not replace its successor's snapshot nor trim its log).
WRITE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('hset', KEYS[2], 'state', ARGV[2], 'last', ARGV[3], 'format', ARGV[4], 'events', ARGV[5])
redis.call('xtrim', KEYS[3], 'MINID', ARGV[6])
return 1
"""

_AFRESH = (f"or start afresh, losing every session and request the snapshot holds: stop every policy engine, "
           f"delete the snapshot and the event log (redis-cli DEL {keys.SNAPSHOT} {keys.EVENT_LOG}), start again")


class SnapshotError(Exception):
    """A snapshot this code cannot load."""


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a snapshot is made or read: they allocate many containers and
    free none, and the collections their allocations trigger would find nothing (half the read time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def encode(cores: CoupledCores) -> str:
    """The cores' state as the compact JSON text of the current schema."""
    with _no_gc():
        return json.dumps(schema.dump(cores), separators=(",", ":"), allow_nan=False)


def decode(state: str, fmt: str, settings: PolicySettings | None = None, *, validate: bool = False) -> CoupledCores:
    """Cores rebuilt from a snapshot's ``state`` of schema version ``fmt`` (upgraded first if older)."""
    version = _version(state, fmt)
    if version > SCHEMA_VERSION:
        raise SnapshotError(
            f"the snapshot is of schema version {version}, written by a newer CooRM; this policy engine reads "
            f"versions 1 to {SCHEMA_VERSION}: run the newer version (a snapshot is never downgraded), {_AFRESH}")
    via = f", upgraded to version {SCHEMA_VERSION}" if version < SCHEMA_VERSION else ""
    try:
        with _no_gc():
            if version == SCHEMA_VERSION:
                doc = schema.SnapshotDoc.model_validate_json(state)  # parsed and checked in one go: the common case
            else:
                raw = json.loads(state)
                if not isinstance(raw, dict) or raw.get("version") != version:
                    raise _Mismatch(raw.get("version") if isinstance(raw, dict) else None)
                doc = schema.SnapshotDoc.model_validate(schema.upgrade(raw, version))
            if doc.version != SCHEMA_VERSION:
                raise _Mismatch(doc.version)
            return schema.build(doc, settings, validate=validate)
    except _Mismatch as e:
        raise SnapshotError(f"a damaged snapshot: its format says schema version {version}, its state "
                            f"{e.args[0]!r}; {_AFRESH}") from None
    except (ValidationError, ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        detail = f"{e.error_count()} error(s): {_errors(e)}" if isinstance(e, ValidationError) else repr(e)
        raise SnapshotError(f"a damaged snapshot (schema version {version}{via}): {detail}; {_AFRESH}") from None


class _Mismatch(Exception):
    """The version a snapshot's state records is not the one its format names."""


def _version(state: str, fmt: str) -> int:
    if not fmt.isascii() or not fmt.isdigit() or int(fmt) < 1:
        raise SnapshotError(f"a snapshot of unknown format {fmt!r}; this policy engine reads schema versions 1 "
                            f"to {SCHEMA_VERSION}: {_AFRESH}")
    if state.startswith("gA"):
        # the formats 1 to 5 of CooRM before the schema: base64 pickles of the cores (protocol 2 and later)
        raise SnapshotError(
            f"the snapshot is a pickle (format {fmt}) written by a CooRM that predates versioned snapshots; this "
            f"policy engine reads JSON snapshots of schema versions 1 to {SCHEMA_VERSION} and cannot read it: to "
            f"keep its state, let the version that wrote it run until its applications are done, {_AFRESH}")
    return int(fmt)


def _errors(e: ValidationError, limit: int = 3) -> str:
    parts = []
    for err in e.errors()[:limit]:
        loc = ".".join(str(x) for x in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts) + ("; ..." if e.error_count() > limit else "")


@dataclass(frozen=True)
class Snapshot:
    state: str  # JSON of the cores' state (snapshot_schema)
    last: str  # the event log entry the state includes, and every one before it
    format: str  # the schema version of ``state``
    events: int  # how many events the state includes

    @classmethod
    def of(cls, cores: CoupledCores, last: str, events: int) -> Snapshot:
        return cls(state=encode(cores), last=last, format=FORMAT, events=events)

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Snapshot | None:
        if not fields:
            return None
        try:
            return cls(state=fields["state"], last=fields["last"], format=fields["format"],
                       events=int(fields["events"]))
        except (KeyError, ValueError) as e:
            raise SnapshotError(f"a damaged snapshot: {e!r}; {_AFRESH}") from None

    def cores(self, settings: PolicySettings | None = None, *, validate: bool = False) -> CoupledCores:
        """The cores this snapshot describes, with ``settings`` (the running engine's; the writer's are not
        kept) and ``validate`` (check the invariants after every event)."""
        return decode(self.state, self.format, settings, validate=validate)

    def script_args(self, instance: str) -> list[str]:
        return [instance, self.state, self.last, self.format, str(self.events), after(self.last)]


def after(entry_id: str) -> str:
    """The smallest stream entry id greater than ``entry_id`` (``ms-seq``)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def state_shape(root) -> dict[str, list[str]]:
    """Every class of object reachable from ``root`` and the attributes its instances carry
    (tests/core/test_snapshot.py compares them with what the schema carries)."""
    shape: dict[str, set[str]] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, enum.Enum)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType)):
            shape.setdefault(f"{type(obj).__name__} {getattr(obj, '__qualname__', obj)}", set())
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
            continue
        cls = type(obj)
        attrs = dict(getattr(obj, "__dict__", {}))
        for klass in cls.__mro__:
            for slot in getattr(klass, "__slots__", ()):
                if not slot.startswith("__") and hasattr(obj, slot):
                    attrs[slot] = getattr(obj, slot)
        shape.setdefault(f"{cls.__module__}.{cls.__qualname__}", set()).update(attrs)
        stack.extend(attrs.values())
    return {k: sorted(v) for k, v in sorted(shape.items())}
