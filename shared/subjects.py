"""Every NATS subject of the protocol, defined once (DESIGN §3). Versioned: ``coorm.v1``.

Every subject a user's program publishes to, or reads, names the user: an application's id is
``<user>.a<N>`` (two tokens: the user who opened the session, and the engine's counter), and a launch or an
exits query names the user after the verb. NATS permissions then scope each user to their own subjects
(:func:`coorm.shared.endpoints.permissions`): no user can address another's application, nor read another's
notifications, output or replies (each connection's replies come on its own inbox prefix,
:func:`inbox_prefix`)."""

from __future__ import annotations

PREFIX = "coorm.v1"

# launcher -> RMS (request/reply)
def session_open(user: str) -> str:
    """The user's own: the policy engine records the user named here (which NATS authenticated), never one
    the message claims."""
    return f"{PREFIX}.session.open.{user}"


SESSION_OPEN_ANY = f"{PREFIX}.session.open.*"
CLUSTERS_INFO = f"{PREFIX}.clusters.info"
CLUSTERS_INTERINFO = f"{PREFIX}.clusters.interinfo"


def app_request(app: str) -> str:
    return f"{PREFIX}.app.{app}.request"


def app_done(app: str) -> str:
    return f"{PREFIX}.app.{app}.done"


def app_close(app: str) -> str:
    return f"{PREFIX}.app.{app}.close"


def app_views(app: str) -> str:
    """launcher -> view publisher, reply: ChangeNotify with every current view (after subscribing)."""
    return f"{PREFIX}.app.{app}.views"


def app_allocations(app: str) -> str:
    """launcher -> node allocator, reply: AllocationsReply (what started and ended: after a reconnection)."""
    return f"{PREFIX}.app.{app}.allocations"


def app_heartbeat(app: str) -> str:
    return f"{PREFIX}.app.{app}.heartbeat"


def app_negotiate(app: str) -> str:
    """launcher -> policy engine, reply: OfferMsg (a negotiation opened or revised)."""
    return f"{PREFIX}.app.{app}.negotiate"


def app_respond(app: str) -> str:
    """launcher -> policy engine, reply: RespondReply (an offer accepted, countered or rejected)."""
    return f"{PREFIX}.app.{app}.respond"


# RMS -> launcher (notifications)
def notify_change(app: str) -> str:
    return f"{PREFIX}.app.{app}.notify.change"


def notify_start(app: str) -> str:
    return f"{PREFIX}.app.{app}.notify.start"


def notify_kill(app: str) -> str:
    return f"{PREFIX}.app.{app}.notify.kill"


def notify_offer(app: str) -> str:
    """policy engine -> launcher: OfferMsg (an unsolicited offer, or an offer that lapsed)."""
    return f"{PREFIX}.app.{app}.notify.offer"


# agent -> launcher: what its processes print, and how they ended
def app_output(app: str, request: str) -> str:
    return f"{PREFIX}.app.{app}.output.{request}"


def app_output_any(app: str) -> str:
    return f"{PREFIX}.app.{app}.output.>"


def app_exited(app: str) -> str:
    return f"{PREFIX}.app.{app}.exited"


# launcher or allocator -> agent (request/reply)
def node_launch(node: str, user: str) -> str:
    """The user's own: the agent starts processes only for an application of that user."""
    return f"{PREFIX}.node.{node}.launch.{user}"


def node_kill(node: str) -> str:
    return f"{PREFIX}.node.{node}.kill"


def node_exits(node: str, user: str) -> str:
    """launcher -> agent, reply: ExitsReply (the application's recent exits there: after a reconnection)."""
    return f"{PREFIX}.node.{node}.exits.{user}"


def node_any(node: str) -> str:
    """What an agent subscribes to for one of its nodes: every verb, for every user."""
    return f"{PREFIX}.node.{node}.>"


def node_assign(node: str) -> str:
    """allocator -> agent: the node now belongs to this request (who may launch, until when)."""
    return f"{PREFIX}.node.{node}.assign"


# agent -> RMS
AGENT_REGISTER = f"{PREFIX}.agent.register"
AGENT_HEARTBEAT = f"{PREFIX}.agent.heartbeat"
AGENT_EXITED = f"{PREFIX}.agent.exited"
AGENT_HELLO = f"{PREFIX}.agent.hello"  # allocator -> every agent: (re-)register now (it restarted)

# RMS -> every launcher: the whole system is stopping (``coorm up`` ends): SystemStopping
SYSTEM_STOPPING = f"{PREFIX}.system.stopping"

