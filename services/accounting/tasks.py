"""Usage roll-ups as Celery tasks (DESIGN §2): the accounting service enqueues one when a request ends or
a preemption is announced; the worker adds it to the per-user and per-application totals in Redis.

Run a worker with ``celery -A coorm.services.accounting.tasks worker`` (broker and result backend: the
``COORM_REDIS_URL`` Redis); ``celery -A coorm.services.accounting.tasks beat`` runs :func:`rollup_all` hourly.

Every roll-up is idempotent: a Lua script adds a request's (or a preemption's) contribution and marks it
counted (``keys.ACCT_ROLLED``) in one step, so a task run twice -- redelivered after a worker died, or
enqueued again by a redelivered lifecycle event -- counts once. :func:`rollup_all` rebuilds every total from
the per-request records (repair, or after the arithmetic changed); the arithmetic is the pure
:func:`coorm.services.accounting.core.rollup`.
"""

from __future__ import annotations

import functools

import redis
import structlog
from celery import Celery

from coorm.services.accounting.core import (
    PreemptionRecord,
    RequestRecord,
    Usage,
    rollup,
    usage_of,
    usage_of_preemption,
    user_of,
)
from coorm.services.accounting.store import CHUNK, read_records
from coorm.shared import keys
from coorm.shared.settings import Settings
from coorm.shared.valkey import celery_config, sync_client

log = structlog.get_logger("coorm.accounting.tasks")

ROLLUP_REQUEST = "coorm.accounting.rollup_request"
ROLLUP_REQUESTS = "coorm.accounting.rollup_requests"
ROLLUP_PREEMPTION = "coorm.accounting.rollup_preemption"
ROLLUP_ALL = "coorm.accounting.rollup_all"

_APPLY = """
if redis.call('sadd', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('sadd', KEYS[2], ARGV[2])
redis.call('sadd', KEYS[3], ARGV[3])
redis.call('hset', KEYS[5], '_user', ARGV[2])
if ARGV[4] ~= '' or redis.call('hexists', KEYS[5], '_kind') == 0 then
  redis.call('hset', KEYS[5], '_kind', ARGV[4])
end
for i = 5, #ARGV, 2 do
  redis.call('hincrbyfloat', KEYS[4], ARGV[i], ARGV[i + 1])
  redis.call('hincrbyfloat', KEYS[5], ARGV[i], ARGV[i + 1])
end
return 1
"""


def make_celery(redis_url: str, *, set_as_current: bool = True) -> Celery:
    """A Celery app on ``redis_url`` (broker and result backend), JSON only. The service makes its own
    (``set_as_current=False``) to enqueue by task name on its configured Redis."""
    where = celery_config(redis_url)  # (one server, or kombu's sentinel:// URLs: coorm.shared.valkey)
    app = Celery("coorm.accounting", broker=where.pop("broker_url"), backend=where.pop("result_backend"),
                 set_as_current=set_as_current)
    app.conf.update(
        **where,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        task_acks_late=True,  # a task a dying worker held runs again (they are idempotent)
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        beat_schedule={"rollup-all-hourly": {"task": ROLLUP_ALL, "schedule": 3600.0}},
        coorm_redis_url=redis_url,
    )
    return app


celery_app = make_celery(Settings().redis_url)


@functools.cache
def _redis(url: str) -> redis.Redis:
    return sync_client(url, decode_responses=True)


# ------------------------------------------------------------------------------------------------
# the work (a sync Redis client in, so that it can be called without a worker too)
# ------------------------------------------------------------------------------------------------
def _apply(r: redis.Redis, member: str, user: str, app: str, app_kind: str, usage: Usage) -> bool:
    args: list = [member, user_of(user), app, app_kind]
    for k, v in usage.to_fields().items():
        args += [k, repr(v)]
    keys_ = [keys.ACCT_ROLLED, keys.ACCT_USERS, keys.ACCT_APPS, keys.acct_user(user_of(user)), keys.acct_app(app)]
    return bool(r.eval(_APPLY, len(keys_), *keys_, *args))


