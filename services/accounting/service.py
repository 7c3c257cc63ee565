"""The accounting service: the durable record of every allocation's life (DESIGN §2, §5).

Theory of operation
* The policy engine publishes one :class:`~coorm.shared.protocol.Lifecycle` per step of an allocation's life on
  ``subjects.LIFECYCLE``, captured by the JetStream stream ``subjects.LIFECYCLE_STREAM``. This service reads
  it through the durable pull consumer ``accounting`` (explicit ack), so it resumes where it stopped.
* Each event is recorded by one Lua script -- all of it or nothing: the raw event (``keys.ACCT_EVENTS``), its
  request's record (``keys.acct_request``: submitted/started/ended times, nodes, type, cluster, app, user, end
  reason), the index of finished requests by end time (``keys.ACCT_ENDED``), a preemption's record. The message
  is acked only after that write (and after enqueueing its roll-up), so an instance dying half-way loses
  nothing: the message comes again.
* Redelivery counts once: an event already recorded (same ``Nats-Msg-Id``, kept in ``keys.ACCT_SEEN`` for
  8 days, longer than the stream keeps messages) or a second event of the same kind for the same request
  is not recorded again. Its roll-up is enqueued again all the same (the roll-up is idempotent), in case the
  last instance died between the write and the enqueue.
* A message that is not a valid lifecycle event is kept in ``keys.ACCT_REJECTED`` and set aside at once
  (``bus.set_aside``: a ``DeadLetter`` on ``subjects.deadletter``, counted, logged, terminated): it can never
  block the stream. One that fails to be recorded comes again (a nak with back-off): for as long as Redis or
  the broker is unreachable, which is no fault of the message; ``bus.MAX_DELIVERIES`` times for any other
  failure, then it is set aside too -- a poison message, which would otherwise come back for ever.
* The finished requests of one fetched batch enqueue one ``rollup_requests``, a preemption
  ``rollup_preemption`` (Celery tasks in :mod:`coorm.services.accounting.tasks`, on the same Redis); the
  batch's messages are acked once these are enqueued.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import kombu.exceptions
import redis.exceptions
import structlog
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from coorm.services.accounting.core import Malformed, PreemptionRecord, check, event_id, marker, request_fields
from coorm.services.accounting.tasks import ROLLUP_PREEMPTION, ROLLUP_REQUESTS, make_celery
from coorm.services.runtime import clock, ensure_streams, redis_client, stay_in_the_cluster
from coorm.shared import bus, keys, metrics, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import Lifecycle, LifecycleKind
from coorm.shared.settings import Settings
from coorm.shared.tasks import cancelled

log = structlog.get_logger("coorm.accounting")

DURABLE = "accounting"
ACK_WAIT = 30.0  # seconds before JetStream redelivers an unacked message
BATCH = 64
FETCH_WAIT = 0.5  # a fetch waits this long for messages (and so bounds how long a stop takes)
# after a batch that was not full, what comes next is gathered this long before it is fetched: jobs end a few
# at a time, and each fetched batch costs a pull and a roll-up task (some milliseconds of this
# service's and the Celery worker's CPU); a stream of separate batch jobs then costs one of these per
# COALESCE seconds instead of one per job, and an end is accounted at most this much later
COALESCE = 0.25
SEEN_RETENTION = 8 * 24 * 3600.0  # > the stream's max_age (7 days): any redelivery is recognised
RAW_MAXLEN = 1_000_000  # the raw event stream is trimmed (approximately) to this many events
REJECTED_MAXLEN = 1000
RETRY_WAIT = 1.0  # seconds before a message not recorded for want of Redis or the broker comes again
# failures that are the servers' (down, restarting), not the message's: redelivered for as long as they last
UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, kombu.exceptions.OperationalError,
               OSError)

# KEYS: 1 seen, 2 events, 3 request record, 4 ended index, 5 preemptions, 6 preemptions by time
# ARGV: 1 event id, 2 now, 3 forget seen ids before, 4 event JSON, 5 marker, 6 ended_at, 7 request,
#       8 preemption JSON, 9 at, 10 raw maxlen, 11.. request field/value pairs
_RECORD = """
if redis.call('zscore', KEYS[1], ARGV[1]) then return 0 end
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[3])
redis.call('zadd', KEYS[1], ARGV[2], ARGV[1])
if ARGV[5] ~= '' and redis.call('hexists', KEYS[3], ARGV[5]) == 1 then return 0 end
redis.call('xadd', KEYS[2], 'MAXLEN', '~', ARGV[10], '*', 'id', ARGV[1], 'event', ARGV[4])
if #ARGV > 10 then redis.call('hset', KEYS[3], unpack(ARGV, 11)) end
if ARGV[5] ~= '' then redis.call('hset', KEYS[3], ARGV[5], ARGV[1]) end
if ARGV[6] ~= '' then redis.call('zadd', KEYS[4], ARGV[6], ARGV[7]) end
if ARGV[8] ~= '' then
  redis.call('hset', KEYS[5], ARGV[1], ARGV[8])
  redis.call('zadd', KEYS[6], ARGV[9], ARGV[1])
