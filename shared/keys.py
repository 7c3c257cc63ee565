"""Every Redis key, defined once (DESIGN §5). All durable state lives under the ``coorm:`` prefix."""

from __future__ import annotations

PREFIX = "coorm"

SESSIONS = f"{PREFIX}:sessions"  # hash app -> session record
POLICY_LEASE = f"{PREFIX}:policy:leader"  # leader lease of the policy engine
SCHEDULE_EPOCH = f"{PREFIX}:schedule:epoch"  # last published schedule
EVENT_LOG = f"{PREFIX}:policy:events"  # stream of accepted events (replayed on take-over)
SNAPSHOT = f"{PREFIX}:policy:snapshot"  # hash: the cores' state up to an event log entry (the log is trimmed)
INCARNATION = f"{PREFIX}:policy:incarnation"  # this state's id: decision ids stay unique if Redis is reset
EVENT_SEQ = f"{PREFIX}:policy:seq"  # counter: stimulus ids stay unique across leaders
APP_SEQ = f"{PREFIX}:policy:apps"  # counter: application ids
HEARTBEAT_LEVEL = f"{PREFIX}:policy:heartbeat"  # the highest heartbeat pace a session may follow (a new leader's)
NODES = f"{PREFIX}:nodes"  # hash node -> node record
NODE_DRAINS = f"{PREFIX}:nodes:drain"  # hash node -> why an operator drained it (coorm node drain)


def requests_of(app: str) -> str:
    return f"{PREFIX}:app:{app}:requests"


def allocation(request: str) -> str:
    return f"{PREFIX}:alloc:{request}"


def cluster_info(cluster: str) -> str:
    return f"{PREFIX}:cluster:{cluster}"


# -- accounting (services/accounting) ----------------------------------------------------------------
ACCT = f"{PREFIX}:acct"
# written by the service (one Lua script per lifecycle event, so a record is all there or not at all)
ACCT_EVENTS = f"{ACCT}:events"  # stream: every lifecycle event as received (fields: id, event JSON)
ACCT_SEEN = f"{ACCT}:seen"  # zset event id -> when recorded: de-duplicates redeliveries (kept 8 days)
ACCT_REJECTED = f"{ACCT}:rejected"  # list: malformed messages skipped (newest first, capped)
ACCT_ENDED = f"{ACCT}:ended"  # zset request id -> ended_at: the finished requests, by end time
ACCT_PREEMPTIONS = f"{ACCT}:preemptions"  # hash event id -> preemption record (JSON)
ACCT_PREEMPTIONS_AT = f"{ACCT}:preemptions:at"  # zset event id -> when the preemption was announced
# written by the Celery roll-up tasks
ACCT_ROLLED = f"{ACCT}:rolled"  # set: "req:<request>" / "pre:<event id>" already counted in the aggregates
ACCT_USERS = f"{ACCT}:users"  # set: users that have an aggregate
ACCT_APPS = f"{ACCT}:apps"  # set: applications that have an aggregate


def acct_request(request_id: str) -> str:
    """hash: one request's record (submitted_at, started_at, ended_at, nodes, type, cluster, app, user, ...)."""
    return f"{ACCT}:req:{request_id}"


def acct_user(user: str) -> str:
    """hash: one user's usage totals."""
    return f"{ACCT}:user:{user}"


def acct_app(app: str) -> str:
    """hash: one application's usage totals (and ``_user``, ``_kind``)."""
    return f"{ACCT}:app:{app}"



# -- the batch queue (services/batch) ----------------------------------------------------------------
BATCH = f"{PREFIX}:batch"
BATCH_SEQ = f"{BATCH}:seq"  # counter: job ids (an array's tasks are <id>_<task>)
BATCH_SPECS = f"{BATCH}:specs"  # hash job or array id -> what was submitted (BatchSubmit JSON, user, time)
BATCH_JOBS = f"{BATCH}:jobs"  # hash job id -> its state record (JSON): every job not ended yet, and recent ones
BATCH_HISTORY = f"{BATCH}:history"  # hash job id -> the record of an ended job (BatchJob JSON)
BATCH_ENDED = f"{BATCH}:ended"  # zset job id -> when it ended: the history, by end time
BATCH_FARMS = f"{BATCH}:farms"  # hash farm id (an array's, or farm-<hex>) -> its session, asked requests, shape
BATCH_ANSWER_KEPT = 600  # seconds a submission's or command's id is remembered: a command resends for far less


def batch_answer(user: str, sent: str) -> str:
    """string: the reply (JSON) the batch service gave a user's submission or command carrying its own id
    ``sent`` (``BatchSubmit.submission``, ``BatchControl.command``), for :data:`BATCH_ANSWER_KEPT` seconds:
    the same one sent again is answered with it, not carried out twice."""
    return f"{BATCH}:answer:{user}:{sent}"
