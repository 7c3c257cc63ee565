"""The node allocator service: the node side of allocation (DESIGN §2, §5).

Theory of operation
* It follows the policy engine's ordered, durable decision stream (a JetStream consumer named
  ``node-allocator``): for each request that starts, the node IDs the allocator core chose (``assigned``)
  are handed to the agents of those nodes (who may launch there, until when) and then told to the
  application (``startNotify``); nodes a request no longer owns (``freed``) have that request's processes
  killed by their agents; requests the RMS ended (walltime, node failure, violation, session reaped) are
  told to their application (``kill`` notification). A decision is acknowledged once it was acted upon, so
  a restarted allocator resumes where it stopped.
* Agents register here; their nodes are recorded in Redis (``keys.NODES``) and brought up in the policy
  engine (``subjects.NODES_EVENT``); an agent silent for ``agent_timeout`` has its nodes marked down there
  (their requests end with ``node_failure``), and is asked to register again when it is heard of again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json

import structlog
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from coorm.launchers.delivery import notice
from coorm.services.runtime import await_chain, clock, ensure_streams, redis_client, stay_in_the_cluster
from coorm.shared import bus, keys, metrics, subjects
from coorm.shared.credentials import Identity, signature_headers
from coorm.shared.endpoints import Role
from coorm.shared.events import (
    EndRequest,
    ErrorCode,
    NodesAssigned,
    NodesFreed,
    SessionEnded,
    StartRequest,
)
from coorm.shared.protocol import (
    Ack,
    AgentHeartbeat,
    AgentRegister,
    AgentRegistered,
    AllocationRecord,
    AllocationsQuery,
    AllocationsReply,
    AllocatorDecisions,
    KillMsg,
    KillNotify,
    KillReply,
    NodeAssign,
    NodesEvent,
    StartNotify,
)
from coorm.shared.settings import Settings

# KEYS[1]: the node records; ARGV[1]: fields to merge (JSON); ARGV[2..]: node IDs (those without a record
# are left alone)
_MERGE = """
local fields = cjson.decode(ARGV[1])
for i = 2, #ARGV do
  local raw = redis.call('hget', KEYS[1], ARGV[i])
  if raw then
    local rec = cjson.decode(raw)
    for k, v in pairs(fields) do rec[k] = v end
    redis.call('hset', KEYS[1], ARGV[i], cjson.encode(rec))
  end