end
return 1
"""


def consumer_config() -> ConsumerConfig:
    return ConsumerConfig(durable_name=DURABLE, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                          ack_wait=ACK_WAIT, max_deliver=-1, filter_subject=subjects.LIFECYCLE)


class AccountingService:
    def __init__(self, settings: Settings, name: str = "accounting") -> None:
        self.settings = settings
        self.name = name
        self.redis = None
        self.nc = None
        self.sub = None
        self.celery = None
        self.ready = asyncio.Event()

    # ============================================================================================
    # lifecycle
    # ============================================================================================
    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        assert self.nc is not None
        watch = asyncio.create_task(stay_in_the_cluster(self.nc, self.settings, self.name))
        try:
            await self.serve(stop)
        finally:
            with contextlib.suppress(Exception):  # (closed whatever the watch met)
                await cancelled(watch)
            await self.close()

    async def start(self) -> None:
        self.redis = redis_client(self.settings.redis_url)
        self.celery = make_celery(self.settings.redis_url, set_as_current=False)
        self.nc = await bus.connect(self.settings.nats_url, self.name, self.settings.identity(Role.SERVICE))
        js = self.nc.jetstream()
        await ensure_streams(js, self.settings.stream_replicas)
        self.sub = await js.pull_subscribe(subjects.LIFECYCLE, durable=DURABLE, stream=subjects.LIFECYCLE_STREAM,
                                           config=consumer_config())
        log.info("accounting consuming", stream=subjects.LIFECYCLE_STREAM, durable=DURABLE)
        self.ready.set()

    async def serve(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                msgs = await self.sub.fetch(batch=BATCH, timeout=FETCH_WAIT)
            except TimeoutError:
                continue
            except Exception:  # noqa: BLE001 - a broken connection: wait, it reconnects
                log.exception("fetch failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
                continue
            await self.handle_batch(msgs)
            if len(msgs) < BATCH:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), COALESCE)

    async def close(self) -> None:
        if self.nc is not None:
            # not drain(): draining a pull subscription waits out its last fetch; the acks are flushed, and
            # whatever was not acked is redelivered to the next instance (and recognised)
            with contextlib.suppress(Exception):
                if self.sub is not None:
                    await self.sub.unsubscribe()
                await bus.settled(self.nc, 2)
            await self.nc.close()
        if self.celery is not None:
            await asyncio.to_thread(self.celery.close)
        if self.redis is not None:
            await self.redis.aclose()

    # ============================================================================================
    # one message
    # ============================================================================================
    async def handle(self, msg: Msg) -> None:
        await self.handle_batch([msg])

    async def handle_batch(self, msgs: list[Msg]) -> None:
        """Record each message, enqueue the roll-ups of those recorded (the requests' ends in one task:
        a task each cost the worker and this service more than the roll-up itself), then ack them. What is
        not a lifecycle event is set aside at once; what fails comes again (see the module's notes)."""
        recorded: list[tuple[Msg, Lifecycle, str]] = []
        for msg in msgs:
            try:
                life, eid, _ = await self._record_msg(msg)
            except Exception as e:  # noqa: BLE001 - this message only (see _failed)
                await self._failed(msg, e)
                continue
            recorded.append((msg, life, eid))
        if not recorded:
            return
        try:
            await self._enqueue([(life, eid) for _, life, eid in recorded])
        except Exception as e:  # noqa: BLE001 - recorded, not enqueued: they all come again
            for msg, _, _ in recorded:
                await self._failed(msg, e)
            return
        for msg, _, _ in recorded:
            with contextlib.suppress(Exception):  # not acked: it comes again, and is recognised
                await msg.ack()

    async def _failed(self, msg: Msg, e: Exception) -> None:
        if isinstance(e, (bus.WireError, Malformed)):
            await self._reject(msg, e)
        elif isinstance(e, UNREACHABLE):
            log.warning("lifecycle event not recorded (a server is unreachable); it will be redelivered",
                        error=f"{type(e).__name__}: {e}")
            with contextlib.suppress(Exception):
                await msg.nak(delay=RETRY_WAIT)
        else:  # this message fails: again, up to MAX_DELIVERIES times
            await bus.retry_or_set_aside(self.nc, msg, e)

    async def process(self, msg: Msg) -> bool:
        """Record one message and enqueue its roll-up (without acking it): True if it was new, False if a
        duplicate. Raises ``bus.WireError`` or ``Malformed`` if it is not a valid lifecycle event."""
        life, eid, new = await self._record_msg(msg)
        await self._enqueue([(life, eid)])
        return new

    async def _record_msg(self, msg: Msg) -> tuple[Lifecycle, str, bool]:
        msg_id = (msg.headers or {}).get("Nats-Msg-Id")
        life = bus.decode(msg.data, Lifecycle)
        check(life)
        eid = event_id(life, msg_id)
        new = await self.record(life, eid)
        if new:
            observe(life)
        else:
            log.info("duplicate lifecycle event ignored", event_id=eid, kind=life.kind.value, request=life.request)
        return life, eid, new

    async def _enqueue(self, events: list[tuple[Lifecycle, str]]) -> None:
        """The roll-ups of these events (a duplicate's too: the last instance may have died before it)."""
        ended = [life.request for life, _ in events if life.kind is LifecycleKind.ENDED and life.request]
        if ended:
            await asyncio.to_thread(self.celery.send_task, ROLLUP_REQUESTS, args=[ended])
        for life, eid in events:
            if life.kind is LifecycleKind.PREEMPTION:
                await asyncio.to_thread(self.celery.send_task, ROLLUP_PREEMPTION, args=[eid])

    async def record(self, life: Lifecycle, eid: str) -> bool:
        now = clock()
        fields = request_fields(life)
        preemption = PreemptionRecord.of(eid, life).to_json() if life.kind is LifecycleKind.PREEMPTION else ""
        ended_at = fields.get("ended_at", "")
        request_key = keys.acct_request(life.request) if life.request else keys.acct_request("-")
        args = [eid, repr(now), repr(now - SEEN_RETENTION), life.model_dump_json(), marker(life), ended_at,
                life.request or "", preemption, repr(life.at), str(RAW_MAXLEN)]
        for k, v in fields.items():
            args += [k, v]
        ks = [keys.ACCT_SEEN, keys.ACCT_EVENTS, request_key, keys.ACCT_ENDED, keys.ACCT_PREEMPTIONS,
              keys.ACCT_PREEMPTIONS_AT]
        return bool(await self.redis.eval(_RECORD, len(ks), *ks, *args))

    async def _reject(self, msg: Msg, error: Exception) -> None:
        """Keep a message that is not a lifecycle event in ``keys.ACCT_REJECTED``, and set it aside."""
        why = error.message if isinstance(error, bus.WireError) else str(error)
        msg_id = (msg.headers or {}).get("Nats-Msg-Id")
        entry = json.dumps({"seq": msg.metadata.sequence.stream, "msg_id": msg_id, "error": why,
                            "data": msg.data[:4096].decode(errors="replace"), "at": clock()})
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(keys.ACCT_REJECTED, entry)
            pipe.ltrim(keys.ACCT_REJECTED, 0, REJECTED_MAXLEN - 1)
            await pipe.execute()
        await bus.set_aside(self.nc, msg, f"not a lifecycle event: {why}")


def observe(life: Lifecycle) -> None:
    """The usage counters by user (counted once per recorded event; the totals of record are the roll-ups
    in Redis, which survive a restart of this process)."""
    metrics.lifecycle_events.labels(life.kind.value).inc()
    user = life.user or "unknown"
    if life.kind is LifecycleKind.STARTED and life.type:
        metrics.usage_requests.labels(user, life.type).inc()
        if life.submitted_at is not None and life.started_at is not None:
            metrics.usage_wait_seconds.labels(user).inc(max(0.0, life.started_at - life.submitted_at))
    elif life.kind is LifecycleKind.ENDED and life.type:
        if life.started_at is not None:
            metrics.usage_node_seconds.labels(user, life.type).inc(max(0.0, life.at - life.started_at) * life.nodes)
        if life.reason in metrics.KILL_REASONS:
            metrics.usage_preemptions.labels(user).inc()


async def main(settings: Settings | None = None, stop: asyncio.Event | None = None) -> None:
    from coorm.services.runtime import stop_on_signals

    settings = settings or Settings()
    metrics.serve(settings.metrics_port, settings.metrics_addr)
    metrics.zero(metrics.lifecycle_events, *((k.value,) for k in LifecycleKind))
    metrics.zero(metrics.dead_letters, (subjects.LIFECYCLE_STREAM,))
    service = AccountingService(settings)
    await service.run(stop or stop_on_signals())
