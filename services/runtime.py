"""What every service shell shares: the wall clock (the only one: cores get time passed in), the Redis
client, the JetStream streams, structlog, a stop signal, and the watch that takes a service off a NATS server
cut from its cluster."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
import structlog
from nats.js.api import ClusterInfo, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from coorm.shared import bus, subjects, valkey
from coorm.shared.connection import nats_servers, redact
from coorm.shared.endpoints import Role

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

    from coorm.shared.settings import Settings


def clock() -> float:
    return time.time()


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(format="%(message)s", stream=sys.stderr, level=getattr(logging, level.upper(), 20))
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), 20)),
    )


def redis_client(url: str, max_connections: int = 32, *, ride_over: float = 0.0) -> aioredis.Redis:
    """A client whose pool waits for a free connection under load (rather than failing with
    ``MaxConnectionsError`` when a thousand launchers open sessions at once). With ``ride_over``, a command
    that meets a lost connection is sent again (backing off) for about that many seconds: a Redis restart
    is waited out. (Not for the policy engine: a leader must step down at its first failed write, lest a
    late retry append to a log that another leader now owns.)"""
    extra: dict = {}
    if ride_over > 0:
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        cap = 1.0
        extra = {"retry": Retry(ExponentialBackoff(cap=cap, base=0.05), retries=max(1, int(ride_over / cap) + 5)),
                 "retry_on_error": [RedisConnectionError, RedisTimeoutError, OSError]}
    # one server or a primary under Sentinel (coorm.shared.valkey: the client follows a failover, and under
    # Sentinel a write returns once a replica has it)
    return valkey.async_client(url, max_connections=max_connections, **extra)


async def ensure_streams(js, replicas: int) -> None:
    """The durable streams: decisions for the node allocator, lifecycle events for accounting. Creating
    them is idempotent (every service that uses one may do it). ``replicas``: copies of each on as many
    servers of a NATS cluster (the service's ``stream_replicas``); an existing stream is scaled to it."""
    for name, subject in ((subjects.DECISIONS_STREAM, subjects.DECISIONS),
                          (subjects.LIFECYCLE_STREAM, subjects.LIFECYCLE)):
        config = StreamConfig(name=name, subjects=[subject], retention=RetentionPolicy.LIMITS,
                              storage=StorageType.FILE, duplicate_window=120.0, max_age=7 * 24 * 3600.0,
                              num_replicas=replicas)
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)


def await_chain(task: asyncio.Task) -> tuple[str, ...]:
    """Where a task waits: each coroutine of its await chain (file:function:line), down to the future."""
    out: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and len(out) < 64:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        out.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}:{frame.f_lineno}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return tuple(out)


def stop_on_signals() -> asyncio.Event:
    """An event set on SIGINT/SIGTERM, for a service's main loop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


QUORUM_SILENCE = 3.0
"""Seconds a stream's leader may go without hearing a follower and still count it: its Raft heartbeats go out
every second and are answered (a leader's view of a follower is under 1 s old, measured), so three missed
mean the follower is out of reach. nats-server's own verdict, ``current`` false, takes 10 s."""


class LeaderCutOff(Exception):
    """The decision stream's leader answered but no quorum of its replicas hears it: a leader on a server cut
    from its cluster goes on answering for 10 to 20 s (nats-server's lost-quorum check), then answers without a
    leader -- while the majority has elected another."""


async def decisions_stream_answers(nc: NATS, timeout: float) -> None:
    """Ask JetStream about the decision stream through ``nc``'s server; raises unless a leader heard by a
    quorum of the stream's replicas answered (JetStream's "no such stream" is an answer). A server cut from its
    cluster cannot give that: the stream's quorum and the cluster's meta leader are on the other side (a
    stream of 3 replicas has 2 there), so this tells it -- whatever CooRM service runs or does not, and the
    policy engine included."""
    try:
        info = await nc.jetstream(timeout=timeout).stream_info(subjects.DECISIONS_STREAM)
    except NotFoundError:
        return
    unheard = leader_unheard(info.cluster)
    if unheard is not None:
        raise LeaderCutOff(unheard)


def leader_unheard(group: ClusterInfo | None) -> str | None:
    """Why a stream's leader, as its answer to a stream info describes its group, does not speak for a quorum
    of the stream's replicas; None if it does (or if there is no cluster: the one server is the stream)."""
    if group is None:
        return None
    if group.leader is None:
        return "the stream answered without a leader"
    replicas = group.replicas or []
    heard = sum(1 for r in replicas if r.current and not r.offline and r.active is not None
                and r.active / 1e9 < QUORUM_SILENCE)
    if 1 + heard <= (1 + len(replicas)) // 2:
        return f"the stream's leader {group.leader} hears {heard} of its {len(replicas)} followers"
    return None


async def stay_in_the_cluster(nc: NATS, settings: Settings, name: str) -> None:
    """Until cancelled: every ``settings.service_probe`` seconds, ask JetStream about the decision stream
    through ``nc``'s server (:func:`decisions_stream_answers`). Unanswered while the connection lives, the
    server may be cut from its cluster -- alive, so nats-py stays with it, but nothing beyond it hears: agents
    and applications that moved away would find no engine, no allocator, no views, no batch queue. The service
    then asks through each other server of its URL list and moves to one that answers (``bus.leave_if_cut_off``),
    as agents and SDK sessions do -- at every probe once unanswered for ``QUORUM_SILENCE``: services are a
    handful, where agents and sessions, thousands, space their looks. When the cut server led the decision
    stream, the others answer once they have elected another leader (4 to 10 s). With a one-server list there
    is nowhere to go: nothing is asked."""
    urls = nats_servers(settings.nats_url)
    if len(urls) < 2:
        return
    period, identity = settings.service_probe, settings.identity(Role.SERVICE)
    log = structlog.get_logger("coorm.runtime").bind(service=name)

    async def answered_here() -> bool:
        return await bus.answered(nc, lambda here: decisions_stream_answers(here, period))

    async def answered_there(url: str) -> bool:
        return await bus.answered_through(url, f"{name}-look", identity,
                                          lambda there: decisions_stream_answers(there, period))

    def moving(here: str, url: str) -> None:
        log.warning("JetStream answers through another NATS server, not through this one: moving there", cut=here,
                    to=redact(url))

    unanswered_since: float | None = None
    while True:
        began = time.monotonic()
        if await answered_here():
            unanswered_since = None
        elif nc.is_connected:
            unanswered_since = began if unanswered_since is None else unanswered_since
            # looked for only once unanswered for QUORUM_SILENCE: until then a leader cut off at the same
            # moment still seems heard by its followers, and its server would be taken for the cluster's (a
            # batch service that its sessions had just moved to the majority, electing, went back to it)
            if began - unanswered_since >= QUORUM_SILENCE:
                await bus.leave_if_cut_off(nc, urls, answered_there, answered_here, moving)
        await asyncio.sleep(max(0.0, began + period - time.monotonic()))  # the probe's period
