"""Hostile input on every request/reply subject of the endpoint table, against the running services and
agents: ``COORM_FUZZ_MESSAGES`` (10,000 by default) messages drawn by hypothesis -- raw bytes, truncated and
deep JSON, wrong types, payloads of a megabyte up to the server's max payload, ``NaN`` and ``Infinity``,
huge and negative numbers, wildcard-ish and non-ASCII ids in the subject and in the message -- sent
``IN_FLIGHT`` at a time. Every request is answered in time, with a refusal whose code the table lists for the
subject and which is never the internal ``unavailable`` (or, on a subject that only reads, with its valid
reply); nothing changes (the status and the policy's Redis keys); every service stays up; the memory of the
process that runs them stays bounded.

The services and agents run in this process (``LocalStack``); the hostile client is a process of its own
(this module run as a script), as a real one would be: so its hypothesis bookkeeping does not count as the
services' memory, and it does not share their loop. It draws the batches, checks each answer and the state
after each batch, and tells this process of each batch on its stdout."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from pydantic import ValidationError

from coorm.launchers.sdk import Session
from coorm.services.stack import LocalStack
from coorm.shared import bus, keys, subjects
from coorm.shared.endpoints import APP, ENDPOINTS, NODE, USER, Endpoint, Kind, Role, permissions
from coorm.shared.events import ErrorCode
from coorm.shared.protocol import StatusQuery, StatusReply
from coorm.shared.requests import RequestSpec
from coorm.shared.settings import Settings
from tests.live.prober import Prober

pytestmark = pytest.mark.slow

MESSAGES = int(os.environ.get("COORM_FUZZ_MESSAGES", "10000"))
BATCH = 250  # messages drawn per hypothesis example, then sent together
IN_FLIGHT = 200  # requests awaiting their reply at once
REPLY_WITHIN = 10.0  # seconds (the slowest answer, under the load of IN_FLIGHT megabyte messages)
FUZZ_WITHIN = 600.0  # seconds for the whole run
RSS_GROWTH = 32 * 1024 * 1024  # bytes the services may grow by in the second half (a leak of 7 kB a message shows)
ROOT = Path(__file__).resolve().parents[2]

REQUESTS = tuple(e for e in ENDPOINTS if e.kind is Kind.REQUEST)
# subjects whose handler only reads: their valid messages get a valid reply, and change nothing
READ_ONLY = {subjects.app_views(APP), subjects.CLUSTERS_INFO, subjects.CLUSTERS_INTERINFO, subjects.QUERY_STATUS,
             subjects.VIEWS_QUERY}
# subjects whose valid messages carry a session token: with a token that is not the session's, refused
TOKEN_CHECKED = {subjects.app_request(APP), subjects.app_done(APP), subjects.app_close(APP),
                 subjects.app_heartbeat(APP), subjects.node_launch(NODE, USER)}


@dataclass(frozen=True)
class Ctx:
    apps: tuple[str, ...]
    nodes: tuple[str, ...]  # the agents' nodes (a node nobody serves has no responders)
    tokens: dict[str, str]  # app -> its session's token
    held: tuple[str, ...]  # the nodes a's started request holds
    max_payload: int


@dataclass(frozen=True, repr=False)
class Message:
    endpoint: Endpoint
    subject: str
    served: bool  # some service subscribes to the subject: an answer must come
    payload: bytes
    real_token: bool  # carries the token of the subject's own session (then it must be refused otherwise)
    what: str  # how it was made, for a failure's message

    def __repr__(self) -> str:  # short: a failure names the messages
        return f"{self.subject!r} [{self.what}] {len(self.payload)} bytes {self.payload[:120]!r}"

    def _repr_pretty_(self, p, cycle) -> None:  # what hypothesis prints a draw with
        p.text(repr(self))


# ================================================================================================
# hostile values
# ================================================================================================
RAW = "\x00raw:"  # a string value that goes on the wire as the JSON text that follows (1e999, NaN...)
_RAW = re.compile(r'"\\u0000raw:([^"]*)"')


def dumps(value: object) -> bytes:
    return _RAW.sub(lambda m: m.group(1), json.dumps(value)).encode()


WEIRD = [">", "*", "a.>", "*.*", "é", "ünïcødé", "𝔘𝔫𝔦", "日本語", "x" * 129, "%", "$JS", "_INBOX", "a b", "\t",
         "\u200b", "\u202e", "", "..", "\ud800", "\udfff", "\x00", "a\x00b", "null", "NaN", "-1", "🙂"]
NUMBERS = st.one_of(
    st.sampled_from([f"{RAW}NaN", f"{RAW}Infinity", f"{RAW}-Infinity", f"{RAW}1e999", f"{RAW}-1e999",
                     f"{RAW}1{'0' * 400}", f"{RAW}-{'9' * 5000}", f"{RAW}1e-999", -1, 0, -(2**63), 2**64, 10**30,
                     1e308, -1e308, 5e-324, -0.0]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
STRINGS = st.one_of(st.sampled_from(WEIRD), st.text(max_size=40))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=4), st.dictionaries(STRINGS, SCALARS, max_size=3))
# one subject token where an id goes: wildcard-ish, non-ASCII, long; never white space (nats-py refuses it),
# and a dot makes it two tokens (that no service serves)
SUBJECT_IDS = st.one_of(st.sampled_from([">", "*", "é", "日本語", "x" * 129, "%", "$", "a.b", "🙂", "\u202e"]),
                        st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1,
                                max_size=30))


# ================================================================================================
# messages
# ================================================================================================
@st.composite
def subject_of(draw, e: Endpoint, ctx: Ctx) -> tuple[str, bool, str | None]:
    """A concrete subject for the endpoint: (subject, whether a service serves it, the app id in it or, for a
    node's subject, one the message may name). The user in a subject is always the fuzzer's own: NATS drops
    what it sends to another's before any CooRM program sees it (tests/live/test_security.py)."""
    app = node = None
    served = True
    me = subjects.owner(ctx.apps[0])
    if NODE in e.subject:
        app = draw(st.sampled_from(ctx.apps))
    parts = []
    for token in e.subject.split("."):
        if token == USER:
            token = me
        elif token == APP.split(".")[1]:
            token = draw(st.one_of(st.sampled_from([a.split(".")[1] for a in ctx.apps]), st.just("a999"),
                                   SUBJECT_IDS))
            app = f"{me}.{token}"
            served = served and "." not in token
        elif token == NODE:
            token = node = draw(st.one_of(st.sampled_from(ctx.nodes), SUBJECT_IDS))
            served = served and node in ctx.nodes  # an agent subscribes to its own nodes only
        parts.append(token)
    return ".".join(parts), served, app


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    """Where a value may be replaced: every key and list item, one level into nested ones."""
    out: list[tuple] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            if len(prefix) < 2:
                out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            out.append((*prefix, i))
            if len(prefix) < 2:
                out += _paths(v, (*prefix, i))
    return out


def _set(value: dict, path: tuple, new: object) -> None:
    for p in path[:-1]:
        value = value[p]
    value[path[-1]] = new


@st.composite
def body(draw, e: Endpoint, ctx: Ctx, app: str | None) -> tuple[bytes, bool, str]:
    """A hostile body for the endpoint: (payload, whether it carries the session's real token, how made)."""
    example = copy.deepcopy(dict(e.example))
    if "app" in example and app is not None and draw(st.booleans()):
        # ids of the running system: a launch gets as far as the token check
        example["app"] = app
        if "request" in example:
            example["request"] = draw(st.sampled_from(["ra", "rb"]))
    room = ctx.max_payload - 256
    family = draw(st.sampled_from(["bytes", "truncated", "deep", "big", "replace", "replace", "replace", "remove",
                                   "extra", "token", "refused", "valid"]))
    if family == "valid":  # refused for its subject's id or a token that is not the session's, or read only
        return dumps(example), False, family
    if family == "bytes":
        return draw(st.binary(max_size=64)), False, family
    if family == "truncated":
        text = dumps(example)
        return text[:draw(st.integers(0, len(text) - 1))], False, family
    if family == "deep":
        # deeper than any message nests (bus.MAX_DEPTH: 32), and it fits in a message with the example
        depth = draw(st.integers(33, (room - len(dumps(example))) // 6))
        deep = b'{"a":' * depth + b"1" + b"}" * depth if draw(st.booleans()) else b"[" * depth + b"]" * depth
        if not example or draw(st.booleans()):
            return deep, False, f"{family} {depth}"
        key = draw(st.sampled_from(sorted(example)))
        return dumps({**example, key: "\x00deep"}).replace(b'"\\u0000deep"', deep), False, f"{family} {key}"
    if family == "big":  # a megabyte up to the server's max payload, the very limit included
        size = draw(st.one_of(st.integers(1_000_000, ctx.max_payload), st.integers(ctx.max_payload - 300,
                                                                                   ctx.max_payload)))
        shape = draw(st.sampled_from(["value", "key", "list", "binary"]))
        if shape == "binary":
            return (bytes(range(256)) * (size // 256 + 1))[:size], False, f"{family} {shape}"
        if shape == "list":
            return b"[" + b"1," * ((size - 3) // 2) + b"1]", False, f"{family} {shape}"
        filler = draw(st.sampled_from(["x", "é", "\\", '"', "\x01", ">"]))
        unit = len(json.dumps(filler)) - 2  # its bytes on the wire
        if shape == "key" or not example:
            n = (size - len(dumps({**example, "": 1}))) // unit
            return dumps({**example, filler * n: 1}), False, f"{family} {shape}"
        key = draw(st.sampled_from(sorted(example)))
        n = (size - len(dumps({**example, key: ""}))) // unit
        return dumps({**example, key: filler * n}), False, f"{family} {shape} {key}"
    if family == "refused" and app in ctx.tokens and e.subject in (subjects.app_request(APP), subjects.app_done(APP)):
        # well-formed, with the session's token: refused by the policy (an unknown cluster, another's request)
        if e.subject == subjects.app_request(APP):
            cluster = draw(st.sampled_from(["c9", "c0n0", "C0", "x" * 128, "a:b@c"]))
            spec = {"id": f"{app}.fz{draw(st.integers(0, 10**6))}", "cluster": cluster,
                    "nodes": draw(st.integers(1, 1_000_000)), "duration": draw(st.floats(0.001, 1e308))}
            return dumps({"token": ctx.tokens[app], "requests": [spec]}), True, f"{family} {cluster}"
        request = draw(st.sampled_from(["rb", "nope", "ra.x", "a999.r"] if app == ctx.apps[0] else ["ra", "nope"]))
        return dumps({"token": ctx.tokens[app], "request": request}), True, f"{family} {request}"
    if family == "token" and "token" in example:
        example["token"] = draw(st.one_of(VALUES, st.sampled_from(sorted(ctx.tokens.values())).map(
            lambda t: t + "é"), st.text(st.characters(min_codepoint=128), min_size=1, max_size=40)))
        return dumps(example), False, family
    if family == "remove" and example:
        del example[draw(st.sampled_from(sorted(example)))]
        return dumps(example), False, family
    paths = _paths(example)
    if family in ("extra", "token", "remove", "refused") or not paths:
        example[draw(STRINGS)] = draw(VALUES)
        return dumps(example), False, "extra"
    path = draw(st.sampled_from(paths))
    _set(example, path, draw(VALUES))
    return dumps(example), False, f"replace {'.'.join(map(str, path))}"


@st.composite
def message(draw, ctx: Ctx) -> Message:
    e = draw(st.sampled_from(REQUESTS))
    subject, served, app = draw(subject_of(e, ctx))
    payload, real_token, what = draw(body(e, ctx, app))
    return Message(e, subject, served, payload, real_token, what)


def _matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest."""
    tokens, wild = subject.split("."), pattern.split(".")
    for i, w in enumerate(wild):
        if w == ">":
            return len(tokens) > i
        if i >= len(tokens) or (w != "*" and w != tokens[i]):
            return False
    return len(tokens) == len(wild)


def permitted(m: Message, me: str) -> bool:
    """Whether the identity the fuzzer sends it as may publish there: NATS drops anything else before any
    CooRM program sees it (no reply: tests/live/test_security.py checks that part)."""
    role = Prober.role_of(m.subject)
    grants = permissions(role, me if role is Role.LAUNCHER else None).publish
    return any(_matches(m.subject, g) for g in grants)


def harmful(m: Message) -> bool:
    """A valid message that a service would act on: never sent (the state must not change)."""
    if m.endpoint.subject in READ_ONLY or (m.endpoint.subject in TOKEN_CHECKED and not m.real_token):
        return False
    if m.real_token:
        return False  # the "refused" family: well-formed, refused by the policy
    try:
        bus.decode(m.payload, m.endpoint.request)
    except Exception:  # noqa: BLE001 - a refusal (or, before this was fixed, a crash): not a valid message
        return False
    return True


# ================================================================================================
# the hostile client: a process of its own, as a real one would be
# ================================================================================================
# what changes by itself (the lease, the pacing of views, snapshots) or counts what was asked (refused
# requests are events too), and so is not compared
NOT_STATE = {keys.POLICY_LEASE, keys.SCHEDULE_EPOCH, keys.EVENT_LOG, keys.SNAPSHOT, keys.EVENT_SEQ}


async def state(nc: Prober, r) -> dict[str, object]:
    status = await bus.call(nc.user, subjects.QUERY_STATUS, StatusQuery(), StatusReply)
    out: dict[str, object] = {
        "apps": sorted((x.app, x.waiting, x.running, x.nodes) for x in status.apps),
        "requests": sorted((x.request, x.state, x.nodes, tuple(x.node_ids)) for x in status.requests),
        "clusters": [c.model_dump() for c in status.clusters]}
    for key in sorted(await r.keys(f"{keys.PREFIX}:*")):
        if key not in NOT_STATE:
            read = {"hash": r.hgetall, "string": r.get, "set": r.smembers, "list": lambda k: r.lrange(k, 0, -1),
                    "zset": lambda k: r.zrange(k, 0, -1, withscores=True)}[await r.type(key)]
            out[key] = await read(key)
    return out


async def ask(nc, m: Message, gate: asyncio.Semaphore) -> str | None:
    """What is wrong with the answer to ``m`` (None: nothing)."""
    async with gate:
        try:
            reply = await nc.request(m.subject, m.payload, timeout=REPLY_WITHIN)
        except NoRespondersError:
            return None if not m.served else "no responders"
        except NatsTimeout:
            return f"no reply within {REPLY_WITHIN} s"
    if not m.served:
        return f"an answer on a subject nobody serves: {reply.data[:200]!r}"
    raw = json.loads(reply.data)
    if isinstance(raw, dict) and raw.get("ok") is False:
        code = raw["error"]["code"]
        if code == ErrorCode.UNAVAILABLE:
            return f"internal error: {raw['error']['message'][:300]}"
        if code not in m.endpoint.errors:
            return f"{code}, a code the table does not list for the subject: {raw['error']['message'][:200]}"
        return None if raw["error"]["message"] else "no reason given"
    if m.endpoint.subject not in READ_ONLY:
        return f"accepted: {reply.data[:200]!r}"
    try:
        m.endpoint.reply.model_validate(raw)  # type: ignore[union-attr]
    except ValidationError as e:
        return f"not a valid {m.endpoint.reply.__name__}: {e}"  # type: ignore[union-attr]
    return None


async def ask_all(nc, batch: list[Message], gate: asyncio.Semaphore) -> list[str | None]:
    return await asyncio.gather(*(ask(nc, m, gate) for m in batch))


def fuzz(ctx: Ctx, nats_url: str, redis_url: str) -> None:
    """Hypothesis draws the batches, sends each (``IN_FLIGHT`` requests at a time) and checks the answers and
    the state after it; one line on stdout per batch: ``batch <subject> <count>...``."""
    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(Prober(Settings(nats_url=nats_url)).connect())
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    gate = asyncio.Semaphore(IN_FLIGHT)
    before = loop.run_until_complete(state(nc, r))

    # no shrinking: the services are live, and the failing batch is reported as it is
    @settings(max_examples=max(1, -(-MESSAGES // BATCH)), deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], print_blob=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                                     HealthCheck.large_base_example])
    @given(data=st.data())
    def one_batch(data) -> None:
        me = subjects.owner(ctx.apps[0])
        batch = [data.draw(message(ctx).filter(lambda m: permitted(m, me) and not harmful(m))) for _ in range(BATCH)]
        problems = loop.run_until_complete(ask_all(nc, batch, gate))
        wrong = [f"{m}: {p}" for m, p in zip(batch, problems, strict=True) if p]
        assert not wrong, f"{len(wrong)} of {len(batch)} answered wrongly:\n" + "\n".join(wrong[:10])
        after = loop.run_until_complete(state(nc, r))
        assert after == before, f"the state changed: {before} -> {after}"
        print("batch", json.dumps([m.endpoint.short for m in batch]), flush=True)

    try:
        one_batch()
    finally:
        loop.run_until_complete(r.aclose())
        loop.run_until_complete(nc.close())
        loop.close()


if __name__ == "__main__":  # python -m tests.live.test_fuzz CTX NATS_URL REDIS_URL
    raw = json.loads(sys.argv[1])
    try:
        fuzz(Ctx(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}), sys.argv[2], sys.argv[3])
    except AssertionError as e:  # what went wrong, without hypothesis's notes (every draw of the batch)
        sys.exit(str(e)[:8000])


# ================================================================================================
# the system, and the test
# ================================================================================================
@pytest.fixture
async def system(servers, redis_url):
    settings = Settings(nats_url=servers.nats_url, redis_url=servers.redis_url, reschedule_interval=0.0,
                        fair_start=0.0, kill_grace=0.3, launcher_heartbeat=0.5,
                        # liveness deadlines beyond the run: every service runs in this process, on one loop,
                        # and a heartbeat late under the flood is for the failure tests (test_system.py)
                        session_timeout=600.0, agent_timeout=600.0, leader_lease=60.0)
    async with LocalStack(settings, {"c0": 4}, with_batch=True) as stack:
        a = await Session.open(settings, kind="rigid", name="a")
        b = await Session.open(settings, kind="rigid", name="b")
        await a.request(RequestSpec(id="ra", cluster="c0", nodes=2, duration=600))
        await a.wait_start("ra", 10)
        await b.request(RequestSpec(id="rb", cluster="c0", nodes=4, duration=600))  # waits behind ra
        ctx = Ctx(apps=(a.app, b.app), nodes=tuple(f"c0n{i}" for i in range(4)),
                  tokens={a.app: a.token, b.app: b.token}, held=tuple(a._started["ra"].nodes),
                  max_payload=a.nc.max_payload)
        yield stack, a, ctx
        await a.close()
        await b.close()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the process's memory from /proc")
async def test_hostile_messages_on_every_request_subject_are_refused_and_change_nothing(system, servers, tmp_path):
    stack, a, ctx = system
    errors = tmp_path / "fuzzer.err"
    with open(errors, "wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.live.test_fuzz", json.dumps(ctx.__dict__), servers.nats_url,
            servers.redis_url, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=err)
    sent: dict[str, int] = {}
    memory = []  # this process's (every service's) memory after each batch
    try:
        async with asyncio.timeout(FUZZ_WITHIN):
            assert proc.stdout is not None
            async for line in proc.stdout:
                if not line.startswith(b"batch "):
                    continue
                for short in json.loads(line.removeprefix(b"batch ")):
                    sent[short] = sent.get(short, 0) + 1
                memory.append(rss())
                for name, part in stack.parts.items():
                    assert not part.task.done(), f"{name} stopped"
            await proc.wait()
    finally:
        if proc.returncode is None:  # ours: ended by its pid
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, errors.read_text()[-8000:]
    assert sum(sent.values()) >= MESSAGES
    assert set(sent) == {e.short for e in REQUESTS}, "a request subject of the table was never tried"
    warm = max(memory[:len(memory) // 2])  # caches and the allocator's arenas fill in the first batches
    assert memory[-1] - warm < RSS_GROWTH, f"memory grew from {warm >> 20} MiB to {memory[-1] >> 20} MiB"
    for agent in stack.agents.values():
        assert not agent._stopping
    # and the system still works: the good versions go through
    (rid,) = await a.request(RequestSpec(id="ok", cluster="c0", nodes=1, duration=5))
    assert rid == "ok"
    assert await a.launch("ra", ctx.held[0], ["true"])  # the owner may launch