end
return 0
"""

log = structlog.get_logger("coorm.node_allocator")

REDIS_RIDE_OVER = 30.0  # seconds a Redis write waits for a restarted server (decisions wait their turn meanwhile)
_RECORDS_KEPT = 3600  # seconds an ended session's allocation records stay (its launcher may still ask)
# How long one decision message may take: longer than any Redis call can (a write rides over a restart for
# REDIS_RIDE_OVER, a command's socket waits SOCKET_TIMEOUT, a replicated write WAIT_MS). One that takes
# longer is stuck, and would hold every later decision behind it for ever: it is abandoned and tried again.
ACT_BOUND = 90.0


async def _close_quietly(client) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.aclose(), 10.0)


class NodeAllocatorService:
    def __init__(self, settings: Settings, name: str = "node-allocator") -> None:
        self.settings = settings
        self.name = name
        self.identity: Identity | None = None  # the services' (it signs assignments and kills)
        self.ends: dict[str, float | None] = {}  # started request -> its end (wall clock)
        self.carry: dict[str, str] = {}  # started request -> its NEXT predecessor
        self.held: dict[str, list[str]] = {}  # started request -> its node IDs (for its end notification)
        self.agents: dict[str, dict] = {}  # agent -> {cluster, nodes, last_seen, up}
        self.ready = asyncio.Event()
        self._kills: set[asyncio.Task] = set()
        self._digests: dict[str, str] = {}
        # a registration's reply (the nodes' current assignments) is read between two decisions, never
        # half-way through one: an agent must not learn of an assignment older than one already sent
        self._acting = asyncio.Lock()
        self.act_bound = ACT_BOUND
        self._acted = 0  # the last decision message acted on (or set aside), by stream sequence

    async def run(self, stop: asyncio.Event) -> None:
        self.redis = redis_client(self.settings.redis_url, ride_over=REDIS_RIDE_OVER)
        self.identity = self.settings.identity(Role.SERVICE)
        if self.identity is None:
            log.error("no service identity (COORM_NATS_CREDENTIALS or COORM_CREDENTIALS_DIR): agents will refuse "
                      "every assignment and kill, which only a service's signature makes them obey")
        self.nc = await bus.connect(self.settings.nats_url, self.name, self.identity)
        self.js = self.nc.jetstream()
        await ensure_streams(self.js, self.settings.stream_replicas)
        await self._load_agents()
        subs = [
            await bus.serve(self.nc, subjects.AGENT_REGISTER, AgentRegister, self._on_register),
            await bus.serve(self.nc, subjects.AGENT_HEARTBEAT, AgentHeartbeat, self._on_heartbeat),
            await bus.serve(self.nc, subjects.APP_ALLOCATIONS_ANY, AllocationsQuery, self._on_allocations,
                            concurrent=True),
        ]
        # a durable push consumer: decisions arrive as they are published, one at a time, in order
        psub = await self.js.subscribe(
            subjects.DECISIONS, durable=self.name, manual_ack=True, cb=self._on_decision_in_turn,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                                  max_ack_pending=1000),
        )
        await self.nc.publish(subjects.AGENT_HELLO, b"{}")  # agents that registered before we ran
        self.ready.set()
        tasks = [asyncio.create_task(self._watch_agents()),
                 asyncio.create_task(stay_in_the_cluster(self.nc, self.settings, self.name))]
        try:
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=5)
            for s in [*subs, psub]:
                with contextlib.suppress(Exception):
                    await s.unsubscribe()
            await bus.shutdown(self.nc)
            await self.redis.aclose()

    # ============================================================================================
    # decisions
    # ============================================================================================
    async def _on_decision(self, m) -> None:
        """Act on one message of the decision stream, in the stream's order, then ack it. One that is not a
        decision message is set aside at once (it never will be one). One whose handling fails, never
        returns within ``act_bound``, or is cancelled from inside a client library is tried again in its
        turn (the decisions behind it wait: a node freed must not be handed out again before its kill), and
        set aside after ``bus.MAX_DELIVERIES`` tries: a poison message must not hold the stream for ever.
        A copy the server sends again meanwhile (its ack wait ran out) is acknowledged and passed over."""
        seq = m.metadata.sequence.stream
        if seq <= self._acted:
            with contextlib.suppress(Exception):
                await m.ack()
            return
        try:
            decisions = bus.decode(m.data, AllocatorDecisions).decisions
        except bus.WireError as e:
            await bus.set_aside(self.nc, m, f"not a decision message: {e.message}")
            self._acted = seq
            return
        for attempt in range(1, bus.MAX_DELIVERIES + 1):
            failure = await self._try_acting(decisions)
            if failure is None:
                break
            log.warning("could not act on a decision message: trying again", seq=seq, attempt=attempt,
                        error=failure)
            if attempt == bus.MAX_DELIVERIES:
                await bus.set_aside(self.nc, m, f"failed {attempt} tries, the last with {failure}")
                self._acted = seq
                return
            await asyncio.sleep(bus.RETRY_DELAY * 2 ** (attempt - 1))  # back-off before the next try
        self._acted = seq
        with contextlib.suppress(Exception):  # not acked: it comes again, and is passed over
            await m.ack()

    async def _try_acting(self, decisions: list) -> str | None:
        """Act on a message's decisions in a task of its own: what went wrong, or None."""
        task = asyncio.create_task(self._act_on(decisions))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.act_bound)
        finally:
            if not task.done():
                task.cancel()
        if not done:
            where = " <- ".join(reversed(await_chain(task)))
            log.error("a decision's handling is stuck: abandoned, tried again on new Redis connections",
                      bound=self.act_bound, stuck_at=where)
            self._renew_redis()
            return f"stuck for {self.act_bound} s at {where}"
        if task.cancelled():
            return "cancelled from within"
        e = task.exception()
        return None if e is None else f"{type(e).__name__}: {e}"

    def _renew_redis(self) -> None:
        """A fresh client: a wait that never ended may be one for a pool connection never given back."""
        old, self.redis = self.redis, redis_client(self.settings.redis_url, ride_over=REDIS_RIDE_OVER)
        task = asyncio.create_task(_close_quietly(old))
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)

    async def _act_on(self, decisions: list) -> None:
        # the Redis bookkeeping of a message's decisions (records for coorm nodes and kill notifications,
        # off the start's path) goes in one round trip, after every agent and application was told
        pipe = self.redis.pipeline(transaction=False)
        for d in decisions:
            try:
                await self._act(d, pipe)
            except Exception:  # noqa: BLE001 - one bad decision must not stop the node side
                log.exception("could not act on a decision", decision=d.kind, request=getattr(d, "request", None))
        if len(pipe):
            try:
                await pipe.execute()
            except Exception:  # noqa: BLE001
                log.exception("could not record the decisions' allocations", decisions=len(decisions))

    async def _on_decision_in_turn(self, m) -> None:
        async with self._acting:
            await self._on_decision(m)

    async def _act(self, d, pipe) -> None:
        told = notice(d)  # what the application is told of it (the simulator's and the harness's rule too)
        if isinstance(d, StartRequest):
            self.ends[d.request] = d.end
            if d.carry_from:
                self.carry[d.request] = d.carry_from
            if told is not None:  # a pre-allocation: no node IDs, but the application learns it started
                await self._notify("start", subjects.notify_start(d.app),
                                   StartNotify(app=d.app, request=d.request, cluster=d.cluster, nodes=[], end=d.end))
                self._record(pipe, d.app, AllocationRecord(request=d.request, cluster=d.cluster, end=d.end))
        elif isinstance(d, SessionEnded):
            self._digests.pop(d.app, None)
            pipe.expire(keys.requests_of(d.app), _RECORDS_KEPT)
        elif isinstance(d, NodesAssigned):
            await self._assigned(d, pipe)
        elif isinstance(d, NodesFreed):
            await self._freed(d, pipe)
        elif isinstance(d, EndRequest):
            self.ends.pop(d.request, None)
            self.carry.pop(d.request, None)
            if told is not None:  # every end of a started request, its own done and NEXT hand-overs too
                nodes = self.held.get(d.request)
                if nodes is None:  # assigned before this instance started (so not queued on pipe)
                    nodes = json.loads(await self.redis.hget(keys.allocation(d.request), "nodes") or "[]")
                await self._notify("kill", subjects.notify_kill(d.app),
                                   KillNotify(app=d.app, request=d.request, reason=d.reason, nodes=nodes))
                self._record(pipe, d.app, AllocationRecord(request=d.request, cluster=d.cluster, nodes=nodes,
                                                           ended=d.reason))
            self.held.pop(d.request, None)
            pipe.delete(keys.allocation(d.request))

    @staticmethod
    def _record(pipe, app: str, rec: AllocationRecord) -> None:
        """What the application was told of the request (started, ended): for a launcher that missed it."""
        pipe.hset(keys.requests_of(app), rec.request, rec.model_dump_json())

    async def _on_allocations(self, msg: AllocationsQuery, raw: Msg) -> AllocationsReply:
        """A launcher back from a cut connection asks what it may have missed."""
        app = subjects.app_of(raw.subject)
        session = await self.redis.hget(keys.SESSIONS, app)
        if session is None:
            raise bus.WireError(ErrorCode.UNKNOWN_APP, f"no open session {app}")
        token = json.loads(session).get("token", "")
        if not hmac.compare_digest(token.encode(), msg.token.encode()):
            raise bus.WireError(ErrorCode.BAD_TOKEN, f"wrong session token for {app}")
        raw_records = await self.redis.hgetall(keys.requests_of(app))
        return AllocationsReply(allocations=[AllocationRecord.model_validate_json(v)
                                             for _, v in sorted(raw_records.items())])

    def _signature(self, subject: str, data: bytes) -> dict[str, str] | None:
        return None if self.identity is None else signature_headers(self.identity, subject, data)

    async def _notify(self, kind: str, subject: str, message) -> None:
        data = bus.encode(message)
        await self.nc.publish(subject, data)
        metrics.notifications.labels(kind).inc()
        metrics.notification_bytes.labels(kind).inc(len(data))

    async def _digest(self, app: str) -> str:
        """SHA-256 of the application's session token (what an agent checks a launch against)."""
        digest = self._digests.get(app)
        if digest is None:
            session = json.loads(await self.redis.hget(keys.SESSIONS, app) or "{}")
            digest = hashlib.sha256(session.get("token", "").encode()).hexdigest()
            if session:
                self._digests[app] = digest
        return digest

    async def _assigned(self, d: NodesAssigned, pipe) -> None:
        digest = await self._digest(d.app)
        end = self.ends.get(d.request)
        previous = self.carry.get(d.request) if d.kept else None
        assign = NodeAssign(app=d.app, request=d.request, nodes=list(d.nodes), token_sha256=digest, end=end,
                            previous=previous)
        data = bus.encode(assign)
        for node in d.nodes:
            subject = subjects.node_assign(node)
            await self.nc.publish(subject, data, headers=self._signature(subject, data))
        # the agents hear of the assignment before the application can ask them to launch: the server
        # forwards one connection's messages in order, so the assignments are in the agents' queues before
        # the startNotify reaches the application (a flush here would cost a round trip per start)
        await self._notify("start", subjects.notify_start(d.app),
                           StartNotify(app=d.app, request=d.request, cluster=d.cluster, nodes=list(d.nodes),
                                       kept=list(d.kept), end=end))
        self.held[d.request] = list(d.nodes)
        self._record(pipe, d.app, AllocationRecord(request=d.request, cluster=d.cluster, nodes=list(d.nodes),
                                                   kept=list(d.kept), end=end))
        pipe.hset(keys.allocation(d.request), mapping={
            "app": d.app, "cluster": d.cluster, "nodes": json.dumps(list(d.nodes)), "end": json.dumps(end)})
        await self._set_owner(d.nodes, d.app, d.request, pipe)

    async def _freed(self, d: NodesFreed, pipe) -> None:
        await self._set_owner(d.nodes, None, None, pipe)
        for node in d.nodes:
            task = asyncio.create_task(self._kill(node, d.request, d.reason))
            self._kills.add(task)
            task.add_done_callback(self._kills.discard)

    async def _kill(self, node: str, request: str, reason: str) -> None:
        grace = self.settings.kill_grace
        try:
            await bus.call(self.nc, subjects.node_kill(node), KillMsg(request=request, grace=grace, reason=reason),
                           KillReply, timeout=grace + 5.0, signer=self.identity)
        except (NoRespondersError, NatsTimeout, bus.WireError) as e:
            # its agent is gone: the node goes down when the agent's silence is noticed
            log.warning("could not reach the agent to kill", node=node, request=request, error=str(e))

    async def _set_owner(self, nodes, app: str | None, request: str | None, pipe=None) -> None:
        await self._update_nodes(nodes, pipe, app=app, request=request)

    async def _update_nodes(self, nodes, pipe=None, **fields) -> None:
        """Merge ``fields`` into the records of ``nodes`` (those that have one), in Redis: one round trip
        (or none of its own, queued on ``pipe``)."""
        nodes = list(nodes)
        if not nodes:
            return
        args = (_MERGE, 1, keys.NODES, json.dumps(fields), *nodes)
        if pipe is not None:
            pipe.eval(*args)
        else:
            await self.redis.eval(*args)

    # ============================================================================================
    # agents
    # ============================================================================================
    async def _load_agents(self) -> None:
        now = clock()
        for node, raw in (await self.redis.hgetall(keys.NODES)).items():
            rec = json.loads(raw)
            a = self.agents.setdefault(rec["agent"], {"cluster": rec["cluster"], "nodes": [], "last_seen": now,
                                                      "up": rec.get("state") == "up"})
            a["nodes"].append(node)

    async def _on_register(self, msg: AgentRegister, raw: Msg) -> AgentRegistered:
        async with self._acting:
            return await self._register(msg)

    async def _register(self, msg: AgentRegister) -> AgentRegistered:
        ids = [n.id for n in msg.nodes]
        known = {n: json.loads(raw) for n, raw in zip(ids, await self.redis.hmget(keys.NODES, ids), strict=True) if raw}
        for node, rec in known.items():
            if rec["cluster"] != msg.cluster:
                raise bus.WireError(ErrorCode.BAD_REQUEST, f"node {node} is registered in cluster {rec['cluster']}")
        try:
            await bus.call(self.nc, subjects.NODES_EVENT,
                           NodesEvent(kind="register", cluster=msg.cluster, nodes=[n.id for n in msg.nodes]), Ack)
        except (NoRespondersError, NatsTimeout) as e:
            raise bus.WireError(ErrorCode.UNAVAILABLE, "no policy engine leader yet: register again") from e
        now = clock()
        await self.redis.hset(keys.NODES, mapping={info.id: json.dumps({
            "cluster": msg.cluster, "agent": msg.agent, "cores": info.cores, "memory_mb": info.memory_mb,
            "state": "up", "since": now, "app": known.get(info.id, {}).get("app"),
            "request": known.get(info.id, {}).get("request")}) for info in msg.nodes})
        self.agents[msg.agent] = {"cluster": msg.cluster, "nodes": ids, "last_seen": now, "up": True}
        assignments = await self._current_assignments(known)
        log.info("agent registered", agent=msg.agent, cluster=msg.cluster, nodes=len(msg.nodes),
                 assigned=sum(len(set(a.nodes) & set(ids)) for a in assignments))
        return AgentRegistered(assignments=assignments)

    async def _current_assignments(self, records: dict[str, dict]) -> list[NodeAssign]:
        """The assignment in force of every node (of ``records``) that a started request holds: what its
        agent must know to let the owner launch (and to kill everything else)."""
        requests: dict[str, str] = {}
        for rec in records.values():
            if rec.get("request") and rec.get("app"):
                requests[rec["request"]] = rec["app"]
        out = []
        for request, app in sorted(requests.items()):
            alloc = await self.redis.hgetall(keys.allocation(request))
            if not alloc:
                continue
            out.append(NodeAssign(app=app, request=request, nodes=json.loads(alloc["nodes"]),
                                  token_sha256=await self._digest(app), end=json.loads(alloc.get("end", "null"))))
        return out

    async def _on_heartbeat(self, msg: AgentHeartbeat, raw: Msg) -> Ack | None:
        # answered when a reply is asked for: an agent whose beats go unanswered while its connection lives
        # is on a server cut from the cluster, and looks for one that reaches the allocator (an older agent
        # publishes its beats, and is heard the same)
        ack = Ack() if raw.reply else None
        a = self.agents.get(msg.agent)
        if a is None or not a["up"]:
            await self.nc.publish(subjects.AGENT_HELLO, b"{}")  # heard of again: register
            return ack
        a["last_seen"] = clock()
        a["processes"] = msg.processes
        return ack

    async def _watch_agents(self) -> None:
        timeout = self.settings.agent_timeout
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))  # a periodic scan of liveness, not a synchronisation
            now = clock()
            self._observe(now)
            for agent, a in list(self.agents.items()):
                if a["up"] and now - a["last_seen"] > timeout:
                    log.warning("agent silent: its nodes go down", agent=agent, nodes=len(a["nodes"]))
                    try:
                        await bus.call(self.nc, subjects.NODES_EVENT,
                                       NodesEvent(kind="down", cluster=a["cluster"], nodes=a["nodes"]), Ack)
                    except (NoRespondersError, NatsTimeout, bus.WireError):
                        continue  # no leader now (or it could not log it): try again at the next scan
                    a["up"] = False
                    try:
                        await self._update_nodes(a["nodes"], state="down", since=now, app=None, request=None)
                    except Exception:  # noqa: BLE001 - Redis away past the ride-over: the scan must go on
                        log.exception("node records not marked down", agent=agent)

    def _observe(self, now: float) -> None:
        # both states of every cluster, 0 included: a dashboard's "nodes down" reads 0, not "no data"
        nodes = {(a["cluster"], state): 0 for a in self.agents.values() for state in ("up", "down")}
        metrics.agent_heartbeat_age.clear()
        for agent, a in self.agents.items():
            nodes[a["cluster"], "up" if a["up"] else "down"] += len(a["nodes"])
            metrics.agent_heartbeat_age.labels(agent, a["cluster"]).set(max(0.0, now - a["last_seen"]))
        metrics.agent_nodes.clear()
        for (cluster, state), n in nodes.items():
            metrics.agent_nodes.labels(cluster, state).set(n)


async def main(settings: Settings | None = None, stop: asyncio.Event | None = None) -> None:
    from coorm.services.runtime import stop_on_signals

    settings = settings or Settings()
    metrics.serve(settings.metrics_port, settings.metrics_addr)
    metrics.zero(metrics.dead_letters, (subjects.DECISIONS_STREAM,))
    await NodeAllocatorService(settings).run(stop or stop_on_signals())
