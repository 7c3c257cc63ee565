"""What every service shell shares: the wall clock (the only one: cores get time passed in), the Redis
client, the JetStream streams, structlog, and a stop signal."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from typing import Any

import redis.asyncio as aioredis
import structlog
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from coorm.shared import subjects, valkey


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


async def ensure_streams(js, replicas: int | None = None) -> None:
    """The durable streams: decisions for the node allocator, lifecycle events for accounting. Creating
    them is idempotent (every service that uses one may do it). ``replicas``: copies of each on as many
    servers of a NATS cluster (default ``COORM_STREAM_REPLICAS``); an existing stream is scaled to it."""
    if replicas is None:
        from coorm.shared.settings import Settings

        replicas = Settings().stream_replicas
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
