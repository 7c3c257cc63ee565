"""How a process reaches CooRM's Valkey: one server (``redis://``), or a primary with replicas under Sentinel
(``redis+sentinel://``), where the client asks the sentinels which server is the primary, and asks again
after a failover. Every consumer of ``Settings.redis_url`` (the services, Celery, the command line) takes
either form from here.

The Sentinel form, which ``Settings`` builds from ``COORM_REDIS_SENTINEL`` and ``COORM_REDIS_MASTER``::

    redis+sentinel://USER:PASSWORD@HOST:PORT,HOST:PORT,.../DB?master=NAME

(the user and password are the services', for the sentinels and the servers alike).

Replication is asynchronous: a primary killed just after it answered a write may not have passed it on, and
the replica that takes over would not have it. So under Sentinel a write returns only once a replica has
it too (``WAIT``, on the write's own connection), and raises :class:`NotReplicated` otherwise: what a
service acknowledged survives the primary's death."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import BlockingConnectionPool
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.exceptions import RedisError

from coorm.shared import keys

SCHEME = "redis+sentinel"
DEFAULT_MASTER = "coorm"
REPLICAS_TO_WAIT = 1  # replicas that must have a write before it returns
# how long a write waits for them: after a failover the other replica must first follow the new primary (a
# partial resync, a second or two on a loaded machine); a write meanwhile waits rather than fails
WAIT_MS = 5000
# keys whose writes do not wait: the policy engine's lease is liveness, not state -- a lease lost in a failover
# only lets the standby take over, and a leader's appends check the lease on the primary they go to. A renewal
# that waited for a resyncing replica would let the lease lapse, and the two engines take turns
UNREPLICATED = frozenset({keys.POLICY_LEASE})
# Under Sentinel no command may wait for ever on a primary that is gone without closing its connections (a
# host's death, a partition: no reset comes), nor may a connection attempt: they fail, and the client asks
# the sentinels again. Longer than a WAIT (no command blocks in Valkey otherwise).
SOCKET_TIMEOUT = 10.0
CONNECT_TIMEOUT = 2.0

# commands that write nothing: no WAIT after them (anything else, scripts included, may write)
_READS = frozenset({
    "GET", "MGET", "STRLEN", "EXISTS", "TTL", "PTTL", "TYPE", "KEYS", "SCAN", "DBSIZE", "PING", "INFO", "ECHO",
    "HGET", "HMGET", "HGETALL", "HKEYS", "HVALS", "HLEN", "HEXISTS", "HSCAN", "HSTRLEN",
    "SMEMBERS", "SISMEMBER", "SMISMEMBER", "SCARD", "SSCAN", "LRANGE", "LLEN", "LINDEX",
    "ZRANGE", "ZRANGEBYSCORE", "ZREVRANGE", "ZREVRANGEBYSCORE", "ZCARD", "ZSCORE", "ZCOUNT", "ZRANK", "ZSCAN",
    "XRANGE", "XREVRANGE", "XLEN", "XREAD", "XINFO", "XPENDING", "EVAL_RO", "EVALSHA_RO", "SCRIPT", "CLIENT",
    "WAIT", "AUTH", "HELLO", "SELECT", "READONLY", "COMMAND", "CONFIG", "ROLE", "TIME", "OBJECT", "MEMORY",
})


class NotReplicated(RedisError):
    """A write the primary took but no replica confirmed in time: it may not survive a failover."""


@dataclass(frozen=True)
class Target:
    """A ``redis+sentinel://`` URL read."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    username: str | None
    password: str | None
    db: int


def sentinel_url(redis_url: str, sentinels: str, master: str = DEFAULT_MASTER) -> str:
    """The Sentinel form of ``redis_url`` (its user, password and database; its host is not used):
    ``sentinels`` is ``host:port,host:port,...``."""
    parts = urlsplit(redis_url)
    auth = ""
    if parts.username or parts.password:
        # (urlsplit leaves them %-escaped: unescaped, then escaped once)
        user, password = unquote(parts.username or ""), unquote(parts.password or "")
        auth = quote(user, safe="") + (f":{quote(password, safe='')}" if parts.password else "")
        auth += "@"
    db = parts.path.lstrip("/") or "0"
    hosts = ",".join(_host_port(h) for h in sentinels.split(",") if h.strip())
    if not hosts:
        raise ValueError("no sentinel given: write host:port,host:port,...")
    return f"{SCHEME}://{auth}{hosts}/{db}?master={quote(master, safe='')}"


def _host_port(text: str) -> str:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"cannot read the sentinel {text.strip()!r}: write host:port")
    return f"{host}:{port}"


def parse(url: str) -> Target | None:
    """The sentinels and master of a ``redis+sentinel://`` URL; None for a plain ``redis://`` URL."""
    if not url.startswith(f"{SCHEME}://"):
        return None
    rest = url[len(SCHEME) + 3:]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    creds, at, hosts = netloc.rpartition("@")
    user, has_pw, password = creds.partition(":")
    sentinels = []
    for h in hosts.split(","):
        host, _, port = _host_port(h).rpartition(":")
        sentinels.append((host, int(port)))
    master = parse_qs(query).get("master", [DEFAULT_MASTER])[0]
    return Target(tuple(sentinels), master, unquote(user) if at and user else None,
                  unquote(password) if at and has_pw else None, int(path or 0))