def apply_request(r: redis.Redis, request_id: str) -> bool:
    """Add a finished request to the totals; False if it is unknown, not finished, or already counted."""
    rec = RequestRecord.from_fields(r.hgetall(keys.acct_request(request_id)))
    if rec is None or rec.ended_at is None:
        log.warning("roll-up of a request with no finished record", request=request_id)
        return False
    return _apply(r, f"req:{rec.request}", rec.user, rec.app, rec.app_kind, usage_of(rec))


def apply_preemption(r: redis.Redis, event_id: str) -> bool:
    """Add a preemption to its application's and user's totals; False if unknown or already counted."""
    raw = r.hget(keys.ACCT_PREEMPTIONS, event_id)
    if raw is None:
        log.warning("roll-up of an unknown preemption", event_id=event_id)
        return False
    p = PreemptionRecord.from_json(raw)
    return _apply(r, f"pre:{p.id}", p.user, p.app, p.app_kind, usage_of_preemption(p))


def rebuild(r: redis.Redis) -> dict:
    """Recompute every total from the records and replace the old ones in one transaction (retried if a
    roll-up lands meanwhile)."""
    summary: dict = {}

    def swap(pipe) -> None:
        requests, preemptions = read_records(r)
        totals = rollup(requests, preemptions)
        old_users = pipe.smembers(keys.ACCT_USERS)
        old_apps = pipe.smembers(keys.ACCT_APPS)
        pipe.multi()
        stale = [keys.acct_user(u) for u in old_users] + [keys.acct_app(a) for a in old_apps]
        for i in range(0, len(stale), CHUNK):
            pipe.delete(*stale[i:i + CHUNK])
        pipe.delete(keys.ACCT_USERS, keys.ACCT_APPS, keys.ACCT_ROLLED)
        for u, usage in totals.users.items():
            pipe.hset(keys.acct_user(u), mapping={k: repr(v) for k, v in usage.to_fields().items()})
            pipe.sadd(keys.ACCT_USERS, u)
        for a, usage in totals.apps.items():
            fields = {k: repr(v) for k, v in usage.to_fields().items()}
            fields.update(_user=totals.app_owner.get(a, ""), _kind=totals.app_kind.get(a, ""))
            pipe.hset(keys.acct_app(a), mapping=fields)
            pipe.sadd(keys.ACCT_APPS, a)
        members = [f"req:{x.request}" for x in requests if x.ended_at is not None]
        members += [f"pre:{p.id}" for p in preemptions]
        for i in range(0, len(members), CHUNK):
            pipe.sadd(keys.ACCT_ROLLED, *members[i:i + CHUNK])
        summary.update(requests=len(requests), preemptions=len(preemptions), users=len(totals.users),
                       apps=len(totals.apps))

    r.transaction(swap, keys.ACCT_ENDED, keys.ACCT_PREEMPTIONS_AT, keys.ACCT_ROLLED, keys.ACCT_USERS, keys.ACCT_APPS)
    return summary


# ------------------------------------------------------------------------------------------------
# the tasks
# ------------------------------------------------------------------------------------------------
@celery_app.task(name=ROLLUP_REQUEST, bind=True)
def rollup_request(self, request_id: str) -> bool:
    """Add one finished request's usage to its user's and application's totals (once)."""
    return apply_request(_redis(self.app.conf.coorm_redis_url), request_id)


@celery_app.task(name=ROLLUP_REQUESTS, bind=True)
def rollup_requests(self, request_ids: list[str]) -> int:
    """Add finished requests' usage to the totals (each once): how many were added."""
    r = _redis(self.app.conf.coorm_redis_url)
    return sum(apply_request(r, request_id) for request_id in request_ids)


@celery_app.task(name=ROLLUP_PREEMPTION, bind=True)
def rollup_preemption(self, event_id: str) -> bool:
    """Count one preemption for its application and user (once)."""
    return apply_preemption(_redis(self.app.conf.coorm_redis_url), event_id)


@celery_app.task(name=ROLLUP_ALL, bind=True)
def rollup_all(self) -> dict:
    """Rebuild every total from the per-request records (beat, repair)."""
    summary = rebuild(_redis(self.app.conf.coorm_redis_url))
    log.info("accounting totals rebuilt", **summary)
    return summary
