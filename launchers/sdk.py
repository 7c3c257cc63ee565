"""The launcher SDK: the application side of the CooRM protocol over NATS (DESIGN §3).

An asyncio :class:`Session` opens a session with a resource filter, reads cluster information, keeps the
application's latest views (one non-preemptive and one preemptive step function per cluster), sends
requests, updates and ``done``, launches processes on granted nodes through their agents, and delivers
what the RMS says -- new views, starts, kills, process exits -- as :class:`Event` objects on
:meth:`Session.events`. It heartbeats by itself. :class:`SyncSession` wraps it for scripts.

Example (a rigid job of two nodes)::

    async with await Session.open(kind="rigid") as s:
        (rid,) = await s.request(RequestSpec(id=s.rid("job"), cluster="c0", nodes=2, duration=600))
        start = await s.wait_start(rid)
        for node in start.nodes:
            await s.launch(rid, node, ["hostname"])
        codes = await s.wait_exits(rid, len(start.nodes))
        await s.done(rid)

A request may leave its cluster to the RMS (KOALA's worst-fit: the cluster with the most idle nodes), and the
start names the cluster it got -- where the application's later requests (its growth) go::

        (rid,) = await s.request(RequestSpec(id=s.rid("min"), placement="worst-fit", nodes=2, duration=600))
        cluster = (await s.wait_start(rid)).cluster
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from nats.errors import ConnectionClosedError

from coorm.launchers.base import ClusterProps, Views
from coorm.shared import bus, subjects
from coorm.shared.connection import Resends, nats_servers, redact
from coorm.shared.endpoints import Role
from coorm.shared.events import ErrorCode
from coorm.shared.negotiation import Answer, NegotiationTerms
from coorm.shared.protocol import (
    Ack,
    AllocationsQuery,
    AllocationsReply,
    ChangeNotify,
    ChangeType,
    CloseMsg,
    ClustersInfoReply,
    DoneMsg,
    ExitsQuery,
    ExitsReply,
    Filter,
    HeartbeatAck,
    HeartbeatMsg,
    InfoQuery,
    InterClusterInfoReply,
    KillNotify,
    LaunchMsg,
    LaunchReply,
    NegotiateMsg,
    OfferMsg,
    ProcessExited,
    ProcessOutput,
    RequestMsg,
    RespondMsg,
    RespondReply,
    SessionOpen,
    SessionOpenReply,
    StartNotify,
    SystemStopping,
)
from coorm.shared.requests import RequestSpec, RequestType
from coorm.shared.settings import Settings
from coorm.shared.stepfn import StepFunction

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS


# -- what the RMS tells the application -----------------------------------------------------------
@dataclass(frozen=True)
class ViewsChanged:
    views: Views
    epoch: int
    bytes: int


class _EventQueue(asyncio.Queue):
    """A session's events, in order, except that views not read yet are replaced by newer ones: a launcher
    acts on the latest views only, and an application that does not read its events (a script waiting for
    its start, a benchmark's idle sessions) held every ``changeNotify`` it was sent -- 5,000 idle sessions
    grew a benchmark's process to 745 MB."""

    def _put(self, item: Event) -> None:
        q = self._queue  # type: ignore[attr-defined]  # (asyncio.Queue's storage: _put is its hook)
        if isinstance(item, ViewsChanged) and q and isinstance(q[-1], ViewsChanged):
            q[-1] = ViewsChanged(item.views, item.epoch, q[-1].bytes + item.bytes)
        else:
            q.append(item)


@dataclass(frozen=True)
class Started:
    request: str
    cluster: str
    nodes: tuple[str, ...]
    kept: tuple[str, ...]
    end: float | None


@dataclass(frozen=True)
class Killed:
    request: str
    reason: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Exited:
    """One process ended. ``code``: its exit status, or minus its signal, None if unknown (it ended while its
    agent was down); ``reason``: why it was killed (``ProcessExited.reason``)."""

    request: str
    node: str
    pid: int
    code: int | None
    killed: bool
    reason: str | None = None


class RMSStopped(Exception):
    """CooRM as a whole is stopping (``SystemStopping``): the session ends, its processes are killed."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"CooRM is stopping: {reason}")
        self.reason = reason


class SessionReaped(Exception):
    """The RMS ended this session while the application could not hear it -- its connection cut for longer
    than the session timeout, so no heartbeat reached the RMS (or the session was cancelled meanwhile) --
    and with it every request of the session: their processes were killed. Learnt when a heartbeat is
    answered again (``unknown_app``)."""

    def __init__(self, app: str, said: str = "") -> None:
        # ``said``: the RMS's answer, with why it ended the session when it still knows (``reaped: no
        # heartbeat for 40 s``)
        why = said or "no heartbeat reached it for the session timeout"
        super().__init__(f"CooRM ended session {app} while it could not hear this application ({why}): its "
                         "requests ended and their processes were killed")
        self.app, self.said = app, said


class SessionClosed(ConnectionClosedError):
    """This application closed the session (of its own connection): what still waited on it -- a command's
    answer, a start, exits -- ends with this at once, not at its own timeout (a ``ConnectionClosedError``, as
    the closed connection would say)."""

    def __init__(self, app: str) -> None:
        super().__init__()
        self.app = app

    def __str__(self) -> str:
        return f"session {self.app} was closed by the application"


@dataclass(frozen=True)
class Closed:
    """The session ended: closed by the application, or (``error`` set) its connection to CooRM was lost
    for longer than the reconnect window -- its requests are then no longer the application's to follow --,
    CooRM stopped (:class:`RMSStopped`) or it ended the session unheard (:class:`SessionReaped`)."""

    error: Exception | None = None


@dataclass(frozen=True)
class OfferReceived:
    """An offer the RMS sent on its own (``offer.unsolicited``: to a standing negotiation, as nodes freed
    up), or the news that an offer lapsed (``offer.lapsed``)."""

    offer: OfferMsg


Event = ViewsChanged | Started | Killed | Exited | Closed | OfferReceived


class ReplaceRefused(bus.WireError):
    """A replace (:meth:`Session.replace`) the RMS refused because a request it replaces is no longer waiting:
    ``code`` ``started`` (it started before the replace reached the RMS: the application keeps it, its
    :class:`Started` comes or came) or ``ended``. Nothing changed: the new requests were not submitted, the
    old ones were not cancelled. ``replaces``: the requests the replace named."""

    def __init__(self, code: ErrorCode, message: str, replaces: tuple[str, ...]) -> None:
        super().__init__(code, message)
        self.replaces = replaces


@dataclass
class _Stats:
    notifications: int = 0
    notification_bytes: int = 0
    messages_sent: int = 0
    recoveries: int = 0  # reconnections after which what was missed was asked for
    moves: int = 0  # moves off a NATS server that answered nothing to one through which the RMS answered


@dataclass
class Session:
    """One application's session. Create with :meth:`open`."""

    nc: NATS
    reply: SessionOpenReply
    settings: Settings
    own_connection: bool = True
    # a shared connection's owner lets this session move it off a server cut from the cluster (the batch
    # service: its sessions' heartbeats tell a cut before its own probe of JetStream can, which waits for the
    # stream's election when the cut server led it)
    moves_connection: bool = False
    np: dict[str, StepFunction] = field(default_factory=dict)
    p: dict[str, StepFunction] = field(default_factory=dict)
    now: float = 0.0
    epoch: int = -1
    stats: _Stats = field(default_factory=_Stats)
    closed: bool = False
    with_views: bool = True  # opened with views (False: the RMS sends none, and none is asked for)
    # how long a launch on a node the RMS said the request started on is asked again while its agent answers
    # not_owner (the assignment on its way: an agent cut from NATS learns it when it registers again, which
    # waits for a policy engine leader)
    assign_wait: float = 30.0

    def __post_init__(self) -> None:
        self._events: asyncio.Queue[Event] = _EventQueue()
        self._subs: list = []
        self._heartbeat: asyncio.Task | None = None
        self._started: dict[str, Started] = {}
        self._killed: set[str] = set()
        self._recovering: asyncio.Task | None = None
        self._unexited: dict[tuple[str, int], str] = {}  # (node, pid) launched, whose exit has not come
        self._exited: set[tuple[str, int]] = set()
        self._start_waiters: dict[str, list[asyncio.Future]] = {}
        self._exits: dict[str, list[Exited]] = {}
        self._exit_cond = asyncio.Condition()
        self._outputs: dict[str, asyncio.Queue] = {}
        self._all_output: asyncio.Queue | None = None
        self.lost: Exception | None = None  # Unreachable, RMSStopped, SessionReaped, SessionClosed
        self._gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()  # done once lost

    # ============================================================================================
    # opening and closing
    # ============================================================================================
    @classmethod
    async def open(cls, settings: Settings | None = None, *, clusters: list[str] | None = None, user: str = "",
                   name: str = "", kind: str = "", preemptive_views: bool = True, nc=None,
                   views: bool = True, moves_connection: bool = False) -> Session:
        """``subscribe``: open a session; the RMS answers with the application id and its subjects. The
        session is the user's whom the connection is authenticated as: the identity of ``settings`` (or
        ``user``, with a connection ``nc`` made for that user). ``views`` False: the application never
        reads its views (a rigid job): the RMS sends none and holds no node for it to re-select.
        ``moves_connection``: the session may move the shared connection ``nc`` off a server cut from the
        cluster, as it moves one of its own."""
        settings = settings or Settings()
        identity = settings.identity(Role.LAUNCHER)
        user = user or (identity.name if identity is not None else _whoami())
        own = nc is None
        opened: list[Session] = []  # the session, once there is one, for the connection's closed callback

        async def on_closed() -> None:
            for session in opened:
                await session._connection_lost()

        async def on_reconnected() -> None:
            for session in opened:
                session.reconnected()

        if nc is None:
            nc = await bus.connect_client(settings.nats_url, f"launcher-{kind or 'app'}",
                                          timeout=settings.connect_timeout,
                                          reconnect_window=settings.reconnect_window,
                                          source=settings.source_of("nats_url"), closed_cb=on_closed,
                                          reconnected_cb=on_reconnected, identity=identity)
        msg = SessionOpen(filter=Filter(clusters=clusters, preemptive_views=preemptive_views and views, views=views),
                          name=name, kind=kind, paced=True)
        # (sent again after a timeout: a session opened by the attempt that timed out is reaped, unheard of)
        reply = await _call_retrying(nc, subjects.session_open(user), msg, SessionOpenReply, after_timeout=_reraise,
                                     no_responders=_opening_look(nc, settings, kind)
                                     if own or moves_connection else None)
        self = cls(nc=nc, reply=reply, settings=settings, own_connection=own, with_views=views,
                   moves_connection=moves_connection)
        opened.append(self)
        await self._subscribe()
        self._heartbeat = asyncio.create_task(self._beat())
        return self

    @classmethod
    async def resume(cls, settings: Settings, reply: SessionOpenReply, nc, launched: dict[tuple[str, int], str],
                     *, views: bool = True, moves_connection: bool = False) -> Session:
        """Take up a session another process opened (the batch service's previous instance, from its
        records): listen and beat again, then ask what was missed meanwhile -- what started and ended, and
        how the processes ``launched`` ((node, pid) -> request) ended -- as after a reconnection. Raises
        :class:`~coorm.shared.bus.WireError` (``unknown_app``) when the RMS reaped the session meanwhile."""
        self = cls(nc=nc, reply=reply, settings=settings, own_connection=False, with_views=views,
                   moves_connection=moves_connection)
        # a heartbeat first: a session the RMS no longer has is refused here, before anything is subscribed
        self._follow(await _call_retrying(nc, reply.subjects.heartbeat, HeartbeatMsg(token=reply.token),
                                          HeartbeatAck))
        self._unexited.update(launched)
        await self._subscribe()
        self._heartbeat = asyncio.create_task(self._beat())
        self._recovering = asyncio.create_task(self._recover_after_reconnection())
        return self

    async def _subscribe(self) -> None:
        s = self.reply.subjects
        self._subs = [
            await self.nc.subscribe(s.change, cb=self._on_change),
            await self.nc.subscribe(s.start, cb=self._on_start),
            await self.nc.subscribe(s.kill, cb=self._on_kill),
            await self.nc.subscribe(subjects.notify_offer(self.app), cb=self._on_offer),
            await self.nc.subscribe(subjects.app_exited(self.app), cb=self._on_exit),
            await self.nc.subscribe(subjects.app_output_any(self.app), cb=self._on_output),
            await self.nc.subscribe(subjects.SYSTEM_STOPPING, cb=self._on_system_stopping),
        ]
        # the first changeNotify may have been sent before we listened: ask for the views as they stand (the
        # server handles a connection's commands in order, so the subscriptions are in place before the query
        # is; no flush needed). A session without views (a batch job's) has none to ask for: a round trip less
        if self.with_views:
            note = await _call_retrying(self.nc, subjects.app_views(self.app), InfoQuery(), ChangeNotify,
                                        timeout=QUERY_TIMEOUT, after_timeout=_reraise)
            if note.changes:
                self._apply_change(note, len(bus.encode(note)))

    async def close(self) -> None:
        """End the session: the RMS cancels what waits and ends what runs."""
        if self.closed:
            return
        self.closed = True
        self._events.put_nowait(Closed())
        if self._recovering is not None:
            self._recovering.cancel()
        if self._heartbeat:
            self._heartbeat.cancel()
            # (waited for, not awaited: the CancelledError it ends with is this cancel's, not the caller's --
            # raised in a launcher's clean-up after its own cancellation, it stopped the close before the RMS
            # was told, and the session held its nodes until it was reaped)
            await asyncio.wait([self._heartbeat])
        # (what goes wrong now changes nothing for the caller: the RMS reaps a session it did not hear close)
        await bus.quietly(self._call(self.reply.subjects.close, CloseMsg(token=self.token), Ack))
        if self.own_connection:  # closing the connection ends its subscriptions
            # what still waits on the session ends now: a launch in flight as the application closed waited its
            # whole 5 s for an answer the closed connection could not bring (the twin's PSAs, as each run
            # ended). On a shared connection (the batch service's) an answer still comes: it is awaited
            await self._end_waits(SessionClosed(self.app))
            await bus.quietly(self.nc.close())
            return
        for sub in self._subs:
            await bus.quietly(sub.unsubscribe())

    async def detach(self) -> None:
        """Stop following the session without ending it (no heartbeat, no subscriptions): another process
        takes it up with :meth:`resume` within the session timeout, or the RMS reaps it."""
        if self.closed:
            return
        self.closed = True
        for task in (self._recovering, self._heartbeat):
            if task is not None:
                task.cancel()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_system_stopping(self, raw) -> None:
        try:
            reason = bus.decode(raw.data, SystemStopping).reason
        except bus.WireError:
            reason = "(no reason given)"
        await self._connection_lost(RMSStopped(reason))

    async def _connection_lost(self, error: RMSStopped | SessionReaped | None = None) -> None:
        """The client gave up reconnecting (or the RMS said it stops): every wait ends with the error, and so
        does the event stream."""
        if self.closed:
            return  # our own close
        self.closed = True
        lost = error or bus.Unreachable(self.settings.nats_url, self.settings.source_of("nats_url"),
                                        self.settings.reconnect_window, lost=True)
        if self._heartbeat:
            self._heartbeat.cancel()
        self._events.put_nowait(Closed(lost))
        await self._end_waits(lost)

    async def _end_waits(self, error: Exception) -> None:
        """Every wait on the session -- a command's answer, a start, exits, views -- ends with ``error``, and so
        does every call made from now on."""
        self.lost = error
        for futs in self._start_waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(error)
        self._start_waiters.clear()
        if not self._gone.done():
            self._gone.set_result(None)
        async with self._exit_cond:
            self._exit_cond.notify_all()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def app(self) -> str:
        return self.reply.app

    @property
    def token(self) -> str:
        return self.reply.token

    @property
    def user(self) -> str:
        """The user the session belongs to (the one NATS authenticated: the application id names it)."""
        return subjects.owner(self.reply.app)

    def rid(self, name: str) -> str:
        """A request id of this application: ids are unique across the RMS, so prefix yours with the app id
        (the shipped launchers use ``<app>.<n>``)."""
        return f"{self.app}.{name}"

    # ============================================================================================
    # information
    # ============================================================================================
    async def clusters_info(self) -> ClustersInfoReply:
        """``listClustersInfo``."""
        return await self._call(subjects.CLUSTERS_INFO, InfoQuery(), ClustersInfoReply, query=True)

    async def inter_cluster_info(self) -> InterClusterInfoReply:
        """``listInterClusterInfo``."""
        return await self._call(subjects.CLUSTERS_INTERINFO, InfoQuery(), InterClusterInfoReply, query=True)

    async def cluster_props(self) -> ClusterProps:
        """Both, in the form the launcher decision objects take."""
        info, inter = await self.clusters_info(), await self.inter_cluster_info()
        return ClusterProps(
            nodes={c.id: c.nodes for c in info.clusters},
            speed={c.id: c.speed for c in info.clusters},
            latency_ms={(lk.a, lk.b): lk.latency_ms for lk in inter.links},
            bandwidth_mbps={(lk.a, lk.b): lk.bandwidth_mbps for lk in inter.links},
        )

    @property
    def views(self) -> Views:
        return Views(self.now, dict(self.np), dict(self.p))

    async def wait_views(self, timeout: float = 10.0) -> Views:
        """The views, once the first ``changeNotify`` has arrived."""
        async with self._exit_cond:
            await asyncio.wait_for(self._exit_cond.wait_for(lambda: self.epoch >= 0 or self.lost is not None),
                                   timeout)
        if self.epoch < 0 and self.lost is not None:
            raise self.lost
        return self.views

    # ============================================================================================
    # requests
    # ============================================================================================
    async def request(self, *specs: RequestSpec, replaces: Iterable[str] = ()) -> list[str]:
        """``request``: one batch, accepted or refused as a whole (:class:`~coorm.shared.bus.WireError`).
        ``replaces``: see :meth:`replace`."""
        replaced = tuple(replaces)

        def accepted_before(e: bus.WireError) -> Ack:
            if e.code is ErrorCode.DUPLICATE:  # the attempt that timed out was accepted (and replaced)
                return Ack(requests=[s.id for s in specs])
            raise e

        try:
            ack = await self._call(self.reply.subjects.request,
                                   RequestMsg(token=self.token, requests=list(specs), replaces=list(replaced)), Ack,
                                   after_timeout=accepted_before)
        except bus.WireError as e:
            if replaced and e.code in (ErrorCode.STARTED, ErrorCode.ENDED):
                raise ReplaceRefused(e.code, e.message, replaced) from None
            raise
        return ack.requests

    async def replace(self, old: str | Iterable[str], *specs: RequestSpec) -> list[str]:
        """Submit ``specs`` in place of the waiting request(s) ``old``, in one step: the RMS cancels them and
        accepts the batch together, so no pass runs between (a ``request`` then a ``done`` may see the old one
        start in between: CooRM Fig. 5's order). If one of them has started -- its :class:`Started` may not have
        come yet -- nothing changes and :class:`ReplaceRefused` is raised (``code`` ``started``): the
        application keeps what started. Other refusals are a :class:`~coorm.shared.bus.WireError`, as for
        ``request``."""
        return await self.request(*specs, replaces=(old,) if isinstance(old, str) else tuple(old))

    async def done(self, request: str, released: Iterable[str] = ()) -> None:
        """``done``: end a running request (releasing ``released`` node IDs if a NEXT successor keeps the
        rest) or cancel one not started yet."""
        def done_before(e: bus.WireError) -> Ack:
            if e.code in (ErrorCode.ENDED, ErrorCode.UNKNOWN_REQUEST):  # the attempt that timed out was done
                return Ack()
            raise e

        await self._call(self.reply.subjects.done, DoneMsg(token=self.token, request=request,
                                                           released=list(released)), Ack, after_timeout=done_before)

    async def update(self, current: str, new: RequestSpec, released: Iterable[str] = ()) -> str:
        """Spontaneous update (CooRMv2 §III-A3): ``request(new NEXT current)`` then ``done(current)``."""
        spec = RequestSpec.model_validate({**new.model_dump(), "related_to": current, "related_how": "NEXT"})
        await self.request(spec)
        await self.done(current, released)
        return spec.id

    async def announce(self, current: str, nodes: int, delta: float, new: RequestSpec) -> tuple[str, str]:
        """Announced update after ``delta`` seconds: ``request(n_current, delta, NEXT current)``,
        ``request(new NEXT that)``, ``done(current)``. Returns the bridge's and the new request's ids."""
        cur = self._started.get(current)
        cluster = cur.cluster if cur else new.cluster
        bridge = RequestSpec(id=f"{new.id}-bridge", type=RequestType.NON_PREEMPTIBLE, cluster=cluster, nodes=nodes,
                             duration=delta, related_to=current, related_how="NEXT")
        spec = RequestSpec.model_validate({**new.model_dump(), "related_to": bridge.id, "related_how": "NEXT"})
        await self.request(bridge, spec)
        await self.done(current)
        return bridge.id, spec.id

    # ============================================================================================
    # negotiation (the adaptive-RMS paper: offer, accept / counter / reject)
    # ============================================================================================
    async def negotiate(self, terms: NegotiationTerms) -> OfferMsg:
        """Open (or revise) a negotiation; the reply is the RMS's first offer (``offer`` None and
        ``waiting`` for a standing one with nothing now: the offer comes as an :class:`OfferReceived`)."""
        return await self._call(subjects.app_negotiate(self.app), NegotiateMsg(token=self.token, terms=terms),
                                OfferMsg)

    async def respond(self, offer: str, answer: Answer | str, nodes: int | None = None) -> RespondReply:
        """Answer ``offer``: ``accept`` (the reply names the request it became), ``counter`` with ``nodes``
        (the reply carries the next offer) or ``reject``."""
        answer = Answer(answer)

        def answered_before(e: bus.WireError) -> RespondReply:
            # the attempt that timed out was taken: an accepted offer became the negotiation's request
            if e.code is ErrorCode.UNKNOWN_OFFER and answer is Answer.ACCEPT:
                return RespondReply(request=offer.rsplit(".o", 1)[0])
            if e.code is ErrorCode.UNKNOWN_OFFER and answer is Answer.REJECT:
                return RespondReply()
            raise e

        return await self._call(subjects.app_respond(self.app),
                                RespondMsg(token=self.token, offer=offer, answer=answer, nodes=nodes),
                                RespondReply, after_timeout=answered_before)

    async def accept(self, offer: OfferMsg) -> str:
        """Accept ``offer``: the id of the request it became (it starts as offered)."""
        assert offer.offer is not None, "a waiting negotiation has no offer to accept"
        reply = await self.respond(offer.offer, Answer.ACCEPT)
        assert reply.request is not None
        return reply.request

    async def _on_offer(self, msg) -> None:
        self.stats.notifications += 1
        self.stats.notification_bytes += len(msg.data)
        self._events.put_nowait(OfferReceived(OfferMsg.model_validate_json(msg.data)))

    async def wait_start(self, request: str, timeout: float | None = None) -> Started:
        if request in self._started:
            return self._started[request]
        if self.lost is not None:
            raise self.lost
        fut = asyncio.get_running_loop().create_future()
        self._start_waiters.setdefault(request, []).append(fut)
        return await asyncio.wait_for(fut, timeout)

    # ============================================================================================
    # processes
    # ============================================================================================
    async def launch(self, request: str, node: str, argv: list[str], env: dict[str, str] | None = None,
                     cwd: str | None = None, launch_id: str | None = None, *, stdout: str | None = None,
                     stderr: str | None = None, open_mode: Literal["append", "truncate"] = "append") -> list[int]:
        """Start ``argv`` on ``node`` (which ``request`` must hold) through the node's agent. ``launch_id``:
        the same id sent again (by another process taking the session up) gets the first launch's pids.
        ``stdout`` (absolute, on the node) and ``stderr`` (by default the same file): files the output goes
        to instead of :meth:`output`, opened as the process's user (``open_mode``: append, or truncate at the
        process's start); a file the user cannot write refuses the launch (``bad_output``). A ``not_owner``
        refusal on a node the RMS said ``request`` started on is asked again for ``assign_wait`` seconds
        (the node's assignment may still be on its way to the agent), unless the request ends meanwhile."""
        import uuid

        msg = LaunchMsg(token=self.token, app=self.app, request=request, argv=argv, env=env or {}, cwd=cwd,
                        launch_id=launch_id or uuid.uuid4().hex, stdout=stdout, stderr=stderr,
                        open_mode=open_mode)
        # sent again after a timeout (its agent died, or held it until its registration was answered): the
        # launch id makes the agent answer a second attempt without starting it twice. Not sent again when
        # the agent answers unavailable (it is stopping)
        deadline: float | None = None
        pause = ASSIGN_RETRY[0]
        while True:
            try:
                pids = (await self._call(subjects.node_launch(node, self.user), msg, LaunchReply,
                                         retry_unavailable=False, after_timeout=_reraise)).pids
                break
            except bus.WireError as e:
                # the node's assignment and this startNotify take different paths (in a NATS cluster, other
                # routes; an agent cut from its server loses it until it registers again): a node the RMS
                # said is the request's may not be so at its agent yet. Asked again until the assignment
                # arrives, the request ends, or ``assign_wait`` passed: then the refusal stands
                now = asyncio.get_running_loop().time()
                deadline = deadline if deadline is not None else now + self.assign_wait
                if e.code is not ErrorCode.NOT_OWNER or not self._may_be_in_transit(request, node) or now >= deadline:
                    raise
                _log().info("launch refused before the node's assignment reached its agent: asking again",
                            app=self.app, request=request, node=node, error=e.message)
                await asyncio.sleep(min(pause, deadline - now))  # back-off: the agent has nothing to wait on
                pause = min(pause * 2, ASSIGN_RETRY[1])
        for pid in pids:
            if (node, pid) not in self._exited:  # (a quick one's exit may come before the launch's reply)
                self._unexited[node, pid] = request
        return pids

    def _may_be_in_transit(self, request: str, node: str) -> bool:
        """Whether a refusal of a launch of ``request`` on ``node`` may be the node's assignment still on its
        way to the agent: the RMS said the request started on that node, and has not said it ended."""
        started = self._started.get(request)
        return (started is not None and node in started.nodes and request not in self._killed
                and self.lost is None and not self.closed)

    async def wait_exits(self, request: str, count: int, timeout: float | None = None) -> list[Exited]:
        """The first ``count`` process exits of ``request``."""
        async with self._exit_cond:
            await asyncio.wait_for(self._exit_cond.wait_for(
                lambda: len(self._exits.get(request, ())) >= count or self.lost is not None), timeout)
            if len(self._exits.get(request, ())) < count and self.lost is not None:
                raise self.lost
            return list(self._exits[request][:count])

    def output(self, request: str) -> AsyncIterator[ProcessOutput]:
        """What the request's processes print, as it comes (subscribe before launching)."""
        q = self._outputs.setdefault(request, asyncio.Queue())

        async def it():
            while True:
                yield await q.get()

        return it()

    def all_output(self) -> asyncio.Queue:
        """Every process's output, whatever its request (from now on, instead of :meth:`output`)."""
        if self._all_output is None:
            self._all_output = asyncio.Queue()
        return self._all_output

    # ============================================================================================
    # notifications
    # ============================================================================================
    async def events(self) -> AsyncIterator[Event]:
        while True:
            yield await self._events.get()

    async def next_event(self, timeout: float | None = None) -> Event:
        return await asyncio.wait_for(self._events.get(), timeout)

    async def _on_change(self, msg) -> None:
        self._apply_change(ChangeNotify.model_validate_json(msg.data), len(msg.data))
        async with self._exit_cond:
            self._exit_cond.notify_all()

    def _apply_change(self, note: ChangeNotify, size: int) -> None:
        if note.epoch < self.epoch:
            return  # an older schedule than the one we hold
        for ch in note.changes:
            if ch.cap is None:
                continue
            fn = StepFunction.from_wire(ch.cap)
            (self.np if ch.type is ChangeType.NON_PREEMPTIVE else self.p)[ch.cluster] = fn
        self.now, self.epoch = note.now, note.epoch
        self.stats.notifications += 1
        self.stats.notification_bytes += size
        self._events.put_nowait(ViewsChanged(self.views, note.epoch, size))

    async def _on_start(self, msg) -> None:
        self.stats.notifications += 1
        self.stats.notification_bytes += len(msg.data)
        self._deliver_start(StartNotify.model_validate_json(msg.data))

    def _deliver_start(self, note: StartNotify) -> None:
        if note.request in self._started:
            return  # told twice: by the recovery after a reconnection, then by the notification itself
        ev = Started(note.request, note.cluster, tuple(note.nodes), tuple(note.kept), note.end)
        self._started[note.request] = ev
        for fut in self._start_waiters.pop(note.request, []):
            if not fut.done():
                fut.set_result(ev)
        self._events.put_nowait(ev)

    async def _on_kill(self, msg) -> None:
        self.stats.notifications += 1
        self.stats.notification_bytes += len(msg.data)
        self._deliver_kill(KillNotify.model_validate_json(msg.data))

    def _deliver_kill(self, note: KillNotify) -> None:
        if note.request in self._killed:
            return
        self._killed.add(note.request)
        self._events.put_nowait(Killed(note.request, note.reason.value, tuple(note.nodes)))

    def reconnected(self) -> None:
        """The shared connection this session was given (``Session.open(nc=...)``, ``resume``) came back
        from a cut: ask what was missed meanwhile, as a session with a connection of its own does."""
        if self._recovering is not None:
            self._recovering.cancel()
        self._recovering = asyncio.create_task(self._recover_after_reconnection())

    async def _recover_after_reconnection(self) -> None:
        """Ask at once, and once more a little later: a start or an exit told while this connection was
        cut, by a service whose own records were not yet written when the first answer was read, is in
        the second."""
        await self._recover()
        await asyncio.sleep(RECOVER_AGAIN)  # the second look's delay, not a synchronisation
        await self._recover()

    async def _recover(self) -> None:
        """The connection is back (a nats-server restarted): what was sent while it was cut is lost. Ask for
        the views as they stand and for what started and ended, and take what was missed as if heard."""
        if self.closed:
            return
        try:
            if self.with_views:
                note = await _call_retrying(self.nc, subjects.app_views(self.app), InfoQuery(), ChangeNotify,
                                            timeout=QUERY_TIMEOUT, after_timeout=_reraise)
                if note.changes:
                    self._apply_change(note, len(bus.encode(note)))
            reply = await _call_retrying(self.nc, subjects.app_allocations(self.app),
                                         AllocationsQuery(token=self.token), AllocationsReply)
        except bus.WireError as e:
            if e.code is ErrorCode.UNKNOWN_APP:
                await self._reaped(e.message)
            else:
                _log().warning("could not recover what was missed while disconnected", app=self.app, error=repr(e))
            return
        except Exception as e:  # noqa: BLE001 - the next reconnection asks again; the notifications go on
            _log().warning("could not recover what was missed while disconnected", app=self.app, error=repr(e))
            return
        await self._missed_exits()
        self.stats.recoveries += 1
        for rec in reply.allocations:
            self._deliver_start(StartNotify(app=self.app, request=rec.request, cluster=rec.cluster, nodes=rec.nodes,
                                            kept=rec.kept, end=rec.end))
            if rec.ended is not None:
                self._deliver_kill(KillNotify(app=self.app, request=rec.request, reason=rec.ended, nodes=rec.nodes))
        async with self._exit_cond:
            self._exit_cond.notify_all()

    async def _reaped(self, said: str = "") -> None:
        """The RMS no longer has this session: it ended it unheard. The exits of its processes, which their
        agents killed, are asked for (what the agents still answer is told), then every wait ends with
        :class:`SessionReaped`, and so does the event stream."""
        if self.closed:
            return
        _log().warning("the RMS ended this session while it could not hear it", app=self.app)
        await self._missed_exits()
        await self._connection_lost(SessionReaped(self.app, said))

    async def _missed_exits(self) -> None:
        """Ask each agent this session launched on for the exits not heard of (told while the connection was
        cut)."""
        for node in sorted({n for n, _ in self._unexited}):
            gone = await self._ask_exits(node)
            if gone is None:
                continue
            for note in gone.exits:
                if (note.node, note.pid) in self._unexited:
                    await self._deliver_exit(note)

    async def _ask_exits(self, node: str) -> ExitsReply | None:
        """``node``'s agent's answer (None: none came; its agent may be down, and its exits come when it is
        back). A query changes nothing: one unanswered is sent again (:data:`MISSED_EXITS_RESEND`) -- just
        after a cut server rejoins its cluster, a request or its reply may cross a route not yet back."""
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        loop = asyncio.get_running_loop()
        resends = Resends(MISSED_EXITS_WITHIN, MISSED_EXITS_RESEND, loop.time())
        while True:
            try:
                return await bus.call(self.nc, subjects.node_exits(node, self.user),
                                      ExitsQuery(token=self.token, app=self.app),
                                      ExitsReply, timeout=resends.timeout(loop.time()))
            except (NatsTimeout, NoRespondersError) as e:
                if not resends.retry(loop.time()):
                    _log().warning("could not ask an agent for missed exits", node=node, error=repr(e))
                    return None
                if isinstance(e, NoRespondersError):  # (refused at once: not sent again at once)
                    await asyncio.sleep(min(MISSED_EXITS_RESEND, resends.timeout(loop.time())))
            except Exception as e:  # noqa: BLE001 - its agent may be down: its exits come when it is back
                _log().warning("could not ask an agent for missed exits", node=node, error=repr(e))
                return None

    async def _on_exit(self, msg) -> None:
        await self._deliver_exit(ProcessExited.model_validate_json(msg.data))

    async def _deliver_exit(self, note: ProcessExited) -> None:
        if self._unexited.pop((note.node, note.pid), None) is None and (note.node, note.pid) in self._exited:
            return  # told twice: by the recovery after a reconnection, then by the notification itself
        self._exited.add((note.node, note.pid))
        ev = Exited(note.request, note.node, note.pid, note.code, note.killed, note.reason)
        async with self._exit_cond:
            self._exits.setdefault(note.request, []).append(ev)
            self._exit_cond.notify_all()
        self._events.put_nowait(ev)

    async def _on_output(self, msg) -> None:
        out = ProcessOutput.model_validate_json(msg.data)
        if self._all_output is not None:
            self._all_output.put_nowait(out)
        else:
            self._outputs.setdefault(out.request, asyncio.Queue()).put_nowait(out)

    # ============================================================================================
    # plumbing
    # ============================================================================================
    async def _call(self, subject: str, message, reply, *, retry_unavailable: bool = True,
                    after_timeout: AfterTimeout | None = None, query: bool = False):
        """``query``: a question that changes nothing, asked again after a timeout too (sooner: its server
        may be busy riding over a failover, as the view publisher is over the Valkey primary's)."""
        if self.lost is not None:
            raise self.lost
        self.stats.messages_sent += 1
        # a request in flight when the connection is lost for good would wait for its whole timeout (nats-py
        # leaves it pending): it ends with the loss instead
        call = asyncio.ensure_future(_call_retrying(self.nc, subject, message, reply,
                                                    retry_unavailable=retry_unavailable,
                                                    after_timeout=_reraise if query else after_timeout,
                                                    timeout=QUERY_TIMEOUT if query else CALL_TIMEOUT))
        try:
            await asyncio.wait((call, self._gone), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()  # its caller is gone (a launcher stopped): it must not fail later, unheard
            raise
        if call.done():
            if call.cancelled():
                # not by us: nats-py cancelled what the call waited on (a connection the server reset, closed
                # under it). The caller is told the connection failed, not that it was itself cancelled
                raise self.lost if self.lost is not None else ConnectionClosedError()
            return call.result()
        call.cancel()
        assert self.lost is not None
        raise self.lost

    async def _beat(self) -> None:
        # ``closed`` ends the loop even if ``close``'s cancellation is lost: Python 3.11's ``wait_for`` drops
        # a cancellation that comes as the reply lands, and the loop went on beating while ``close`` waited
        look_every, unanswered = 1, 0
        while not self.closed:
            await asyncio.sleep(self.reply.heartbeat_interval)  # the heartbeat's period
            if self.closed:
                return
            try:
                self._follow(await _call_retrying(self.nc, self.reply.subjects.heartbeat,
                                                  HeartbeatMsg(token=self.token), HeartbeatAck, attempts=1,
                                                  timeout=heartbeat_timeout(self.reply)))
                look_every, unanswered = 1, 0
                continue
            except bus.WireError as e:
                if e.code is ErrorCode.UNKNOWN_APP:
                    await self._reaped(e.message)
                    return
                unanswered += 1
            except Exception:  # noqa: BLE001 - the next beat tries again; a cut server is looked for below
                unanswered += 1
            # not answered: the RMS is between two leaders, or this connection's server is cut from the
            # cluster (alive, so the client stays with it, but nothing beyond it hears). Asked elsewhere
            # after 1, 2, 4, 8 unanswered beats: a long take-over costs every session a few looks, no more
            if unanswered >= look_every:
                unanswered = 0
                look_every = 1 if await self._leave_if_cut_off() else min(2 * look_every, bus.MAX_LOOK_EVERY)

    def _follow(self, ack: HeartbeatAck) -> None:
        """Beat at the pace the RMS told (it holds heartbeats to a rate: with more sessions, each beats less
        often); the session's reply says it from then on, for every heartbeat's wait too."""
        pace = {"heartbeat_interval": ack.heartbeat_interval, "session_timeout": ack.session_timeout}
        pace = {k: v for k, v in pace.items() if v is not None and v != getattr(self.reply, k)}
        if pace:
            self.reply = self.reply.model_copy(update=pace)

    async def _leave_if_cut_off(self) -> bool:
        """Whether the RMS answered this session's heartbeat through another server of its URL list (then the
        connection moves there, and the session asks what it missed, as after any reconnection). Only a
        connection the session made, or a shared one whose owner said so (``moves_connection``)."""
        if not (self.own_connection or self.moves_connection):
            return False

        def moving(here: str, url: str) -> None:
            _log().warning("the RMS answers through another NATS server, not through this one: moving there",
                           app=self.app, cut=here, to=redact(url))
            self.stats.moves += 1

        return await bus.leave_if_cut_off(self.nc, nats_servers(self.settings.nats_url), self._answered_through,
                                          self._answered_here, moving)

    async def _answered_here(self) -> bool:
        return await bus.answered(self.nc, lambda here: _call_retrying(
            here, self.reply.subjects.heartbeat, HeartbeatMsg(token=self.token), HeartbeatAck, attempts=1,
            timeout=heartbeat_timeout(self.reply)))

    async def _answered_through(self, url: str) -> bool:
        """A heartbeat sent over a connection of its own to ``url``: answered, the session is kept alive too."""
        return await bus.answered_through(
            url, f"launcher-look-{self.app}", self.settings.identity(Role.LAUNCHER),
            bus.asking(self.reply.subjects.heartbeat, HeartbeatMsg(token=self.token), HeartbeatAck,
                       timeout=heartbeat_timeout(self.reply)))


def _opening_look(nc, settings: Settings, kind: str) -> Callable[[int], Awaitable[bool]]:
    """What an opening does when nobody serves it: after the 1st, 2nd, 4th, 8th... attempt, whether the policy
    engine answers a status query through another server of the URL list -- then the connection moves there.
    A session opened on a server already cut from its cluster has no heartbeat to miss yet (the agent's
    registration does the same). During a take-over no server answers: the looks find nothing."""
    from coorm.shared.protocol import StatusQuery, StatusReply

    urls = nats_servers(settings.nats_url)
    ask = bus.asking(subjects.QUERY_STATUS, StatusQuery(limit=0), StatusReply, timeout=QUERY_TIMEOUT)

    async def here() -> bool:
        return await bus.answered(nc, ask)

    async def there(url: str) -> bool:
        return await bus.answered_through(url, f"launcher-look-{kind or 'app'}", settings.identity(Role.LAUNCHER),
                                          ask)

    def moving(cut: str, url: str) -> None:
        _log().warning("the RMS answers through another NATS server, not through this one: moving there before "
                       "opening", cut=cut, to=redact(url))

    async def look(n: int) -> bool:
        if len(urls) < 2 or n & (n + 1):  # (after attempts 0, 1, 3, 7...: 1, 2, 4, 8 unserved)
            return False
        return await bus.leave_if_cut_off(nc, urls, there, here, moving)

    return look


def heartbeat_timeout(reply: SessionOpenReply) -> float:
    """How long one heartbeat waits for its answer: a quarter of the session timeout (at most its period
    again), so that a heartbeat lost with a dying leader leaves time for several more to reach the next
    one before the session could be reaped."""
    timeout = reply.session_timeout if reply.session_timeout is not None else 4 * reply.heartbeat_interval
    return max(0.05, min(timeout / 4, max(reply.heartbeat_interval, 0.05) * 2))


# one attempt's wait for a reply: a request that reached a leader as it died is sent again after this (a
# standby takes over within a lease, 3 s by default; it gives shrinks asked before it this long more)
CALL_TIMEOUT = bus.RESEND_AFTER
RECOVER_AGAIN = 2.0  # seconds after a reconnection, what was missed is asked for a second time
QUERY_TIMEOUT = 2.0  # the same for a query that changes nothing (the views): sent again sooner
ASSIGN_RETRY = (0.05, 0.5)  # first and longest pause between two launches refused while an assignment is on its way


AfterTimeout = Callable[[bus.WireError], object]


# s: how long the exits of a session the RMS reaped are asked of an agent, and after how long one unanswered
# query is sent again (then after twice as long)
MISSED_EXITS_WITHIN = 5.0
MISSED_EXITS_RESEND = 1.0


async def _call_retrying(nc, subject: str, message, reply, *, attempts: int = 40, timeout: float = CALL_TIMEOUT,
                         retry_unavailable: bool = True, after_timeout: AfterTimeout | None = None,
                         no_responders: Callable[[int], Awaitable[object]] | None = None):
    """Request/reply that rides over a policy engine take-over or a Redis restart: nobody answering (no
    leader for a moment) and ``unavailable`` (it could not be logged, so it was not applied) are retried.
    A timeout (a request that reached a leader as it died) is retried only with ``after_timeout``: the
    command may have been applied, so what a retry is refused with after a timeout (``duplicate`` for a
    request already accepted, ``ended`` for a ``done`` already done) goes to ``after_timeout``, which
    returns the reply the first attempt would have had -- or raises. ``no_responders(n)`` is awaited after the
    n-th attempt nobody served (from 0), before the next."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    delay = 0.05
    timed_out = False
    for i in range(attempts):
        try:
            return await bus.call(nc, subject, message, reply, timeout=timeout)
        except NatsTimeout:
            if after_timeout is None or i == attempts - 1:
                raise
            timed_out = True
            continue
        except (NoRespondersError, bus.WireError) as e:
            if isinstance(e, bus.WireError) and timed_out and after_timeout is not None \
                    and e.code is not ErrorCode.UNAVAILABLE:
                return after_timeout(e)
            if i == attempts - 1 or (isinstance(e, bus.WireError)
                                     and (e.code is not ErrorCode.UNAVAILABLE or not retry_unavailable)):
                raise
            if no_responders is not None and isinstance(e, NoRespondersError):
                await no_responders(i)
            await asyncio.sleep(delay)  # back-off before asking again
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


def _reraise(e: bus.WireError) -> object:
    raise e


def _log():
    import structlog

    return structlog.get_logger("coorm.sdk")


def _whoami() -> str:
    import getpass

    with contextlib.suppress(Exception):
        return getpass.getuser()
    return ""


class SyncSession:
    """A blocking wrapper for scripts: every coroutine method of :class:`Session`, run on a private loop."""

    def __init__(self, settings: Settings | None = None, **kw) -> None:
        self._loop = asyncio.new_event_loop()
        self._s: Session = self._loop.run_until_complete(Session.open(settings, **kw))

    def __getattr__(self, name: str):
        attr = getattr(self._s, name)
        if asyncio.iscoroutinefunction(attr):
            return lambda *a, **k: self._loop.run_until_complete(attr(*a, **k))
        return attr

    def close(self) -> None:
        self._loop.run_until_complete(self._s.close())
        self._loop.close()

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

