"""Snapshots of the scheduling cores, so that the event log does not grow for ever.

The policy engine appends every accepted event to the event log and a new leader replays it: without
snapshots the log grows by every request, ``done`` and tick (millions a day on a busy cluster) and so does a
take-over's replay. Every ``snapshot_every`` events the leader writes the cores' state as it stands after an
event (``keys.SNAPSHOT``: the state, the id of that event's log entry, the format) and trims the log up to
that entry; a new leader loads the snapshot and replays only the entries after it.

The state is pickled: the cores are plain Python objects, and a snapshot is read only by the same code
that wrote it. ``FORMAT`` names the shape of that state (the classes and their attributes, recorded by
``tests/core/test_snapshot.py``): change what the cores keep and that test fails until ``FORMAT`` is
bumped; a policy engine refuses a snapshot of another format rather than guess (its log is trimmed, so it
cannot rebuild the state otherwise). Redis is trusted like the event log itself: whoever can write there can
already forge sessions and events."""

from __future__ import annotations

import base64
import enum
import pickle
import types
from dataclasses import dataclass

# 5: bounded state (an application keeps its ended ids, the core the last ended requests' stories);
# 4: drains, oversize refusals
FORMAT = "5"

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


class SnapshotError(Exception):
    """A snapshot this code cannot load."""


@dataclass(frozen=True)
class Snapshot:
    state: str  # base64 of the pickled cores (the Redis client decodes replies as text)
    last: str  # the event log entry the state includes, and every one before it
    format: str
    events: int  # how many events the state includes

    @classmethod
    def of(cls, cores, last: str, events: int) -> Snapshot:
        return cls(state=base64.b64encode(pickle.dumps(cores, protocol=pickle.HIGHEST_PROTOCOL)).decode(),
                   last=last, format=FORMAT, events=events)

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> Snapshot | None:
        if not fields:
            return None
        try:
            return cls(state=fields["state"], last=fields["last"], format=fields["format"],
                       events=int(fields["events"]))
        except (KeyError, ValueError) as e:
            raise SnapshotError(f"a damaged snapshot: {e!r}") from None

    def cores(self):
        if self.format != FORMAT:
            raise SnapshotError(
                f"the snapshot is of format {self.format}, this policy engine reads format {FORMAT}: run the "
                "version that wrote it until its applications are done, or start afresh (delete the snapshot "
                "and the event log)")
        return pickle.loads(base64.b64decode(self.state))

    def script_args(self, instance: str) -> list[str]:
        return [instance, self.state, self.last, self.format, str(self.events), after(self.last)]


def after(entry_id: str) -> str:
    """The smallest stream entry id greater than ``entry_id`` (``ms-seq``)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def state_shape(root) -> dict[str, list[str]]:
    """Every class of object reachable from ``root`` and the attributes its instances carry: what a pickle
    of ``root`` depends on."""
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
