"""Accounting: the pure roll-up arithmetic and ``since`` parser, then the service on a real nats-server
(JetStream) and Redis, with a real Celery worker consuming from the Redis broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
import structlog
from prometheus_client import REGISTRY
from rich.console import Console

from coorm.services.accounting.core import (
    Malformed,
    PreemptionRecord,
    RequestRecord,
    Usage,
    check,
    request_fields,
    rollup,
    since_filter,
    usage_of,
)
from coorm.services.accounting.report import print_usage, rows_of, usage_report
from coorm.services.accounting.service import DURABLE, AccountingService
from coorm.services.accounting.tasks import (
    ROLLUP_ALL,
    ROLLUP_REQUEST,
    apply_preemption,
    apply_request,
    make_celery,
    rebuild,
)
from coorm.services.runtime import ensure_streams
from coorm.shared import bus, keys, subjects
from coorm.shared.endpoints import Role
from coorm.shared.protocol import DeadLetter, Lifecycle, LifecycleKind
from coorm.shared.settings import Settings
from coorm.shared.when import parse_since

ROOT = Path(__file__).resolve().parents[2]
T = 1_700_000_000.0
H = 3600.0
NP, P, PA = "non-preemptible", "preemptible", "pre-allocation"
DEADLINE = 20.0  # seconds any condition below may take (a worker starting included)


# ================================================================================================
# the pure core
# ================================================================================================
def rec(request, app="a1", user="alice", type=NP, nodes=4, submitted=None, started=None, ended=None,
        reason="done", kind="rigid") -> RequestRecord:
    return RequestRecord(request=request, app=app, user=user, app_kind=kind, type=type, cluster="c1", nodes=nodes,
                         submitted_at=submitted, started_at=started, ended_at=ended, reason=reason)


def test_usage_of_a_finished_request():
    u = usage_of(rec("r1", nodes=4, submitted=T, started=T + 100, ended=T + 100 + H))
    assert u.node_seconds == {PA: 0.0, NP: 4 * H, P: 0.0}
    assert (u.requests, u.started, u.waited, u.wait_seconds) == (1, 1, 1, 100.0)
    assert (u.walltime_kills, u.violations, u.node_failures, u.waste_node_seconds) == (0, 0, 0, 0.0)


def test_usage_of_unfinished_cancelled_and_unknown_submission():
    assert usage_of(rec("r1", started=T)) == Usage()  # not ended: nothing yet
    cancelled = usage_of(rec("r2", submitted=T, ended=T + 5, reason="cancelled"))
    assert (cancelled.requests, cancelled.started, sum(cancelled.node_seconds.values())) == (1, 0, 0.0)
    no_submit = usage_of(rec("r3", nodes=2, started=T, ended=T + H, reason="node_failure"))
    assert (no_submit.waited, no_submit.mean_wait, no_submit.node_failures) == (0, None, 1)
    assert no_submit.node_seconds[NP] == 2 * H


def test_rollup_by_user_and_application():
    requests = [
        rec("r1", nodes=4, submitted=T, started=T + 100, ended=T + 100 + H),
        rec("r2", type=PA, nodes=2, submitted=T + 50, started=T + 350, ended=T + 350 + H / 2, reason="walltime"),
        rec("r3", app="b1", user="bob", kind="psa", type=P, nodes=8, submitted=T, started=T + 10,
            ended=T + 10 + H / 4, reason="violation"),
        rec("r4", app="b1", user="bob", kind="psa", submitted=T, ended=T + 20, reason="cancelled"),
        rec("r5", app="b2", user="bob", nodes=1, started=T + 1000, ended=T + 1000 + 2 * H, reason="node_failure"),
        rec("r6", app="b2", user="bob", nodes=1, started=T + 1000),  # still running: not counted
        rec("r1", nodes=4, submitted=T, started=T + 100, ended=T + 100 + H),  # the same record again
    ]
    preemptions = [PreemptionRecord(id="e7.1", app="b1", user="bob", app_kind="psa", at=T + 500, allowed=2)] * 2
    totals = rollup(requests, preemptions)
    alice, bob = totals.users["alice"], totals.users["bob"]
    assert alice.node_seconds == {PA: 1 * H, NP: 4 * H, P: 0.0}
    assert (alice.requests, alice.mean_wait, alice.walltime_kills) == (2, 200.0, 1)
    assert bob.node_seconds == {PA: 0.0, NP: 2 * H, P: 2 * H}
    assert (bob.requests, bob.started, bob.mean_wait) == (3, 2, 10.0)
    assert (bob.preemptions, bob.violations, bob.node_failures, bob.waste_node_seconds) == (1, 1, 1, 2 * H)
    b1 = totals.apps["b1"]
    assert (b1.requests, b1.preemptions, b1.waste_node_seconds, b1.node_seconds[P]) == (2, 1, 2 * H, 2 * H)
    assert totals.app_owner == {"a1": "alice", "b1": "bob", "b2": "bob"}
    assert totals.app_kind["b1"] == "psa"
    # a non-preemptible request ended by violation is not waste (only preemptible work taken back is)
    killed = rollup([rec("x", nodes=3, started=T, ended=T + H, reason="violation")]).users["alice"]
    assert (killed.violations, killed.waste_node_seconds) == (1, 0.0)


def test_rollup_of_no_user_and_since_filter():
    totals = rollup([rec("r1", user="", started=T, ended=T + H)])
    assert list(totals.users) == ["-"]
    reqs = [rec("old", started=T, ended=T + H), rec("new", started=T, ended=T + 5 * H), rec("run", started=T)]
    pres = [PreemptionRecord(id="p1", app="a1", at=T), PreemptionRecord(id="p2", app="a1", at=T + 4 * H)]
    r, p = since_filter(reqs, pres, T + 2 * H)
    assert [x.request for x in r] == ["new"] and [x.id for x in p] == ["p2"]


def test_usage_fields_round_trip():
    u = usage_of(rec("r", type=P, nodes=3, submitted=T, started=T + 7, ended=T + 107, reason="violation"))
    u.preemptions = 2
    back = Usage.from_fields({k: repr(v) for k, v in u.to_fields().items()})
    assert back == u


def test_request_fields_never_blank_what_is_known():
    started = Lifecycle(kind=LifecycleKind.STARTED, at=T + 5, app="a1", user="alice", request="r1", type=NP,
                        cluster="c1", nodes=4, submitted_at=T, started_at=T + 5)
    ended = Lifecycle(kind=LifecycleKind.ENDED, at=T + 65, app="a1", request="r1", type=NP, cluster="c1", nodes=4,
                      reason="done")
    merged = {**request_fields(started), **request_fields(ended)}
    assert merged["user"] == "alice" and merged["started_at"] == repr(T + 5) and merged["submitted_at"] == repr(T)
    assert RequestRecord.from_fields(merged) == RequestRecord(
        request="r1", app="a1", user="alice", type=NP, cluster="c1", nodes=4, submitted_at=T, started_at=T + 5,
        ended_at=T + 65, reason="done")
    with pytest.raises(Malformed):
        check(Lifecycle(kind=LifecycleKind.ENDED, at=T, app="a1", type=NP, reason="done"))
    with pytest.raises(Malformed):
        check(Lifecycle(kind=LifecycleKind.STARTED, at=T, app="a1", request="r1", type="rigid"))


NOW = datetime(2024, 5, 10, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("text", "expected"), [
    ("2h", NOW - 2 * H),
    ("1d", NOW - 24 * H),
    ("90m", NOW - 90 * 60),
    ("45s", NOW - 45),
    ("1w", NOW - 7 * 24 * H),
    ("1h30m", NOW - 1.5 * H),
    ("1.5h", NOW - 1.5 * H),
    (" 2H ", NOW - 2 * H),
    ("2024-05-01T00:00:00Z", datetime(2024, 5, 1, tzinfo=UTC).timestamp()),
    ("2024-05-01T12:30+02:00", datetime(2024, 5, 1, 10, 30, tzinfo=UTC).timestamp()),
    ("2024-05-01", datetime(2024, 5, 1).timestamp()),  # no zone: local time
    ("2024-05-01 08:15", datetime(2024, 5, 1, 8, 15).timestamp()),
    ("1714550400", 1714550400.0),
])
def test_parse_since(text, expected):
    assert parse_since(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "yesterday", "2h ago", "-2h", "h", "2024-13-01", "5x"])
def test_parse_since_refuses(text):
    with pytest.raises(ValueError, match="cannot read"):
        parse_since(text, NOW)


def test_print_usage(capsys):
    rows = rows_of(rollup([rec("r1", nodes=4, submitted=T, started=T + 90, ended=T + 90 + H)]))
    print_usage(rows, json_output=True)
    assert json.loads(capsys.readouterr().out) == rows
    console = Console(record=True, width=220)
    print_usage(rows, json_output=False, console=console)
    text = console.export_text()
    assert "alice" in text and "a1 (rigid)" in text and "4.00" in text and "90 s" in text
    print_usage([], console=console)
    assert "no usage recorded" in console.export_text()


# ================================================================================================
# live: real JetStream, real Redis, real Celery worker
# ================================================================================================
@pytest.fixture
async def js(nats_url, redis_url):
    """A JetStream context on a clean lifecycle stream with no accounting consumer yet."""
    nc = await bus.connect(nats_url, "test-accounting", Settings().identity(Role.SERVICE))
    jsc = nc.jetstream()
    await ensure_streams(jsc, 1)
    await jsc.purge_stream(subjects.LIFECYCLE_STREAM)
    with contextlib.suppress(Exception):
        await jsc.delete_consumer(subjects.LIFECYCLE_STREAM, DURABLE)
    yield jsc
    await nc.drain()


@pytest.fixture
def settings(nats_url, redis_url):
    return Settings(nats_url=nats_url, redis_url=redis_url)


@pytest.fixture
def worker(redis_url, tmp_path):
    """A real Celery worker process on the test's Redis (broker and result backend)."""
    env = dict(os.environ, COORM_REDIS_URL=redis_url, COORM_CONNECTION_FILE=str(tmp_path / "none.json"))
    celery = Path(sys.executable).parent / "celery"
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as out:
        proc = subprocess.Popen(
            [str(celery), "-A", "coorm.services.accounting.tasks", "worker", "--pool=solo", "--concurrency=1",
             "-l", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode in (0, -15), log_path.read_text()


@pytest.fixture
def producer(redis_url):
    app = make_celery(redis_url, set_as_current=False)
    yield app
    app.close()


@contextlib.asynccontextmanager
async def running(settings):
    svc = AccountingService(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(svc.run(stop))
    ready = asyncio.create_task(svc.ready.wait())
    await asyncio.wait([task, ready], timeout=DEADLINE, return_when=asyncio.FIRST_COMPLETED)
    if not svc.ready.is_set():
        ready.cancel()
        task.cancel()
        await asyncio.gather(task, ready, return_exceptions=True)
        raise AssertionError("the accounting service did not start")
    try:
        yield svc
    finally:
        stop.set()
        await asyncio.wait_for(task, DEADLINE)


async def until(condition, what: str, timeout: float = DEADLINE):
    """Poll ``condition`` (sync or async) until it is truthy; fail after ``timeout`` saying ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)  # poll interval of a deadline loop, not a synchronisation


async def consumed(jsc, seq: int) -> bool:
    """Everything up to stream sequence ``seq`` was delivered to the accounting consumer and acked."""
    try:
        ci = await jsc.consumer_info(subjects.LIFECYCLE_STREAM, DURABLE)
    except Exception:  # noqa: BLE001 - not created yet
        return False
    return ci.ack_floor.stream_seq >= seq and ci.num_ack_pending == 0


class Publisher:
    def __init__(self, jsc) -> None:
        self.js = jsc
        self.tag = uuid.uuid4().hex[:8]
        self.n = 0
        self.last = 0

    async def raw(self, data: bytes, msg_id: str | None = None) -> int:
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        ack = await self.js.publish(subjects.LIFECYCLE, data, headers=headers)
        self.last = max(self.last, ack.seq)
        return ack.seq

    async def __call__(self, kind: str, msg_id: str | None = None, **kw) -> str:
        self.n += 1
        msg_id = msg_id or f"{self.tag}.e{self.n}.life"
        await self.raw(bus.encode(Lifecycle(kind=LifecycleKind(kind), **kw)), msg_id)
        return msg_id

    async def request(self, request, app, user, kind, type, nodes, submitted, started, ended, reason):
        common = dict(app=app, user=user, app_kind=kind, request=request, type=type, cluster="c1", nodes=nodes)
        if started is not None:
            await self("started", at=started, submitted_at=submitted, started_at=started, **common)
        await self("ended", at=ended, started_at=started, reason=reason, **common)


def sync_redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def by_key(rows):
    return {(r["user"], r["app"]): r for r in rows}


def norm(x):
    """Rows with floats rounded (node-hours are sums of floats), for comparing with ``==``."""
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    if isinstance(x, list):
        return [norm(v) for v in x]
    return x


EXPECTED = {
    ("alice", None): dict(node_hours={PA: 1.0, NP: 4.0, P: 0.0}, requests=2, started=2, mean_wait_s=200.0,
                          preemptions=0, walltime_kills=1, violations=0, node_failures=0, waste_node_hours=0.0),
    ("alice", "a1"): dict(node_hours={PA: 1.0, NP: 4.0, P: 0.0}, requests=2, started=2, mean_wait_s=200.0,
                          preemptions=0, walltime_kills=1, violations=0, node_failures=0, waste_node_hours=0.0),
    ("bob", None): dict(node_hours={PA: 0.0, NP: 2.0, P: 2.0}, requests=3, started=2, mean_wait_s=10.0,
                        preemptions=1, walltime_kills=0, violations=1, node_failures=1, waste_node_hours=2.0),
    ("bob", "b1"): dict(node_hours={PA: 0.0, NP: 0.0, P: 2.0}, requests=2, started=1, mean_wait_s=10.0,
                        preemptions=1, walltime_kills=0, violations=1, node_failures=0, waste_node_hours=2.0),
    ("bob", "b2"): dict(node_hours={PA: 0.0, NP: 2.0, P: 0.0}, requests=1, started=1, mean_wait_s=None,
                        preemptions=0, walltime_kills=0, violations=0, node_failures=1, waste_node_hours=0.0),
}


def matches(rows) -> bool:
    got = {k: {f: r[f] for f in EXPECTED[("alice", None)]} for k, r in by_key(rows).items()}
    return norm(got) == norm(EXPECTED)


async def publish_story(pub: Publisher) -> None:
    """alice (a1, rigid): 4 nodes for 1 h after waiting 100 s; a 2-node pre-allocation killed at walltime
    after 30 min, having waited 300 s. bob (b1, psa): preempted once; 8 preemptible nodes for 15 min ended
    by violation after waiting 10 s; a request cancelled before it started. bob (b2): 1 node for 2 h, ended
    by a node failure, submission time unknown."""
    await pub("session_opened", at=T, app="a1", user="alice", app_kind="rigid")
    await pub.request("r1", "a1", "alice", "rigid", NP, 4, T, T + 100, T + 100 + H, "done")
    await pub.request("r2", "a1", "alice", "rigid", PA, 2, T + 50, T + 350, T + 350 + H / 2, "walltime")
    await pub("preemption", at=T + 500, app="b1", user="bob", app_kind="psa", cluster="c1", allowed=2,
              deadline=T + 510)
    await pub.request("r3", "b1", "bob", "psa", P, 8, T, T + 10, T + 10 + H / 4, "violation")
    await pub.request("r4", "b1", "bob", "psa", NP, 3, None, None, T + 20, "cancelled")
    await pub.request("r5", "b2", "bob", "rigid", NP, 1, None, T + 1000, T + 1000 + 2 * H, "node_failure")
    await pub("session_ended", at=T + 9000, app="b1", user="bob", app_kind="psa", reason="closed")


async def test_service_records_and_worker_rolls_up(js, settings, redis_url, worker, producer):
    pub = Publisher(js)
    with structlog.testing.capture_logs() as logs:
        async with running(settings):
            await pub("session_opened", at=T, app="b1", user="bob", app_kind="psa")
            await pub.raw(b"this is not JSON", msg_id=f"{pub.tag}.junk")
            await pub.raw(json.dumps({"kind": "ended", "at": T, "app": "a1", "type": NP, "reason": "done"}).encode())
            await pub.raw(json.dumps({"kind": "teleported", "at": T, "app": "a1"}).encode())
            await publish_story(pub)
            await until(lambda: consumed(js, pub.last), "the service to ack every message")

            def rolled_up():
                rows = usage_report(redis_url)
                return rows if matches(rows) else None

            rows = await until(rolled_up, "the worker to roll every request up")
    skipped = [e for e in logs if e["event"] == "stream message set aside"]  # dead-lettered, logged once each
    assert len(skipped) == 3 and all(e["log_level"] == "warning" for e in skipped)
    assert {e["stream"] for e in skipped} == {subjects.LIFECYCLE_STREAM}
    assert "not JSON" in skipped[0]["error"] and "request id" in skipped[1]["error"]

    r = sync_redis(redis_url)
    try:
        assert r.xlen(keys.ACCT_EVENTS) == 13  # every valid event, raw
        assert r.llen(keys.ACCT_REJECTED) == 3
        r1 = RequestRecord.from_fields(r.hgetall(keys.acct_request("r1")))
        assert r1 == RequestRecord(request="r1", app="a1", user="alice", app_kind="rigid", type=NP, cluster="c1",
                                   nodes=4, submitted_at=T, started_at=T + 100, ended_at=T + 100 + H, reason="done")
        assert r.zcard(keys.ACCT_ENDED) == 5 and r.hlen(keys.ACCT_PREEMPTIONS) == 1
    finally:
        r.close()
    assert [(x["user"], x["app"]) for x in rows] == [("alice", None), ("alice", "a1"), ("bob", None),
                                                      ("bob", "b1"), ("bob", "b2")]
    assert [x["app_kind"] for x in rows] == [None, "rigid", None, "psa", "rigid"]
    # the per-request records give the same totals (since = the beginning of time) ...
    assert matches(usage_report(redis_url, since=0.0))
    # ... and so does rebuilding every total from them, by the worker
    summary = await asyncio.to_thread(producer.send_task(ROLLUP_ALL).get, timeout=DEADLINE)
    assert summary == {"requests": 5, "preemptions": 1, "users": 2, "apps": 3}
    assert matches(usage_report(redis_url))
    assert [x["app"] for x in usage_report(redis_url, user="bob")] == [None, "b1", "b2"]


async def test_redelivery_counts_once(js, settings, redis_url, worker, producer):
    pub = Publisher(js)
    await pub.request("r1", "a1", "alice", "rigid", NP, 4, T, T + 100, T + 100 + H, "done")
    ended_id = f"{pub.tag}.e{pub.n}.life"
    await pub("preemption", at=T + 200, app="a1", user="alice", app_kind="rigid", cluster="c1", allowed=0,
              deadline=T + 210)
    # an instance records everything, enqueues the roll-ups, then dies before acking: JetStream redelivers
    # (the nak stands for its ack wait running out)
    crashed = AccountingService(settings, name="accounting-crashed")
    await crashed.start()
    msgs = await crashed.sub.fetch(batch=10, timeout=5)
    assert len(msgs) == 3
    assert [await crashed.process(m) for m in msgs] == [True, True, True]
    for m in msgs:
        await m.nak()
    await crashed.close()
    # a new leader republishes the end: after the stream's de-duplication window (a new message id), and
    # within it (the same id: JetStream drops it)
    await pub.request("r1", "a1", "alice", "rigid", NP, 4, T, None, T + 100 + H, "done")
    await pub.raw(bus.encode(Lifecycle(kind=LifecycleKind.ENDED, at=T + 100 + H, app="a1", request="r1", type=NP,
                                       nodes=4, reason="done")), msg_id=ended_id)
    with structlog.testing.capture_logs() as logs:
        async with running(settings):
            await until(lambda: consumed(js, pub.last), "the service to ack every message")
    duplicates = [e for e in logs if e["event"] == "duplicate lifecycle event ignored"]
    assert len(duplicates) == 4  # the 3 redelivered, the republished end
    # every roll-up was enqueued at least twice; the worker works in order, so once this one is done, all are
    assert await asyncio.to_thread(producer.send_task(ROLLUP_REQUEST, args=["no-such"]).get, timeout=DEADLINE) is False
    (alice, a1) = usage_report(redis_url)
    for row in (alice, a1):
        assert row["node_hours"][NP] == pytest.approx(4.0)
        assert (row["requests"], row["preemptions"], row["mean_wait_s"]) == (1, 1, 100.0)
    r = sync_redis(redis_url)
    try:
        assert r.xlen(keys.ACCT_EVENTS) == 3
    finally:
        r.close()


async def test_restart_resumes_where_it_stopped(js, settings, redis_url):
    pub = Publisher(js)
    async with running(settings):
        await pub.request("r1", "a1", "alice", "rigid", NP, 2, T, T + 60, T + 60 + H, "done")
        await until(lambda: consumed(js, pub.last), "the first instance to ack")
    await pub.request("r2", "a1", "alice", "rigid", NP, 2, T, T + 120, T + 120 + H, "done")  # while none runs
    async with running(settings):
        await until(lambda: consumed(js, pub.last), "the second instance to ack")
    (alice, a1) = usage_report(redis_url, since=0.0)
    assert (alice["requests"], alice["node_hours"][NP], alice["mean_wait_s"]) == (2, pytest.approx(4.0), 90.0)
    r = sync_redis(redis_url)
    try:
        assert r.xlen(keys.ACCT_EVENTS) == 4
    finally:
        r.close()


async def test_since_filters_by_end_time_and_user(js, settings, redis_url):
    pub = Publisher(js)
    async with running(settings):
        await pub.request("old", "a1", "alice", "rigid", NP, 4, T, T, T + H, "done")
        await pub("preemption", at=T + 10, app="a1", user="alice", app_kind="rigid", cluster="c1", allowed=1)
        await pub.request("new", "a1", "alice", "rigid", NP, 1, T + 5 * H, T + 5 * H, T + 6 * H, "walltime")
        await pub.request("b", "b1", "bob", "psa", P, 2, T + 5 * H, T + 5 * H, T + 6 * H, "violation")
        await pub("preemption", at=T + 5.5 * H, app="b1", user="bob", app_kind="psa", cluster="c1", allowed=0)
        await until(lambda: consumed(js, pub.last), "the service to ack every message")
    since = parse_since("2h", now=T + 6 * H)  # = T + 4 h
    alice, a1, bob, b1 = usage_report(redis_url, since=since)
    assert (alice["requests"], alice["node_hours"][NP], alice["walltime_kills"], alice["preemptions"]) == (
        1, pytest.approx(1.0), 1, 0)
    assert (bob["requests"], bob["preemptions"], bob["waste_node_hours"]) == (1, 1, pytest.approx(2.0))
    assert [x["app"] for x in usage_report(redis_url, user="alice", since=since)] == [None, "a1"]
    assert usage_report(redis_url, since=T + 7 * H) == []
    everything = usage_report(redis_url, user="alice", since=0.0)
    assert (everything[0]["requests"], everything[0]["preemptions"]) == (2, 1)

    # the roll-ups (here called without a worker) count each request and preemption once, and the totals
    # equal a rebuild from the records
    r = sync_redis(redis_url)
    try:
        pre_ids = r.zrange(keys.ACCT_PREEMPTIONS_AT, 0, -1)
        for _ in range(2):
            assert [apply_request(r, x) for x in ("old", "new", "b")] == [_ == 0] * 3
            assert [apply_preemption(r, x) for x in pre_ids] == [_ == 0] * 2
        assert not apply_request(r, "never-seen")
        incremental = norm(usage_report(redis_url))
        assert incremental == norm(usage_report(redis_url, since=0.0))
        assert rebuild(r) == {"requests": 3, "preemptions": 2, "users": 2, "apps": 2}
        assert norm(usage_report(redis_url)) == incremental
    finally:
        r.close()


# ================================================================================================
# poison messages: set aside, never delivered again, and the stream goes on
# ================================================================================================
@contextlib.asynccontextmanager
async def dead_letters(settings):
    """The dead letters of the lifecycle stream, as they are published."""
    nc = await bus.connect(settings.nats_url, "test-dead-letters", settings.identity(Role.SERVICE))
    letters: asyncio.Queue = asyncio.Queue()
    await nc.subscribe(subjects.deadletter(subjects.LIFECYCLE_STREAM), cb=letters.put)
    await bus.settled(nc)

    async def next_letter() -> DeadLetter:
        return DeadLetter.model_validate_json((await asyncio.wait_for(letters.get(), DEADLINE)).data)

    try:
        yield next_letter
    finally:
        await bus.shutdown(nc)


def dead_lettered() -> float:
    return REGISTRY.get_sample_value("coorm_dead_letters_total", {"stream": subjects.LIFECYCLE_STREAM}) or 0.0


async def test_a_message_that_is_no_lifecycle_event_is_set_aside_at_once(js, settings, redis_url):
    """A ``NaN`` time once went through to Redis, which refused it, and deep nesting was a RecursionError:
    either message came back for ever. Neither is an event: each goes aside at its first delivery, and the
    next event is recorded."""
    pub = Publisher(js)
    poison = [json.dumps({"kind": "ended", "at": float("nan"), "app": "a1", "request": "r1", "type": NP,
                          "reason": "done", "started_at": T}).encode(),
              b'{"kind": "started", "at": ' + b"[" * 50_000 + b"]" * 50_000 + b', "app": "a1"}',
              b"\xff\xfe not even text"]
    before = dead_lettered()
    async with dead_letters(settings) as next_letter, running(settings):
        seqs = [await pub.raw(data) for data in poison]
        letters = [await next_letter() for _ in poison]
        await pub("session_opened", at=T, app="a1", user="alice", app_kind="rigid")
        await until(lambda: consumed(js, pub.last), "the service to go past every message")
    assert [x.sequence for x in letters] == seqs
    assert {(x.stream, x.consumer, x.subject, x.deliveries) for x in letters} == {
        (subjects.LIFECYCLE_STREAM, DURABLE, subjects.LIFECYCLE, 1)}
    assert "NaN" in letters[0].error and "nested" in letters[1].error and "not JSON" in letters[2].error
    assert [x.size for x in letters] == [len(x) for x in poison] and letters[2].data.startswith("\ufffd")
    assert dead_lettered() == before + 3
    r = sync_redis(redis_url)
    try:
        assert (r.xlen(keys.ACCT_EVENTS), r.llen(keys.ACCT_REJECTED)) == (1, 3)
    finally:
        r.close()


async def test_a_message_that_fails_every_delivery_is_set_aside_after_the_last(js, settings, redis_url):
    """A message whose recording fails for a reason of its own (here Redis refuses the write: the key that
    de-duplicates events is of the wrong type) is delivered again with back-off, MAX_DELIVERIES times, then
    set aside; once the fault is gone, the next event is recorded."""
    pub = Publisher(js)
    r = sync_redis(redis_url)
    r.set(keys.ACCT_SEEN, "not a sorted set")
    before = dead_lettered()
    try:
        async with dead_letters(settings) as next_letter, running(settings):
            seq = await pub.raw(bus.encode(Lifecycle(kind=LifecycleKind.SESSION_OPENED, at=T, app="a1")))
            letter = await next_letter()
            r.delete(keys.ACCT_SEEN)
            await pub("session_opened", at=T, app="a2", user="bob", app_kind="psa")
            await until(lambda: consumed(js, pub.last), "the service to go past every message")
        assert (letter.sequence, letter.deliveries) == (seq, bus.MAX_DELIVERIES)
        assert "WRONGTYPE" in letter.error and f"failed {bus.MAX_DELIVERIES} deliveries" in letter.error
        assert dead_lettered() == before + 1
        assert [json.loads(f["event"])["app"] for _, f in r.xrange(keys.ACCT_EVENTS)] == ["a2"]
    finally:
        r.close()
