"""The policy engine service: the I/O shell around the scheduling cores (DESIGN §2, §5).

Theory of operation
* **One writer.** Every input that changes state -- a session opening or closing, requests, ``done``,
  nodes coming up or going down, time passing -- becomes one core event, stamped with the wall clock and a
  stimulus id, appended to the event log in Redis (``keys.EVENT_LOG``) *before* it is applied and before
  the caller gets its reply. So nothing accepted is ever lost: the cores are deterministic (property-tested),
  and replaying the log through fresh cores rebuilds exactly the state the last leader had. Every
  ``snapshot_every`` events the cores' state is saved (``keys.SNAPSHOT``) and the log before it trimmed
  (:mod:`coorm.services.policy_engine.snapshot`): a replay starts from the snapshot.
* **One leader.** The engine holds a lease in Redis (``keys.POLICY_LEASE``) and renews it (from a thread:
  :mod:`coorm.services.policy_engine.lease`); a second
  instance waits as a standby and takes over, replaying the log, when the lease lapses. It serves nothing
  while standby, so launchers' requests reach only the leader.
* The policy core and the allocator core run together here (:class:`coorm.services.coupled.CoupledCores`) so that
  node events and decisions have one order; the node allocator service does the node I/O from the ordered
  decision stream (``subjects.DECISIONS``, durable, de-duplicated by decision id, so a new leader may
  republish the decisions of the last events without doubling them).
* After a pass, the views of the applications whose views changed go to the view publisher
  (``subjects.SCHEDULE_EPOCH``) in paced rounds (:mod:`coorm.services.policy_engine.view_pacing`: at most one
  round per ``view_period``, fewer when rounds are large, a preemption at once), lifecycle events to
  accounting (``subjects.LIFECYCLE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import time
import uuid
from typing import Annotated

import nats.errors
import structlog
from nats.aio.msg import Msg
from pydantic import Field, TypeAdapter, ValidationError
from redis.exceptions import RedisError

from coorm.services.coupled import CoupledCores
from coorm.services.policy_engine import observe
from coorm.services.policy_engine.core import RUNNING_FIRST, WAITING_FIRST, PolicyCore, PolicySettings
from coorm.services.policy_engine.heartbeat_pacing import HeartbeatPace
from coorm.services.policy_engine.lease import LeaseKeeper
from coorm.services.policy_engine.shares import POLICIES
from coorm.services.policy_engine.snapshot import WRITE as _WRITE_SNAPSHOT
from coorm.services.policy_engine.snapshot import Snapshot, SnapshotError
from coorm.services.policy_engine.status import counts_of
from coorm.services.policy_engine.view_pacing import ViewPacer
from coorm.services.runtime import clock, ensure_streams, redis_client, stay_in_the_cluster
from coorm.shared import bus, keys, metrics, subjects
from coorm.shared.endpoints import Role
from coorm.shared.events import (
    Accepted,
    CapacityChanged,
    CloseSession,
    Done,
    EndRequest,
    ErrorCode,
    Negotiate,
    NodeDown,
    NodeDrain,
    NodesAssigned,
    NodesFreed,
    Offered,
    OfferLapsed,
    OpenSession,
    PreemptionDeadline,
    RegisterNodes,
    Rejected,
    Respond,
    SessionEnded,
    StartRequest,
    Submit,
    Tick,
    ViewsChanged,
)
from coorm.shared.negotiation import Answer
from coorm.shared.protocol import (
    Ack,
    AllocatorDecisions,
    AppViews,
    CloseMsg,
    DoneMsg,
    HeartbeatAck,
    HeartbeatMsg,
    Lifecycle,
    LifecycleKind,
    NegotiateMsg,
    NodesEvent,
    OfferMsg,
    RequestMsg,
    RespondMsg,
    RespondReply,
    SessionOpen,
    SessionOpenReply,
    SessionSubjects,
    StatusQuery,
    StatusReply,
    ViewsEpoch,
    ViewsQuery,
    heartbeat_token,
)
from coorm.shared.requests import RequestSpec
from coorm.shared.settings import Settings
from coorm.shared.tasks import cancelled

log = structlog.get_logger("coorm.policy_engine")

LoggedEvent = Annotated[
    OpenSession | CloseSession | Submit | Done | Tick | RegisterNodes | NodeDown | NodeDrain | Negotiate | Respond,
    Field(discriminator="kind")
]
_EVENTS = TypeAdapter(LoggedEvent)
_ACK = bus.encode(Ack())  # a heartbeat's answer to a session not paced, the same every time
_BATCH = 256  # events logged in one Redis round trip at most
# on take-over, decisions of the last events are published again (JetStream drops those it has, by id):
# more than a batch, as a leader that dies while publishing a full batch's decisions leaves up to a batch
# of logged events whose decisions may not have reached JetStream
_REPUBLISH = 2 * _BATCH
# a stream message not acknowledged in this time is taken as refused: JetStream answers in milliseconds, but a
# message sent while the stream elects a leader (its leader cut from the cluster, seen in the partition test)
# is dropped by the followers unanswered -- nats-py's publish_async would wait for its acknowledgement for
# ever. (5 s is what nats-py's own acknowledged publish waits, its JetStream context's default timeout.)
_ACK_WITHIN = 5.0
_ENDED_KEPT = 10_000  # sessions whose end a launcher unheard meanwhile is told the reason of
_VIEWS_PER_MESSAGE = 256  # a round's views are split so that a message stays far below NATS's max payload

# decisions the node allocator acts on
_FOR_ALLOCATOR = (StartRequest, EndRequest, SessionEnded, PreemptionDeadline, NodesAssigned, NodesFreed,
                  CapacityChanged)

# the events of a batch appended to the log, and the counter set, only by the lease's holder: a leader that
# lost its lease without knowing it yet (its renewal not due) must not append to a log a new leader replays.
# KEYS: lease, log, counter; ARGV: instance, counter, then per event its JSON and "1" when its pass is
# deferred (a replay runs the passes where the leader ran them). The entries' ids, or nil for not the holder.
_APPEND = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return nil end
local ids = {}
for i = 3, #ARGV, 2 do
  if ARGV[i + 1] == '1' then
    ids[#ids + 1] = redis.call('xadd', KEYS[2], '*', 'e', ARGV[i], 'd', '1')
  else
    ids[#ids + 1] = redis.call('xadd', KEYS[2], '*', 'e', ARGV[i])
  end
end
redis.call('set', KEYS[3], ARGV[2])
return ids
"""

