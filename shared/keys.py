"""Every Redis key, defined once (DESIGN §5). All durable state lives under the ``coorm:`` prefix."""

from __future__ import annotations

PREFIX = "coorm"

SESSIONS = f"{PREFIX}:sessions"  # hash app -> session record
POLICY_LEASE = f"{PREFIX}:policy:leader"  # leader lease of the policy engine
SCHEDULE_EPOCH = f"{PREFIX}:schedule:epoch"  # last published schedule
EVENT_LOG = f"{PREFIX}:policy:events"  # stream of accepted events (replayed on take-over)
EVENT_SEQ = f"{PREFIX}:policy:seq"  # counter: stimulus ids stay unique across leaders
APP_SEQ = f"{PREFIX}:policy:apps"  # counter: application ids
NODES = f"{PREFIX}:nodes"  # hash node -> node record


def requests_of(app: str) -> str:
    return f"{PREFIX}:app:{app}:requests"


def allocation(request: str) -> str:
    return f"{PREFIX}:alloc:{request}"


def cluster_info(cluster: str) -> str:
    return f"{PREFIX}:cluster:{cluster}"
