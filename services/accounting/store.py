"""Reading accounting state from Redis (sync client): the per-request and preemption records, and the
rolled-up totals. Shared by the roll-up tasks and the usage report (which so needs no Celery)."""

from __future__ import annotations

import redis

from coorm.services.accounting.core import PreemptionRecord, RequestRecord, Totals, Usage
from coorm.shared import keys

CHUNK = 5000  # keys per pipeline / command when reading or writing many


def read_records(r: redis.Redis, since: float | None = None) -> tuple[list[RequestRecord], list[PreemptionRecord]]:
    """The finished requests (ended at or after ``since``) and the preemptions (announced at or after)."""
    low = "-inf" if since is None else repr(float(since))
    ids = r.zrangebyscore(keys.ACCT_ENDED, low, "+inf")
    requests: list[RequestRecord] = []
    for i in range(0, len(ids), CHUNK):
        pipe = r.pipeline(transaction=False)
        for rid in ids[i:i + CHUNK]:
            pipe.hgetall(keys.acct_request(rid))
        requests += [rec for rec in map(RequestRecord.from_fields, pipe.execute()) if rec is not None]
    pids = r.zrangebyscore(keys.ACCT_PREEMPTIONS_AT, low, "+inf")
    preemptions: list[PreemptionRecord] = []
    for i in range(0, len(pids), CHUNK):
        raws = r.hmget(keys.ACCT_PREEMPTIONS, pids[i:i + CHUNK])
        preemptions += [PreemptionRecord.from_json(x) for x in raws if x is not None]
    return requests, preemptions


def read_totals(r: redis.Redis) -> Totals:
    """The rolled-up totals as the tasks keep them."""
    totals = Totals()
    users = sorted(r.smembers(keys.ACCT_USERS))
    apps = sorted(r.smembers(keys.ACCT_APPS))
    pipe = r.pipeline(transaction=False)
    for u in users:
        pipe.hgetall(keys.acct_user(u))
    for a in apps:
        pipe.hgetall(keys.acct_app(a))
    got = pipe.execute()
    for u, f in zip(users, got[:len(users)], strict=True):
        totals.users[u] = Usage.from_fields(f)
    for a, f in zip(apps, got[len(users):], strict=True):
        totals.apps[a] = Usage.from_fields(f)
        totals.app_owner[a] = f.get("_user", "")
        totals.app_kind[a] = f.get("_kind", "")
    return totals