# a new application id (subjects.app_id: ARGV[2] is its prefix) and its session's record, in one round trip
_NEW_SESSION = """
local app = ARGV[2] .. redis.call('incr', KEYS[1])
redis.call('hset', KEYS[2], app, ARGV[1])
return app
"""


def grace_again(policy: PolicyCore, now: float) -> int:
    """Every preemption deadline moved to at least ``now`` plus the grace and the clients' resend time (a
    take-over at ``now``: a ``done`` that reached the dead leader is sent to this one only after
    :data:`~coorm.shared.bus.RESEND_AFTER`); how many moved."""
    moved = 0
    until = now + policy.settings.preempt_grace + bus.RESEND_AFTER
    for app in policy.apps.values():
        for cluster, deadline in app.deadlines.items():
            if deadline < until:
                app.deadlines[cluster] = until
                moved += 1
    return moved


def _changing_leader() -> bus.WireError:
    """What is answered while no term leads here: the SDK retries it."""
    return bus.WireError(ErrorCode.UNAVAILABLE, "the policy engine is changing leader: retry")


def _within_filter(requests: list[RequestSpec], clusters: list[str] | None) -> list[RequestSpec]:
    """A request that leaves its cluster to the RMS and names none it allows may go to the clusters of its
    session's filter (those it can use), when the filter names some."""
    if not clusters:
        return requests
    allowed = list(dict.fromkeys(clusters))
    return [r.model_copy(update={"clusters": allowed}) if r.placement and r.clusters is None else r
            for r in requests]


def policy_settings(s: Settings) -> PolicySettings:
    """The core's settings; a policy name it does not know is a :class:`SettingError` naming the variable
    and the names it knows."""
    try:
        return PolicySettings(fair_start=s.fair_start, reschedule_interval=s.reschedule_interval,
                              preempt_grace=s.preempt_grace, preemptible=s.malleable_policy,
                              precedence=s.precedence, local_threshold=s.local_threshold,
                              pass_burst=s.pass_burst, oversize_waits=s.oversize_waits)
    except ValidationError as e:
        raise SettingError(_explain_settings(s, e)) from None



class SettingError(ValueError):
    pass


_VARIABLES = {"preemptible": "COORM_MALLEABLE_POLICY (or COORM_PREEMPTIBLE)", "precedence": "COORM_PRECEDENCE",
              "local_threshold": "COORM_LOCAL_THRESHOLD"}
_KNOWN = {"preemptible": "|".join(POLICIES), "precedence": f"{RUNNING_FIRST}|{WAITING_FIRST}"}