def describe(url: str) -> str:
    """Where ``url`` leads, without its password."""
    t = parse(url)
    if t is None:
        from coorm.shared.connection import redact

        return redact(url)
    return f"the primary {t.master!r} of the sentinels " + ",".join(f"{h}:{p}" for h, p in t.sentinels)


# ================================================================================================
# clients
# ================================================================================================
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _is_write(name: Any) -> bool:
    return _text(name).split(" ", 1)[0].upper() not in _READS


def _waits(args: tuple) -> bool:
    """Whether a command must wait for a replica: a write to any key but those of :data:`UNREPLICATED`."""
    if not _is_write(args[0]):
        return False
    name = _text(args[0]).upper()
    if name in ("EVAL", "EVALSHA", "FCALL") and len(args) > 2:
        touched = args[3:3 + int(args[2])]
    elif name in ("SET", "PEXPIRE", "EXPIRE", "DEL", "UNLINK") and len(args) > 1:
        touched = args[1:2] if name != "DEL" and name != "UNLINK" else args[1:]
    else:
        return True
    return not touched or any(_text(k) not in UNREPLICATED for k in touched)


async def _wait_replicated(conn: Any) -> None:
    await conn.send_command("WAIT", REPLICAS_TO_WAIT, WAIT_MS)
    acked = await conn.read_response()
    if int(acked) < REPLICAS_TO_WAIT:
        raise NotReplicated(f"a write reached {acked} replicas within {WAIT_MS} ms, not {REPLICAS_TO_WAIT}")


class _ReplicatedPipeline(Pipeline):
    async def _execute_transaction(self, connection, commands, raise_on_error):
        out = await super()._execute_transaction(connection, commands, raise_on_error)
        if any(_waits(args) for args, _ in commands):
            await _wait_replicated(connection)
        return out

    async def _execute_pipeline(self, connection, commands, raise_on_error):
        out = await super()._execute_pipeline(connection, commands, raise_on_error)
        if any(_waits(args) for args, _ in commands):
            await _wait_replicated(connection)
        return out


class ReplicatedRedis(aioredis.Redis):
    """An asyncio client whose writes return once a replica has them (see the module's docstring)."""

    async def _send_command_parse_response(self, conn, command_name, *args, **options):
        out = await super()._send_command_parse_response(conn, command_name, *args, **options)
        if _waits(args):
            await _wait_replicated(conn)
        return out

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        return _ReplicatedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """The primary's connections, waiting for a free one under load as the plain client's pool does."""


def async_client(url: str, *, max_connections: int = 32, **kwargs: Any) -> aioredis.Redis:
    """An asyncio client of ``url``, either form; its pool waits for a free connection under load."""
    t = parse(url)
    if t is None:
        pool = BlockingConnectionPool.from_url(url, decode_responses=True, max_connections=max_connections,
                                               timeout=None, **kwargs)
        return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes its connections
    auth = {"username": t.username, "password": t.password}
    kwargs = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": CONNECT_TIMEOUT, **kwargs}
    sentinel = Sentinel(list(t.sentinels), sentinel_kwargs={**auth, "socket_timeout": 1.0})
    client = sentinel.master_for(t.master, redis_class=ReplicatedRedis, connection_pool_class=_BlockingSentinelPool,
                                 decode_responses=True, db=t.db, max_connections=max_connections, timeout=None,
                                 **auth, **kwargs)
    client.auto_close_connection_pool = True  # (master_for's pool is the client's own)
    return client


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A blocking client of ``url``, either form (the command line's reads, Celery's tasks)."""
    t = parse(url)
    if t is None:
        return redis.Redis.from_url(url, **kwargs)
    from redis.sentinel import Sentinel as SyncSentinel

    auth = {"username": t.username, "password": t.password}
    kwargs = {"socket_timeout": SOCKET_TIMEOUT, "socket_connect_timeout": CONNECT_TIMEOUT, **kwargs}
    timeout = kwargs.get("socket_connect_timeout") or 1.0
    sentinel = SyncSentinel(list(t.sentinels), sentinel_kwargs={**auth, "socket_timeout": timeout})
    return sentinel.master_for(t.master, db=t.db, **auth, **kwargs)


def celery_config(url: str) -> dict[str, Any]:
    """Celery's broker and result backend on ``url``: the URL itself, or kombu's ``sentinel://`` URLs with
    the master's name and the sentinels' credentials as transport options."""
    t = parse(url)
    if t is None:
        return {"broker_url": url, "result_backend": url}
    auth = (quote(t.username or "", safe="") + ":" + quote(t.password or "", safe="") + "@") if t.password else ""
    urls = ";".join(f"sentinel://{auth}{h}:{p}/{t.db}" for h, p in t.sentinels)
    options = {"master_name": t.master, "sentinel_kwargs": {"username": t.username, "password": t.password}}
    return {"broker_url": urls, "result_backend": urls, "broker_transport_options": options,
            "result_backend_transport_options": options}