# service <-> service
SCHEDULE_EPOCH = f"{PREFIX}.internal.schedule"  # policy engine -> view publisher: ViewsEpoch
VIEWS_QUERY = f"{PREFIX}.internal.views"  # view publisher -> policy engine, reply: ViewsEpoch (full)
DECISIONS = f"{PREFIX}.internal.decisions"  # policy engine -> node allocator (durable stream below)
DECISIONS_STREAM = "COORM_DECISIONS"
NODES_EVENT = f"{PREFIX}.internal.nodes"  # node allocator -> policy engine, reply: Ack
LIFECYCLE = f"{PREFIX}.lifecycle"  # captured by the durable JetStream stream below
LIFECYCLE_STREAM = "COORM_LIFECYCLE"


def deadletter(stream: str) -> str:
    """A stream's poison messages, set aside by its consumer (``DeadLetter``): ``deadletter.COORM_LIFECYCLE``."""
    return f"{PREFIX}.deadletter.{stream}"

# the batch queue: launcher -> batch service (request/reply); the user's own, as a session's opening is
def batch_submit(user: str) -> str:
    return f"{PREFIX}.batch.submit.{user}"


def batch_cancel(user: str) -> str:
    return f"{PREFIX}.batch.cancel.{user}"


def batch_hold(user: str) -> str:
    return f"{PREFIX}.batch.hold.{user}"


def batch_release(user: str) -> str:
    return f"{PREFIX}.batch.release.{user}"


BATCH_SUBMIT_ANY = f"{PREFIX}.batch.submit.*"
BATCH_CANCEL_ANY = f"{PREFIX}.batch.cancel.*"
BATCH_HOLD_ANY = f"{PREFIX}.batch.hold.*"
BATCH_RELEASE_ANY = f"{PREFIX}.batch.release.*"
BATCH_QUERY = f"{PREFIX}.batch.query"  # anyone may read the queue, as squeue shows every user's jobs

# queries (request/reply)
QUERY_STATUS = f"{PREFIX}.query.status"  # policy engine: StatusQuery -> StatusReply

# wildcards the policy engine serves (one subscription for every application: <user>.<app>)
APP_REQUEST_ANY = f"{PREFIX}.app.*.*.request"
APP_DONE_ANY = f"{PREFIX}.app.*.*.done"
APP_CLOSE_ANY = f"{PREFIX}.app.*.*.close"
APP_HEARTBEAT_ANY = f"{PREFIX}.app.*.*.heartbeat"
APP_NEGOTIATE_ANY = f"{PREFIX}.app.*.*.negotiate"
APP_RESPOND_ANY = f"{PREFIX}.app.*.*.respond"
APP_VIEWS_ANY = f"{PREFIX}.app.*.*.views"
APP_ALLOCATIONS_ANY = f"{PREFIX}.app.*.*.allocations"  # served by the node allocator


def app_id_prefix(user: str) -> str:
    return f"{user}.a"


def app_id(user: str, seq: int) -> str:
    """An application's id: the user who opened its session, and the engine's counter."""
    return f"{app_id_prefix(user)}{seq}"


def owner(app: str) -> str:
    """The user an application id belongs to (``alice.a7`` -> ``alice``)."""
    return app.split(".", 1)[0]


def app_of(subject: str) -> str:
    """The application id in ``coorm.v1.app.<user>.<app>.<verb>`` (``alice.a7``)."""
    tokens = subject.split(".")
    return f"{tokens[3]}.{tokens[4]}"


def user_of(subject: str) -> str:
    """The user a user's subject names: ``session.open.<user>``, ``app.<user>.<app>.<verb>``,
    ``node.<node>.launch.<user>``, ``node.<node>.exits.<user>``, ``batch.<verb>.<user>``."""
    tokens = subject.split(".")
    return tokens[3] if tokens[2] == "app" else tokens[-1]


# each connection's replies (and JetStream's deliveries) come on its own prefix: a user may read only theirs
INBOX_SERVICE = "_INBOX.service"
INBOX_AGENT = "_INBOX.agent"


def inbox_user(user: str) -> str:
    return f"_INBOX.u.{user}"


def verb_of(subject: str) -> str:
    """A subject without its user, application or node id (``coorm.v1.app.alice.a7.request`` ->
    ``app.request``): a label of bounded cardinality for metrics."""
    parts = subject.removeprefix(PREFIX + ".").split(".")
    if len(parts) >= 4 and parts[0] == "app":
        del parts[1:3]
        if parts[1] == "output":
            del parts[2:]
    elif len(parts) >= 3 and parts[0] == "node":
        del parts[1]
        del parts[2:]
    elif parts[:2] == ["session", "open"] or (parts[0] == "batch" and len(parts) == 3):
        del parts[2:]
    return ".".join(parts)