def _explain_settings(s: Settings, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        known = _KNOWN.get(field)
        what = f"one of {known}" if known else e["msg"]
        parts.append(f"{_VARIABLES.get(field, field)}={e.get('input')!r}: {what}")
    return "; ".join(parts)


def session_subjects(app: str) -> SessionSubjects:
    return SessionSubjects(request=subjects.app_request(app), done=subjects.app_done(app),
                           close=subjects.app_close(app), heartbeat=subjects.app_heartbeat(app),
                           change=subjects.notify_change(app), start=subjects.notify_start(app),
                           kill=subjects.notify_kill(app))


def decision_messages(decisions: list, limit: int) -> list[bytes]:
    """The decisions, in order, as messages of at most ``limit`` bytes each (a session closed with ten
    thousand requests ends them all in one event: one message would exceed the server's max payload, and a
    logged event's decisions must all go out)."""
    if not decisions:
        return []
    whole = bus.encode(AllocatorDecisions(decisions=decisions))
    if len(whole) <= limit or len(decisions) == 1:
        return [whole]
    half = len(decisions) // 2
    return decision_messages(decisions[:half], limit) + decision_messages(decisions[half:], limit)


async def _first(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


class PolicyEngine:
    def __init__(self, settings: Settings, instance: str | None = None) -> None:
        self.settings = settings
        self.instance = instance or f"policy-{uuid.uuid4().hex[:8]}"
        self.cores: CoupledCores | None = None
        self.sessions: dict[str, dict] = {}  # app -> {token, user, name, kind, filter}
        self.last_seen: dict[str, float] = {}
        self.leader = asyncio.Event()
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._wake = asyncio.Event()
        self._views_wake = asyncio.Event()
        self.pacer = ViewPacer()
        self.pace = HeartbeatPace(base=settings.launcher_heartbeat, timeout=settings.session_timeout,
                                  rate=settings.heartbeat_rate, longest=settings.heartbeat_longest)
        self._paced, self._paced_ack = Ack(), _ACK  # a paced session's heartbeat answer (_told_pace)
        self._ended_why: dict[str, str] = {}  # app -> why its session ended, the latest _ENDED_KEPT (this term's)
        self._subs: list = []
        self._resign = asyncio.Event()  # set when the leader must step down (an event it could not log)
        self._lease_from = 0.0  # (monotonic) when the lease this instance holds was taken
        self.nc = None
        self.js = None
        self.redis = None

    # ============================================================================================
    # lifecycle: standby, lead, stop
    # ============================================================================================
    async def run(self, stop: asyncio.Event) -> None:
        observe.init()
        self.redis = redis_client(self.settings.redis_url)
        self.nc = await bus.connect(self.settings.nats_url, self.instance, self.settings.identity(Role.SERVICE))
        self.js = self.nc.jetstream()
        await ensure_streams(self.js, self.settings.stream_replicas)
        # (a leader or standby on a NATS server cut from its cluster moves to one that is not: it would lead
        # where no application and no agent hears it)
        watch = asyncio.create_task(stay_in_the_cluster(self.nc, self.settings, self.instance))
        try:
            while not stop.is_set():
                try:
                    if await self._acquire():
                        await self._lead(stop)
                        continue
                except (RedisError, OSError, nats.errors.Error) as e:
                    # Redis (or NATS) gone for a moment: stand by and try again; a standby must outlive an
                    # outage to take over after it
                    log.warning("cannot lead now: standing by", instance=self.instance, error=repr(e))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.leader_lease / 3)
        finally:
            with contextlib.suppress(Exception):  # (the lease is released and NATS left whatever the watch met)
                await cancelled(watch)
            await self._release()
            await bus.shutdown(self.nc)
            await self.redis.aclose()

    async def _acquire(self) -> bool:
        ms = int(self.settings.leader_lease * 1000)
        sent = time.monotonic()
        if not await self.redis.set(keys.POLICY_LEASE, self.instance, nx=True, px=ms):
            return False
        self._lease_from = sent  # (Valkey counts the lease from when it took the command: no sooner)
        return True

    async def _release(self) -> None:
        if self.redis is None:
            return
        with contextlib.suppress(Exception):
            if await self.redis.get(keys.POLICY_LEASE) == self.instance:
                await self.redis.delete(keys.POLICY_LEASE)

    async def _lead(self, stop: asyncio.Event) -> None:
        # the lease is kept from the moment it was acquired, through the restore: on a loaded machine the
        # restore (replaying the log, publishing the last decisions again) and the first views took longer
        # than a lease, which lapsed before its first renewal; the standby took it and restored in turn, and
        # the two engines took turns for seconds after each take-over (a Valkey failover)
        self._resign = asyncio.Event()
        lease = asyncio.create_task(self._keep_lease(stop))
        tasks: list[asyncio.Task] = []
        try:
            await self._restore(lease)
            if lease.done():
                return  # lost while restoring: whoever holds it now leads
            if not await self._grace_again():
                return  # (its lease lapses: whoever takes it next tries again)
            log.info("leading", instance=self.instance, events=self._replayed, apps=len(self.sessions))
            self._subs = [
                await bus.serve(self.nc, subjects.SESSION_OPEN_ANY, SessionOpen, self._on_open, concurrent=True),
                await bus.serve(self.nc, subjects.APP_REQUEST_ANY, RequestMsg, self._on_request, concurrent=True),
                await bus.serve(self.nc, subjects.APP_DONE_ANY, DoneMsg, self._on_done, concurrent=True),
                await bus.serve(self.nc, subjects.APP_CLOSE_ANY, CloseMsg, self._on_close, concurrent=True),
                # (in turn: a heartbeat's handling never waits, and a task each -- 500 a second with 1,000
                # sessions -- was a cost of its own)
                await bus.serve(self.nc, subjects.APP_HEARTBEAT_ANY, HeartbeatMsg, self._on_heartbeat,
                                fast=self._heartbeat_heard),
                await bus.serve(self.nc, subjects.APP_NEGOTIATE_ANY, NegotiateMsg, self._on_negotiate,
                                concurrent=True),
                await bus.serve(self.nc, subjects.APP_RESPOND_ANY, RespondMsg, self._on_respond, concurrent=True),
                await bus.serve(self.nc, subjects.NODES_EVENT, NodesEvent, self._on_nodes),
                await bus.serve(self.nc, subjects.VIEWS_QUERY, ViewsQuery, self._on_views_query),
                await bus.serve(self.nc, subjects.QUERY_STATUS, StatusQuery, self._on_status),
            ]
            self.leader.set()
            await self._publish_views(full=True)
            tasks = [asyncio.create_task(self._sequencer()), asyncio.create_task(self._timer_loop()),
                     asyncio.create_task(self._reaper_loop()), asyncio.create_task(self._gauges_loop()),
                     asyncio.create_task(self._views_loop())]
            metrics.leader.set(1)
            # until the lease is lost, the leader resigns or the service stops -- at once: a renewal under way
            # may wait on a Valkey primary that died (the socket's timeout), and meanwhile this term's handlers
            # would take events no sequencer logs any more
            ended = asyncio.create_task(_first(stop, self._resign))
            try:
                await asyncio.wait({lease, ended}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancelled(ended)
            if self._resign.is_set():
                log.warning("an event could not be logged or applied: back to standby, to rebuild the state "
                            "from the log", instance=self.instance)
        finally:
            # this term takes nothing more first: its subscriptions go before its tasks are waited for (one may
            # take a while to end), and a task that had failed does not stop the rest of the clean-up -- a term
            # whose handlers outlived it went on taking opens no sequencer logged, for a minute
            self.leader.clear()
            metrics.leader.set(0)
            for sub in self._subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            self._subs = []
            self._fail_pending(_changing_leader())
            for t in [lease, *tasks]:
                try:
                    await cancelled(t)
                except Exception as e:  # noqa: BLE001 - the term ends all the same
                    log.warning("a task of the term had failed", instance=self.instance, error=repr(e))
            observe.clear()
            self._fail_pending(_changing_leader())

    async def _keep_lease(self, stop: asyncio.Event) -> None:
        """Keep the lease -- a thread renews it (:mod:`.lease`), this task tells it that the loop runs --; return
        when it is lost (or not renewed), when the leader resigns, or when the service stops."""
        lost = asyncio.Event()
        keeper = LeaseKeeper(self.settings.redis_url, keys.POLICY_LEASE, self.instance, self.settings.leader_lease,
                             self._lease_from, asyncio.get_running_loop(), lost)
        keeper.start()
        try:
            while not (stop.is_set() or self._resign.is_set() or lost.is_set()):
                keeper.tick()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_first(stop, self._resign, lost), self.settings.leader_lease / 3)
            if lost.is_set():
                log.warning("lease lost: back to standby", instance=self.instance, why=keeper.why)
        finally:
            keeper.stop()

    def _fail_pending(self, error: Exception) -> None:
        """Every event waiting to be logged: refused (none of them was logged, so none was applied)."""
        while not self._inbox.empty():
            _, fut = self._inbox.get_nowait()
            if not fut.done():
                fut.set_exception(error)

    async def _restore(self, lease: asyncio.Task | None = None) -> None:
        """Rebuild the cores: the last snapshot, then the event log after it; publish again the decisions of
        the last events (their ids make JetStream drop those the previous leader had published). The replay
        lets ``lease`` run now and then (it keeps the lease meanwhile), and stops if it was lost."""
        snap = Snapshot.from_fields(await self.redis.hgetall(keys.SNAPSHOT))
        self.cores = snap.cores() if snap else CoupledCores(policy_settings(self.settings))
        self.cores.policy.settings = policy_settings(self.settings)  # the settings of this run, not the writer's
        self._events_applied = snap.events if snap else 0
        self.pacer = ViewPacer(period=self.settings.view_period, rate=self.settings.view_rate)
        await self.redis.set(keys.INCARNATION, uuid.uuid4().hex[:12], nx=True)
        self.incarnation = await self.redis.get(keys.INCARNATION)
        raw = await self.redis.hgetall(keys.SESSIONS)
        self.sessions = {app: json.loads(v) for app, v in raw.items()}
        entries = await self.redis.xrange(keys.EVENT_LOG, min=f"({snap.last}" if snap else "-")
        self._replayed = len(entries)
        self._last_entry = entries[-1][0] if entries else (snap.last if snap else "")
        self._events_applied += len(entries)
        self._since_snapshot = len(entries)
        self._seq = int(await self.redis.get(keys.EVENT_SEQ) or 0)
        tail: list[tuple[object, list]] = []
        turn = time.monotonic()
        for i, (_, fields) in enumerate(entries):
            event = _EVENTS.validate_json(fields["e"])
            out = self.cores.handle(event, pass_now=fields.get("d") != "1")
            if i >= len(entries) - _REPUBLISH:
                tail.append((event, out))
            if time.monotonic() - turn > self.settings.leader_lease / 6:  # (the lease's renewal may run)
                await asyncio.sleep(0)
                turn = time.monotonic()
                if lease is not None and lease.done():
                    return
        for event, out in tail:
            await self._publish(event, out)
        now = clock()
        self.last_seen = {app: now for app in self.cores.policy.app_ids()}
        # records of opens that were never logged (a leader stepped down between the record and the event)
        stale = [app for app in self.sessions if not self.cores.policy.has_app(app)]
        for app in stale:
            del self.sessions[app]
        if stale:
            await self.redis.hdel(keys.SESSIONS, *stale)
        # the sessions may follow the pace the last leader told them, whatever their number now
        self.pace.taken_over(int(await self.redis.get(keys.HEARTBEAT_LEVEL) or 0), now)
        self._told_pace()
        await self._repace()

    # ============================================================================================
    # the one way in
    # ============================================================================================
    async def apply(self, make) -> list:
        """Stamp, log, apply and publish one event; ``make(at, stimulus_id)`` builds it. Events that arrive
        together are logged in one Redis round trip (:meth:`_sequencer`), then applied one by one."""
        if not self.leader.is_set():
            # a handler that was awaiting Redis when this leader stepped down: its event is refused, not
            # kept in the queue for a later term (which would apply it after rebuilding its state without
            # it -- an open answered whose session the new term does not know)
            raise _changing_leader()
        fut = asyncio.get_running_loop().create_future()
        self._inbox.put_nowait((make, fut))
        return await fut

    async def _sequencer(self) -> None:
        while True:
            batch = [await self._inbox.get()]
            while len(batch) < _BATCH and not self._inbox.empty():
                batch.append(self._inbox.get_nowait())
            try:
                await self._apply_batch(batch)
            except Exception as e:  # noqa: BLE001 - every caller gets an answer
                # the cores may now hold what the log does not (or the log what they do not): this leader
                # resigns, and whoever leads next (this one too) rebuilds them from the log
                log.exception("could not apply events")
                error = bus.WireError(ErrorCode.UNAVAILABLE, f"the event could not be logged: {e!r}; retry")
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(error)
                self._resign.set()
                return
            self._wake.set()

    async def _apply_batch(self, batch) -> None:
        events = []
        for make, _ in batch:
            self._seq += 1
            events.append(make(max(clock(), self.cores.now), f"e{self._seq}"))
        # durable before applied (and before anyone hears of it)
        # the events of a batch are applied with one pass, after the last: the log says which were
        # deferred ("d"), so that a replay runs the passes where this leader ran them
        last = len(events) - 1
        args: list[str] = [self.instance, str(self._seq)]
        for i, event in enumerate(events):
            args += [event.model_dump_json(), "1" if i < last else ""]
        ids = await self.redis.eval(_APPEND, 3, keys.POLICY_LEASE, keys.EVENT_LOG, keys.EVENT_SEQ, *args)
        if not ids:
            raise RuntimeError("the lease is another's: not logged")
        self._last_entry = ids[-1]
        policy = self.cores.policy
        for i, (event, (_, fut)) in enumerate(zip(events, batch, strict=True)):
            epoch, t0 = policy.epoch, time.perf_counter()
            out = self.cores.handle(event, pass_now=i == last)
            if policy.epoch != epoch:
                metrics.policy_pass_seconds.observe(time.perf_counter() - t0)
            observe.decisions(out, self._kind_of, self._submitted_at)
            await self._publish(event, out)
            if not fut.done():
                fut.set_result(out)
        await self._views_round()
        self._events_applied += len(events)
        self._since_snapshot += len(events)
        if self.settings.snapshot_every and self._since_snapshot >= self.settings.snapshot_every:
            await self._snapshot()

    async def _grace_again(self) -> bool:
        """The time without a leader is not the applications': a shrink asked before the take-over (a
        preemption deadline) is given its grace again from now -- its ``done`` may have been waiting for this
        leader, and the first pass would otherwise end its session as a violation (bench_ha's parameter
        sweeps after the Valkey failover). The longer deadlines are not in the log, so a snapshot holds them
        before this term takes anything: a later replay starts from it. False: not written, no term."""
        if not grace_again(self.cores.policy, clock()):
            return True
        if await self._snapshot():
            return True
        log.warning("the preemption deadlines of the take-over could not be kept: standing by",
                    instance=self.instance)
        return False

    async def _snapshot(self) -> bool:
        """Write the cores' state (as of the last event applied) and trim the log before it. The decisions of
        those events are in JetStream first: a new leader republishes only what it replays."""
        try:
            await asyncio.wait_for(self.js.publish_async_completed(), 5.0)
        except TimeoutError:
            log.warning("snapshot put off: JetStream has not acknowledged the decisions yet")
            return False
        snap = Snapshot.of(self.cores, self._last_entry, self._events_applied)
        t0 = time.perf_counter()
        written = await self.redis.eval(_WRITE_SNAPSHOT, 3, keys.POLICY_LEASE, keys.SNAPSHOT, keys.EVENT_LOG,
                                        *snap.script_args(self.instance))
        if written:
            self._since_snapshot = 0
            log.info("snapshot written", events=snap.events, bytes=len(snap.state),
                     seconds=round(time.perf_counter() - t0, 3))
            return True
        log.warning("snapshot not written: this instance no longer holds the lease")
        return False

    async def _publish(self, event, decisions: list) -> None:
        if isinstance(event, OpenSession):
            self.pacer.opened(event.app)
        for_allocator = [d for d in decisions if isinstance(d, _FOR_ALLOCATOR)]
        for i, data in enumerate(decision_messages(for_allocator, self.nc.max_payload // 2)):
            # acknowledged by JetStream in the background: the decisions lost with a dying leader are
            # published again by the next one (the last events' decisions, de-duplicated by their ids)
            msg_id = f"{self.incarnation}.{event.stimulus_id}" + (f".{i}" if i else "")
            self._watch(await self.js.publish_async(subjects.DECISIONS, data, headers={"Nats-Msg-Id": msg_id}))
        for i, d in enumerate(decisions):
            life = self._lifecycle(event, d)
            if life is not None:
                self._watch(await self.js.publish_async(subjects.LIFECYCLE, bus.encode(life), headers={
                    "Nats-Msg-Id": f"{self.incarnation}.{d.stimulus_id}.{i}.life"}))
            if isinstance(d, ViewsChanged):
                self.pacer.changed(d.apps)
            if isinstance(d, PreemptionDeadline):
                self.pacer.changed((d.app,), urgent=True)
                # (said: a session ended as a violator had no other trace than its agents' kills)
                log.info("shrink asked", app=d.app, cluster=d.cluster, held=d.held, allowed=d.allowed,
                         within=round(d.deadline - event.at, 1), epoch=self.cores.policy.epoch)
            if isinstance(d, Offered) and d.unsolicited or isinstance(d, OfferLapsed):
                # an offer made in a pass, or one that lapsed: the application hears of it here (the answer
                # to a command carries its own offer). Not durable: a lost offer lapses
                await self.nc.publish(subjects.notify_offer(d.app), bus.encode(self._offer_msg(d)))
            if isinstance(d, SessionEnded):
                if d.reason != "closed" and not d.reason.startswith("reaped"):  # (a reaping is said as it starts)
                    log.info("session ended", app=d.app, reason=d.reason)
                self.pacer.ended(d.app)
                self._ended_why[d.app] = d.reason
                if len(self._ended_why) > _ENDED_KEPT:
                    del self._ended_why[next(iter(self._ended_why))]
                self.sessions.pop(d.app, None)
                self.last_seen.pop(d.app, None)
                await self.redis.hdel(keys.SESSIONS, d.app)

    def _watch(self, ack: asyncio.Future) -> None:
        """Hear how JetStream took a stream message; one unanswered after ``_ACK_WITHIN`` counts as refused."""
        ack.add_done_callback(self._acknowledged)

        def unanswered() -> None:
            if not ack.done():
                ack.set_exception(TimeoutError(f"JetStream did not answer within {_ACK_WITHIN:g} s"))

        timer = asyncio.get_running_loop().call_later(_ACK_WITHIN, unanswered)
        ack.add_done_callback(lambda _: timer.cancel())

    def _acknowledged(self, ack: asyncio.Future) -> None:
        """A stream message JetStream refused or left unanswered (in a NATS cluster, while the stream elects a
        leader after a server died or was cut off): it would be lost, so this leader steps down, and the next
        term publishes the last events' decisions again (JetStream drops those it has, by id)."""
        if ack.cancelled() or ack.exception() is None:
            return
        if self.leader.is_set() and not self._resign.is_set():
            log.warning("JetStream did not take a decision: back to standby, to publish them again",
                        instance=self.instance, error=repr(ack.exception()))
            self._resign.set()

    def _lifecycle(self, event, d) -> Lifecycle | None:
        at = event.at
        if isinstance(d, Accepted) and isinstance(event, OpenSession):
            return self._life(LifecycleKind.SESSION_OPENED, at, d.app)
        if isinstance(d, Accepted) and isinstance(event, Submit):
            return None  # each request's submission is recorded at its start or end, with its time
        if isinstance(d, StartRequest):
            return self._life(LifecycleKind.STARTED, d.at, d.app, request=d.request, type=d.type.value,
                              cluster=d.cluster, nodes=d.nodes, submitted_at=self._submitted_at(d.request),
                              started_at=d.at)
        if isinstance(d, EndRequest):
            return self._life(LifecycleKind.ENDED, d.at, d.app, request=d.request, type=d.type.value,
                              cluster=d.cluster, nodes=d.nodes, reason=d.reason.value,
                              started_at=d.started_at)
        if isinstance(d, PreemptionDeadline):
            return self._life(LifecycleKind.PREEMPTION, at, d.app, cluster=d.cluster, allowed=d.allowed,
                              deadline=d.deadline)
        if isinstance(d, SessionEnded):
            return self._life(LifecycleKind.SESSION_ENDED, at, d.app, reason=d.reason)
        return None

    def _kind_of(self, app: str) -> str:
        return self.sessions.get(app, {}).get("kind") or "unknown"

    def _submitted_at(self, request: str) -> float | None:
        return self.cores.policy.submitted_at(request)

    def _life(self, kind: LifecycleKind, at: float, app: str, **kw) -> Lifecycle:
        s = self.sessions.get(app, {})
        return Lifecycle(kind=kind, at=at, app=app, user=s.get("user", ""), app_kind=s.get("kind", ""), **kw)

    async def _views_round(self) -> None:
        """Send the round of views that is due, if one is; else have :meth:`_views_loop` wait for it."""
        round_ = self.pacer.take(clock())
        if round_ is not None:
            await self._publish_views(*round_)
        self._views_wake.set()

    async def _views_loop(self) -> None:
        while True:
            self._views_wake.clear()
            due = self.pacer.due_at()
            delay = None if due is None else max(0.0, due - clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):  # (not wait_for: it may lose a cancellation, see the agent)
                    await self._views_wake.wait()
            await self._views_round()

    async def _publish_views(self, apps=(), closed=(), full: bool = False) -> None:
        for epoch in self._views_messages(apps, closed, full):
            await self.nc.publish(subjects.SCHEDULE_EPOCH, bus.encode(epoch))

    def _views_messages(self, apps=(), closed=(), full: bool = False) -> list[ViewsEpoch]:
        """The views of ``apps`` (every application if ``full``) as they stand, in messages of at most
        ``_VIEWS_PER_MESSAGE`` applications; the first also names the ``closed`` sessions."""
        policy = self.cores.policy
        wanted = [a for a in (policy.app_ids() if full else apps) if policy.has_app(a)] if policy.has_views() else []
        chunks = [wanted[i:i + _VIEWS_PER_MESSAGE] for i in range(0, len(wanted), _VIEWS_PER_MESSAGE)] or [[]]
        memo: dict = {}
        return [self._views_epoch(chunk, memo, closed=list(closed) if i == 0 else [], full=full)
                for i, chunk in enumerate(chunks)]

    def _views_epoch(self, apps: list[str], memo: dict, **kw) -> ViewsEpoch:
        """One message of views: a non-preemptive view shared by applications (``memo`` makes them one
        object) goes once, in ``shared``, and they name it in ``refs`` -- a thousand idle launchers' views
        cost one view, not a thousand, to build, send and read."""
        policy = self.cores.policy
        views: dict[str, dict[str, AppViews]] = {}
        refs: dict[str, dict[str, str]] = {}
        shared: dict[int, tuple[str, AppViews]] = {}  # id(steps) -> (key, views): memo's lists live this long
        for app in apps:
            flt = self.sessions.get(app, {}).get("filter", {})
            for c, (np, p) in policy.views_of(app, flt.get("clusters"), flt.get("preemptive_views", True),
                                              memo).items():
                if p is not None:
                    views.setdefault(app, {})[c] = AppViews(non_preemptive=np, preemptive=p)
                    continue
                key, _ = shared.get(id(np)) or shared.setdefault(
                    id(np), (f"v{len(shared)}", AppViews(non_preemptive=np)))
                refs.setdefault(app, {})[c] = key
            if app not in views and app not in refs:
                views[app] = {}  # (no cluster in its filter: it still hears of its epoch)
        return ViewsEpoch(epoch=policy.epoch, now=self.cores.now, views=views,
                          shared={k: v for k, v in shared.values()}, refs=refs, **kw)

    # ============================================================================================
    # handlers
    # ============================================================================================
    def _check(self, subject: str, token: str) -> str:
        app = subjects.app_of(subject)
        if self._heard(app, token.encode()) is not None:  # (bytes: any text compares)
            return app
        if app not in self.sessions:
            why = self._ended_why.get(app)  # (a launcher that was not heard learns why its session ended)
            raise bus.WireError(ErrorCode.UNKNOWN_APP, f"no open session {app}" + (f": {why}" if why else ""))
        raise bus.WireError(ErrorCode.BAD_TOKEN, f"wrong session token for {app}")

    def _heard(self, app: str, token: bytes) -> dict | None:
        """Open session ``app``'s record if ``token`` is its token (then the session was heard of now), else
        None. The one check of a session's token, for every command and for the heartbeats read without
        parsing."""
        session = self.sessions.get(app)
        if session is None or not secrets.compare_digest(session["token"].encode(), token):
            return None
        self.last_seen[app] = clock()
        return session

    def _told_pace(self) -> None:
        """Paced sessions are told the current pace from now on (the heartbeat's answer, as a message and as the
        bytes the fast path sends), and the gauge shows it."""
        self._paced = HeartbeatAck(heartbeat_interval=self.pace.interval(), session_timeout=self.pace.session_timeout())
        self._paced_ack = bus.encode(self._paced)
        metrics.heartbeat_interval.set(self.pace.interval())

    async def _repace(self) -> None:
        """Follow the number of open sessions with the heartbeats' pace; a change is stored for a next leader
        (whose sessions may follow it) before any session hears of it -- or not made, if it cannot be."""
        pace = dataclasses.replace(self.pace)
        if not pace.update(len(self.sessions), clock()):
            return
        await self.redis.set(keys.HEARTBEAT_LEVEL, max(pace.level, pace.previous))
        self.pace = pace
        self._told_pace()
        log.info("heartbeat pace", sessions=len(self.sessions), interval=self.pace.interval(),
                 session_timeout=self.pace.session_timeout())

    @staticmethod
    def _answer(out: list) -> Ack:
        first = out[0] if out else None
        if isinstance(first, Rejected):
            raise bus.WireError(first.code, first.reason)
        if not isinstance(first, Accepted):
            raise bus.WireError(ErrorCode.UNAVAILABLE, "the policy core gave no answer")
        return Ack(requests=list(first.requests))

    async def _on_open(self, msg: SessionOpen, raw: Msg) -> SessionOpenReply:
        # the user NATS authenticated (only they may publish to their session.open subject), never a claim
        user = subjects.user_of(raw.subject)
        token = secrets.token_urlsafe(24)
        record = {"token": token, "user": user, "name": msg.name, "kind": msg.kind,
                  "filter": msg.filter.model_dump(), "opened": clock(), "paced": msg.paced}
        # the session's record goes first: a leader that replays the open finds the token
        app = await self.redis.eval(_NEW_SESSION, 2, keys.APP_SEQ, keys.SESSIONS, json.dumps(record),
                                    subjects.app_id_prefix(user))
        if not self.leader.is_set():  # stepped down meanwhile (the record is dropped at the next restore)
            raise _changing_leader()
        self.sessions[app] = record
        self.last_seen[app] = clock()
        await self._repace()  # (counting this one: it is told the pace of the sessions with it)
        out = await self.apply(lambda at, sid: OpenSession(at=at, stimulus_id=sid, app=app, user=user,
                                                           name=msg.name, app_kind=msg.kind,
                                                           adapts=msg.filter.views))
        self._answer(out)
        level = self.pace.level if msg.paced else 0  # (one not paced keeps the base interval: it is never told)
        return SessionOpenReply(app=app, token=token, subjects=session_subjects(app),
                                heartbeat_interval=self.pace.interval(level),
                                session_timeout=self.pace.session_timeout(level))

    async def _on_request(self, msg: RequestMsg, raw: Msg) -> Ack:
        app = self._check(raw.subject, msg.token)
        requests = _within_filter(msg.requests, self.sessions.get(app, {}).get("filter", {}).get("clusters"))
        return self._answer(await self.apply(
            lambda at, sid: Submit(at=at, stimulus_id=sid, app=app, requests=requests,
                                   replaces=tuple(msg.replaces))))

    async def _on_done(self, msg: DoneMsg, raw: Msg) -> Ack:
        app = self._check(raw.subject, msg.token)
        return self._answer(await self.apply(
            lambda at, sid: Done(at=at, stimulus_id=sid, app=app, request=msg.request,
                                 released=tuple(msg.released))))

    async def _on_close(self, msg: CloseMsg, raw: Msg) -> Ack:
        app = self._check(raw.subject, msg.token)
        return self._answer(await self.apply(lambda at, sid: CloseSession(at=at, stimulus_id=sid, app=app)))

    @staticmethod
    def _offer_msg(d: Offered | OfferLapsed) -> OfferMsg:
        if isinstance(d, OfferLapsed):
            return OfferMsg(app=d.app, negotiation=d.negotiation, offer=d.offer, cluster=d.cluster, lapsed=True)
        return OfferMsg(app=d.app, negotiation=d.negotiation, offer=d.offer, cluster=d.cluster, nodes=d.nodes,
                        start=d.start, deadline=d.deadline, round=d.round, unsolicited=d.unsolicited)

    @staticmethod
    def _first(out: list) -> object:
        first = out[0] if out else None
        if isinstance(first, Rejected):
            raise bus.WireError(first.code, first.reason)
        if not isinstance(first, (Accepted, Offered)):
            raise bus.WireError(ErrorCode.UNAVAILABLE, "the policy core gave no answer")
        return first

    async def _on_negotiate(self, msg: NegotiateMsg, raw: Msg) -> OfferMsg:
        app = self._check(raw.subject, msg.token)
        first = self._first(await self.apply(
            lambda at, sid: Negotiate(at=at, stimulus_id=sid, app=app, terms=msg.terms)))
        if isinstance(first, Offered):
            return self._offer_msg(first)
        return OfferMsg(app=app, negotiation=msg.terms.negotiation, cluster=msg.terms.cluster, waiting=True)

    async def _on_respond(self, msg: RespondMsg, raw: Msg) -> RespondReply:
        app = self._check(raw.subject, msg.token)
        first = self._first(await self.apply(
            lambda at, sid: Respond(at=at, stimulus_id=sid, app=app, offer=msg.offer, answer=msg.answer,
                                    nodes=msg.nodes)))
        if isinstance(first, Offered):
            return RespondReply(offer=self._offer_msg(first))
        assert isinstance(first, Accepted)
        if first.requests:
            return RespondReply(request=first.requests[0])
        neg = self.cores.policy.negotiations.open.get(msg.offer.rsplit(".o", 1)[0])
        if msg.answer is Answer.COUNTER and neg is not None:  # a standing negotiation with nothing now: it waits
            return RespondReply(offer=OfferMsg(app=app, negotiation=neg.id, cluster=neg.cluster, waiting=True))
        return RespondReply()  # rejected: the negotiation ended

    async def _on_heartbeat(self, msg: HeartbeatMsg, raw: Msg) -> Ack:
        app = self._check(raw.subject, msg.token)
        return self._paced if self.sessions[app].get("paced") else Ack()

    def _heartbeat_heard(self, raw: Msg) -> bytes | None:
        """A heartbeat's common case, answered without parsing it (``bus.serve``'s ``fast``): a plain
        heartbeat of an open session with its token. Anything else -- an unknown session, a wrong token, any
        other shape -- returns None and takes :meth:`_on_heartbeat`'s path, which refuses it with its code.
        The generic path cost the engine 62-72 us of CPU a heartbeat, this one 17-22 us (a micro-benchmark:
        20,000 heartbeats over a real nats-server), and heartbeats are most of what an engine with thousands of
        idle sessions does."""
        token = heartbeat_token(raw.data)
        if token is None:
            return None
        session = self._heard(subjects.app_of(raw.subject), token)
        if session is None:
            return None
        return self._paced_ack if session.get("paced") else _ACK

    async def _on_nodes(self, msg: NodesEvent, raw: Msg) -> Ack:
        if msg.kind == "register":
            await self.apply(lambda at, sid: RegisterNodes(at=at, stimulus_id=sid, cluster=msg.cluster,
                                                           nodes=tuple(msg.nodes)))
        elif msg.kind == "down":
            for node in msg.nodes:
                await self.apply(lambda at, sid, node=node: NodeDown(at=at, stimulus_id=sid, node=node))
        else:
            drain = msg.kind == "drain"
            for node in msg.nodes:
                await self.apply(lambda at, sid, node=node: NodeDrain(at=at, stimulus_id=sid, node=node, drain=drain,
                                                                      reason=msg.reason))
            # what coorm nodes shows (the cores' state is the truth: the event log has it)
            if drain:
                await self.redis.hset(keys.NODE_DRAINS, mapping={n: msg.reason or "drained" for n in msg.nodes})
            else:
                await self.redis.hdel(keys.NODE_DRAINS, *msg.nodes)
        return Ack()

    async def _on_views_query(self, msg: ViewsQuery, raw: Msg) -> ViewsEpoch:
        policy = self.cores.policy
        every = policy.app_ids() if policy.has_views() else []
        apps = every[msg.offset:msg.offset + msg.limit]
        return self._views_epoch(apps, {}, full=True, more=msg.offset + msg.limit < len(every))

    async def _on_status(self, msg: StatusQuery, raw: Msg) -> StatusReply:
        return self.cores.status(self.sessions, self.instance, msg.offset, msg.limit,
                         set(msg.apps) if msg.apps is not None else None)

    # ============================================================================================
    # time
    # ============================================================================================
    async def _timer_loop(self) -> None:
        """Call the cores back when they asked to be (a start time, a hold's expiry, a deadline, the next
        pass after the re-scheduling interval)."""
        while True:
            self._wake.clear()
            w = self.cores.next_wakeup()
            delay = None if w is None else max(0.0, w - clock())
            try:
                async with asyncio.timeout(delay):  # (not wait_for: it may lose a cancellation, see the agent)
                    await self._wake.wait()
            except TimeoutError:
                await self.apply(lambda at, sid: Tick(at=at, stimulus_id=sid))

    async def _gauges_loop(self) -> None:
        """The metrics' gauges, from the cores' counts read once a second (a scrape never touches the cores)."""
        while True:
            observe.gauges(counts_of(self.cores, self.sessions))
            await asyncio.sleep(1.0)  # a sampling period, not a synchronisation

    async def _reaper_loop(self) -> None:
        """End the sessions of launchers that went silent (their processes are killed, nodes freed), and follow
        the number of sessions with the heartbeats' pace (a session closing does not change it at once)."""
        while True:
            await asyncio.sleep(min(1.0, self.settings.session_timeout / 4))  # a periodic scan, not a synchronisation
            await self._repace()
            now = clock()
            timeout = self.pace.reaping_timeout(now)
            for app, seen in list(self.last_seen.items()):
                if now - seen > timeout and self.cores.policy.has_app(app):
                    log.info("reaping silent session", app=app, silent_for=round(now - seen, 1))
                    self.last_seen.pop(app, None)
                    reason = f"reaped: no heartbeat for {timeout:g} s"
                    await self.apply(lambda at, sid, app=app, reason=reason: CloseSession(
                        at=at, stimulus_id=sid, app=app, reason=reason))


async def main(settings: Settings | None = None, stop: asyncio.Event | None = None) -> None:
    from coorm.services.runtime import stop_on_signals

    settings = settings or Settings()
    try:
        policy_settings(settings)
    except SettingError as e:  # an unknown policy: say which variable and what it may be, no traceback
        log.error("cannot start: a policy setting is not known", error=str(e))
        raise SystemExit(1) from None
    metrics.serve(settings.metrics_port, settings.metrics_addr)
    engine = PolicyEngine(settings)
    try:
        await engine.run(stop or stop_on_signals())
    except SnapshotError as e:
        # the log before the snapshot is trimmed: no state can be rebuilt without it, so stop, saying why
        log.error("cannot take over: the snapshot in Redis cannot be loaded", error=str(e))
        raise SystemExit(1) from None
